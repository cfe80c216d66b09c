"""The event log over HTTP: pages, filters, and the Server-Sent Events stream (order,
resumption from Last-Event-ID, heartbeats, bounded lifetime, no connection held between
polls)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import pytest
from django.db import connection
from django.test import AsyncClient

from parallel_mcp import Orchestrator
from parallel_mcp.api.views.events import EventStream
from parallel_mcp.models import Event
from tests.api_helpers import FAST_SSE, bearer, error_of, token_for

pytestmark = pytest.mark.django_db
pytest_plugins = ["tests.api_fixtures"]


@pytest.fixture
def orch() -> Orchestrator:
    return Orchestrator()


@pytest.fixture
def fast_sse(settings):
    settings.PARALLEL_MCP_API = dict(FAST_SSE)


def frames(text: str) -> list[dict]:
    """SSE frames as dicts: {"id", "data", "event", "comments", "retry"}."""
    parsed = []
    for block in text.split("\n\n"):
        if not block:
            continue
        frame: dict = {"comments": []}
        for line in block.split("\n"):
            if line.startswith(":"):
                frame["comments"].append(line[1:].strip())
            else:
                field, _, value = line.partition(": ")
                frame[field] = value
        parsed.append(frame)
    return parsed


def events_of(text: str) -> list[dict]:
    return [frame for frame in frames(text) if "data" in frame and "event" not in frame]


def stream(api, **params):
    headers = params.pop("headers", {})
    response = api.client.get("/api/pmcp/events/stream", params, headers=headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/event-stream")
    assert response["Cache-Control"] == "no-cache"
    return response


def read_all(response) -> str:
    return b"".join(response.streaming_content).decode()


# -- pages ------------------------------------------------------------------------------------


def test_events_page_fields_filters_and_cursor(viewer, orch):
    run = orch.create_run()
    other = orch.create_run()
    orch.enqueue_task(run_id=run.pk, kind="k")
    body = viewer.get("events").json()
    assert set(body) == {"results", "next_cursor", "has_more"}
    assert set(body["results"][0]) == {
        "id",
        "run_id",
        "task_id",
        "attempt_id",
        "event_type",
        "payload",
        "created_at",
        "actor",
    }
    ids = [event["id"] for event in body["results"]]
    assert ids == sorted(ids) and body["next_cursor"] == ids[-1]
    assert viewer.get("events", {"run_id": str(other.pk)}).json()["results"][0]["event_type"] == (
        "run.created"
    )
    types = viewer.get("events", {"type": ["task.enqueued", "run.created"]}).json()["results"]
    assert [event["event_type"] for event in types] == [
        "run.created",
        "run.created",
        "task.enqueued",
    ]
    page = viewer.get("events", {"limit": 2}).json()
    assert len(page["results"]) == 2 and page["has_more"] is True
    rest = viewer.get("events", {"after_id": page["next_cursor"]}).json()
    assert [event["id"] for event in rest["results"]] == ids[2:]
    assert viewer.get("events", {"run_id": str(uuid.uuid4())}).status_code == 404


def test_empty_log_has_a_null_cursor(viewer):
    assert viewer.get("events").json() == {"results": [], "next_cursor": None, "has_more": False}
    assert viewer.get("events", {"after_id": 5}).json()["next_cursor"] == 5


# -- the stream -------------------------------------------------------------------------------


def test_stream_delivers_events_in_order_with_their_ids(viewer, orch, fast_sse):
    run = orch.create_run()
    for _ in range(3):
        orch.enqueue_task(run_id=run.pk, kind="k")
    text = read_all(stream(viewer, after_id=0, timeout=0))
    all_frames = frames(text)
    assert all_frames[0]["retry"] == "500"
    delivered = events_of(text)
    expected = list(Event.objects.order_by("id"))
    assert [int(frame["id"]) for frame in delivered] == [event.pk for event in expected]
    for frame, event in zip(delivered, expected, strict=True):
        data = json.loads(frame["data"])
        assert data["id"] == event.pk and data["event_type"] == event.event_type
        assert data["run_id"] == str(event.run_id)
    end = all_frames[-1]
    assert end["event"] == "end" and json.loads(end["data"]) == {"next_cursor": expected[-1].pk}


def test_stream_resumes_after_last_event_id(viewer, orch, fast_sse):
    run = orch.create_run()
    orch.enqueue_task(run_id=run.pk, kind="k")
    ids = list(Event.objects.order_by("id").values_list("id", flat=True))
    text = read_all(stream(viewer, timeout=0, headers={"Last-Event-ID": str(ids[0])}))
    assert [int(frame["id"]) for frame in events_of(text)] == ids[1:]
    # The header wins over ?after_id= (EventSource keeps the URL and sends the header).
    text = read_all(stream(viewer, after_id=0, timeout=0, headers={"Last-Event-ID": str(ids[1])}))
    assert [int(frame["id"]) for frame in events_of(text)] == ids[2:]
    bad = viewer.client.get(
        "/api/pmcp/events/stream", {"timeout": 0}, headers={"Last-Event-ID": "abc"}
    )
    assert bad.status_code == 400 and error_of(bad)["code"] == "validation_error"


def test_stream_without_a_cursor_starts_at_the_end(viewer, orch, fast_sse):
    run = orch.create_run()
    orch.enqueue_task(run_id=run.pk, kind="k")
    tail = Event.objects.order_by("-id").first().pk
    response = stream(viewer, timeout=5)
    chunks = iter(response.streaming_content)
    assert b"retry:" in next(chunks)
    orch.cancel_run(run_id=run.pk)  # written while the stream is open
    expected = list(Event.objects.filter(id__gt=tail).order_by("id").values_list("id", flat=True))
    delivered: list[int] = []
    deadline = time.monotonic() + 5
    while len(delivered) < len(expected) and time.monotonic() < deadline:
        delivered.extend(int(frame["id"]) for frame in events_of(next(chunks).decode()))
    assert delivered == expected
    response.close()


def test_stream_delivers_events_written_while_it_is_open(viewer, orch, fast_sse):
    run = orch.create_run()
    response = stream(viewer, after_id=0, timeout=5, run_id=str(run.pk))
    chunks = iter(response.streaming_content)
    next(chunks)  # opening
    first = events_of(next(chunks).decode())
    assert [json.loads(f["data"])["event_type"] for f in first] == ["run.created"]
    orch.enqueue_task(run_id=run.pk, kind="k")
    orch.enqueue_task(run_id=orch.create_run().pk, kind="k")  # another run: filtered out
    later: list[dict] = []
    deadline = time.monotonic() + 5
    while len(later) < 2 and time.monotonic() < deadline:
        later.extend(events_of(next(chunks).decode()))
    assert [json.loads(f["data"])["event_type"] for f in later] == [
        "task.enqueued",
        "run.status.changed",
    ]
    assert int(later[0]["id"]) > int(first[-1]["id"])
    response.close()


def test_stream_filters_by_type(viewer, orch, fast_sse):
    run = orch.create_run()
    orch.enqueue_task(run_id=run.pk, kind="k")
    text = read_all(stream(viewer, after_id=0, timeout=0, type="task.enqueued"))
    assert [json.loads(f["data"])["event_type"] for f in events_of(text)] == ["task.enqueued"]


def test_stream_sends_heartbeats_and_ends_on_time(viewer, fast_sse):
    started = time.monotonic()
    text = read_all(stream(viewer, timeout=0.3))
    elapsed = time.monotonic() - started
    assert 0.25 <= elapsed < 3
    beats = [frame for frame in frames(text) if "heartbeat" in frame["comments"]]
    assert len(beats) >= 2
    assert frames(text)[-1]["event"] == "end"


def test_stream_lifetime_is_capped(viewer, settings):
    settings.PARALLEL_MCP_API = {**FAST_SSE, "SSE_MAX_SECONDS": 0.2, "SSE_DEFAULT_SECONDS": 0.1}
    started = time.monotonic()
    read_all(stream(viewer, timeout=3600))
    assert time.monotonic() - started < 2
    started = time.monotonic()
    read_all(stream(viewer))  # the default lifetime
    assert time.monotonic() - started < 2


def test_stream_refuses_bad_parameters_in_the_envelope(viewer, anon):
    for params in ({"timeout": -1}, {"after_id": "x"}, {"run_id": "nope"}):
        response = viewer.client.get("/api/pmcp/events/stream", params)
        assert response.status_code == 400
        assert response["Content-Type"].startswith("application/json")
        error_of(response)
    missing = viewer.client.get("/api/pmcp/events/stream", {"run_id": str(uuid.uuid4())})
    assert missing.status_code == 404
    response = anon.client.get("/api/pmcp/events/stream", HTTP_ACCEPT="text/event-stream")
    assert response.status_code == 401 and error_of(response)["code"] == "not_authenticated"


@pytest.mark.django_db(transaction=True)
def test_stream_holds_no_connection_between_polls(viewer_user, settings):
    settings.PARALLEL_MCP_API = dict(FAST_SSE)
    api = bearer(token_for(viewer_user))
    orch = Orchestrator()
    orch.create_run()
    response = stream(api, after_id=0, timeout=5)
    chunks = iter(response.streaming_content)
    next(chunks)
    assert events_of(next(chunks).decode())  # one poll ran
    assert connection.connection is None  # ... and closed its connection
    assert not connection.in_atomic_block
    next(chunks)  # a heartbeat: polls went on meanwhile, each closing again
    assert connection.connection is None
    response.close()


@pytest.mark.django_db(transaction=True)
def test_async_stream_for_asgi_servers(settings):
    settings.PARALLEL_MCP_API = dict(FAST_SSE)
    orch = Orchestrator()
    run = orch.create_run()
    orch.enqueue_task(run_id=run.pk, kind="k")
    sse = EventStream(orch, after=0, run_id=run.pk, event_types=None, timeout=0.1)

    async def collect() -> str:
        return "".join([chunk async for chunk in sse.aiter()])

    text = asyncio.run(collect())
    assert [json.loads(f["data"])["event_type"] for f in events_of(text)] == [
        "run.created",
        "task.enqueued",
        "run.status.changed",
    ]
    assert frames(text)[-1]["event"] == "end"


@pytest.mark.django_db(transaction=True)
def test_stream_over_asgi(viewer_user, settings):
    """Under ASGI the view streams an async iterator (Django would otherwise read a sync
    iterator to its end before sending anything)."""
    settings.PARALLEL_MCP_API = dict(FAST_SSE)
    secret = token_for(viewer_user)
    Orchestrator().create_run()

    async def read() -> str:
        response = await AsyncClient().get(
            "/api/pmcp/events/stream",
            {"after_id": 0, "timeout": 0.1},
            headers={"Authorization": f"Bearer {secret}"},
        )
        assert response.status_code == 200, response.content
        assert response.is_async
        return b"".join([chunk async for chunk in response.streaming_content]).decode()

    text = asyncio.run(read())
    assert [json.loads(f["data"])["event_type"] for f in events_of(text)] == ["run.created"]

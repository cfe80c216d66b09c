"""Open event streams are capped per token (or session user) and per server process; a slot is
given back however a stream ends: its timeout, the response closed, the client gone (WSGI and
ASGI servers), or the response dropped unsent."""

from __future__ import annotations

import gc
import time
from contextlib import ExitStack

import httpx2
import pytest
from django.test import Client

from parallel_mcp.api.streams import StreamsExhausted, StreamSlots, TooManyStreams, open_streams
from tests.api_helpers import (
    FAST_SSE,
    VIEW_PERMS,
    Api,
    AsgiServer,
    bearer,
    error_of,
    make_user,
    token_for,
)

# response.close() ends a request, which closes the database connection: no test transaction.
pytestmark = pytest.mark.django_db(transaction=True)
pytest_plugins = ["tests.api_fixtures"]

PER_TOKEN, TOTAL = 2, 3
LIMITS = {**FAST_SSE, "SSE_MAX_STREAMS_PER_TOKEN": PER_TOKEN, "SSE_MAX_STREAMS": TOTAL}
STREAM = "/api/pmcp/events/stream"


@pytest.fixture
def limits(settings):
    settings.PARALLEL_MCP_API = dict(LIMITS)
    assert open_streams.open_count() == 0
    yield
    gc.collect()  # responses a failed test left behind give their slots back
    assert open_streams.open_count() == 0


def open_stream(api: Api, **params):
    return api.client.get(STREAM, {"timeout": 60, **params})


# -- the counter ------------------------------------------------------------------------------


def test_slots_per_owner_and_in_total(limits):
    slots = StreamSlots()
    a1, a2 = slots.acquire("a"), slots.acquire("a")
    with pytest.raises(TooManyStreams) as per_token:
        slots.acquire("a")
    assert per_token.value.status_code == 429
    assert per_token.value.details == {"limit": PER_TOKEN, "scope": "token", "wait": 1}
    b1 = slots.acquire("b")
    with pytest.raises(StreamsExhausted) as total:
        slots.acquire("c")
    assert total.value.status_code == 503 and total.value.details["scope"] == "server"
    a1.release()
    a1.release()  # counted once
    assert slots.open_count("a") == 1 and slots.open_count() == 2
    a3 = slots.acquire("a")
    for slot in (a2, a3, b1):
        slot.release()
    assert slots.open_count() == 0


def test_no_limits_when_set_to_none(settings):
    settings.PARALLEL_MCP_API = {"SSE_MAX_STREAMS_PER_TOKEN": None, "SSE_MAX_STREAMS": None}
    slots = StreamSlots()
    held = [slots.acquire("a") for _ in range(500)]
    assert slots.open_count("a") == 500
    for slot in held:
        slot.release()


# -- the view ---------------------------------------------------------------------------------


def test_a_token_may_hold_its_limit_of_streams_and_a_closed_one_frees_its_slot(limits, viewer_user):
    api = bearer(token_for(viewer_user))
    first, second = open_stream(api), open_stream(api)
    assert (first.status_code, second.status_code) == (200, 200)
    refused = open_stream(api)
    assert refused.status_code == 429
    assert refused["Content-Type"].startswith("application/json")
    assert refused["Retry-After"] == "1"
    error = error_of(refused)
    assert error["code"] == "too_many_streams"
    assert "already has 2 event streams open" in error["message"]
    assert error["details"] == {"limit": PER_TOKEN, "scope": "token", "wait": 1}

    first.close()
    third = open_stream(api)
    assert third.status_code == 200

    # Another token of the same user has its own allowance, up to the server's total.
    other = bearer(token_for(viewer_user))
    fourth = open_stream(other)
    assert fourth.status_code == 200
    exhausted = open_stream(other)
    assert exhausted.status_code == 503 and exhausted["Retry-After"] == "1"
    assert error_of(exhausted)["code"] == "too_many_streams"
    assert error_of(exhausted)["details"]["scope"] == "server"
    for response in (second, third, fourth):
        response.close()
    assert open_streams.open_count() == 0


def test_session_logins_count_per_user(limits, viewer_user):
    client = Client()
    client.force_login(viewer_user)
    api = Api(client)
    held = [open_stream(api) for _ in range(PER_TOKEN)]
    assert [response.status_code for response in held] == [200] * PER_TOKEN
    assert open_stream(api).status_code == 429
    for response in held:
        response.close()


def test_a_stream_that_ends_gives_its_slot_back(limits, viewer_user):
    api = bearer(token_for(viewer_user))
    for _ in range(3 * PER_TOKEN):
        response = open_stream(api, timeout=0.05)
        assert response.status_code == 200
        b"".join(response.streaming_content)  # to the end event
    assert open_streams.open_count() == 0


def test_refused_requests_hold_no_slot(limits, viewer_user, anon):
    api = bearer(token_for(viewer_user))
    for _ in range(3 * PER_TOKEN):
        assert open_stream(api, timeout=-1).status_code == 400
        assert open_stream(api, run_id="00000000-0000-4000-8000-000000000000").status_code == 404
        assert open_stream(anon).status_code == 401
    assert open_streams.open_count() == 0


def test_a_response_dropped_unsent_gives_its_slot_back(limits, viewer_user):
    api = bearer(token_for(viewer_user))
    response = open_stream(api)
    assert open_streams.open_count() == 1
    del response
    gc.collect()
    assert open_streams.open_count() == 0


# -- through real servers: the client goes away -----------------------------------------------


def _open_live(stack: ExitStack, base: str, secret: str) -> httpx2.Response:
    client = stack.enter_context(
        httpx2.Client(headers={"Authorization": f"Bearer {secret}"}, timeout=30)
    )
    request = client.build_request("GET", f"{base}{STREAM}", params={"timeout": 60})
    response = client.send(request, stream=True)
    stack.callback(response.close)
    if response.status_code == 200:
        chunks = response.iter_raw()
        next(chunks)  # the stream is flowing
        stack.callback(chunks.close)  # (a dropped iterator would close the connection)
    return response


def _disconnect_frees_a_slot(base: str, secret: str) -> None:
    with ExitStack() as outer:
        held = []
        for _ in range(PER_TOKEN):
            stack = outer.enter_context(ExitStack())
            held.append((stack, _open_live(stack, base, secret)))
        assert [response.status_code for _, response in held] == [200] * PER_TOKEN
        with ExitStack() as stack:
            refused = _open_live(stack, base, secret)
            assert refused.status_code == 429
            refused.read()
            assert refused.json()["error"]["code"] == "too_many_streams"

        held[0][0].close()  # the client goes away
        deadline = time.monotonic() + 20
        while True:
            with ExitStack() as stack:
                status = _open_live(stack, base, secret).status_code
            if status == 200:
                break
            assert status == 429
            assert time.monotonic() < deadline, "the closed stream's slot was never freed"
            time.sleep(0.05)
    deadline = time.monotonic() + 20
    while open_streams.open_count():  # every client is gone: so is every stream
        assert time.monotonic() < deadline, "a stream outlived its client"
        time.sleep(0.05)


def test_a_disconnected_client_frees_its_slot_under_wsgi(limits, live_server, viewer_user):
    _disconnect_frees_a_slot(live_server.url, token_for(viewer_user))


def test_a_disconnected_client_frees_its_slot_under_asgi(limits, viewer_user):
    with AsgiServer() as server:
        _disconnect_frees_a_slot(server.url, token_for(viewer_user))


def test_other_tokens_are_unaffected_by_a_full_token(limits):
    full = bearer(token_for(make_user("full-streams", VIEW_PERMS)))
    held = [open_stream(full) for _ in range(PER_TOKEN)]
    assert open_stream(full).status_code == 429
    fresh = open_stream(bearer(token_for(make_user("fresh", VIEW_PERMS))))
    assert fresh.status_code == 200
    for response in [*held, fresh]:
        response.close()

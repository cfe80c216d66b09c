"""The remote orchestrator's transport without a server (httpx2's MockTransport): what each
kind of answer becomes, retries, secrecy of the token, and the missing extra."""

from __future__ import annotations

import json
import logging
import sys
import uuid

import httpx2
import pytest
from django.core.management import CommandError, call_command

from parallel_mcp import exceptions
from parallel_mcp.contract import limits
from parallel_mcp.exceptions import PermissionDeniedError
from parallel_mcp.worker.environment import RemoteEnvironment, environment_for
from parallel_mcp.worker.remote import RemoteError, RemoteOrchestrator, RemoteTransientError
from parallel_mcp.worker.transport import ERRORS_BY_CODE, MAX_RETRY_AFTER_SECONDS
from tests.remote_support import UNREACHABLE

TOKEN = "pmcp_0123456789ab_secret-part-of-the-token"
BASE = "http://api.example/api/pmcp/"


class Recorder:
    """A MockTransport handler answering from a list of responses; records the requests."""

    def __init__(self, *responses: httpx2.Response | Exception) -> None:
        self.responses = list(responses)
        self.requests: list[httpx2.Request] = []

    def __call__(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        answer = self.responses.pop(0) if len(self.responses) > 1 else self.responses[0]
        if isinstance(answer, Exception):
            raise answer
        return answer


def remote(*responses: httpx2.Response | Exception) -> tuple[RemoteOrchestrator, Recorder]:
    recorder = Recorder(*responses)
    client = RemoteOrchestrator(
        base_url=BASE, token=TOKEN, transport=httpx2.MockTransport(recorder)
    )
    return client, recorder


def envelope(status: int, code: str, details: dict | None = None, **headers: str):
    body = {"error": {"code": code, "message": f"said {code}", "details": details or {}}}
    return httpx2.Response(status, json=body, headers=headers)


TASK_ID = uuid.uuid4()


# -- requests -----------------------------------------------------------------------------------


def test_requests_carry_the_token_and_json_under_the_base_url():
    client, recorder = remote(httpx2.Response(204))
    assert client.claim_next_task(worker_id="w", kinds="k", lease_ms=5000) is None
    (request,) = recorder.requests
    assert str(request.url) == BASE + "worker/claim"
    assert request.headers["Authorization"] == f"Bearer {TOKEN}"
    assert request.headers["Content-Type"] == "application/json"
    assert json.loads(request.content) == {
        "worker_id": "w",
        "lease_ms": 5000,
        "kinds": ["k"],  # a single kind, as the local orchestrator accepts it
        "client_token": None,
    }


def test_query_lists_repeat_and_none_is_left_out():
    page = httpx2.Response(200, json={"results": [], "next_cursor": None, "next": None})
    client, recorder = remote(page)
    assert client.list_dead_tasks(kinds=["a", "b"]) == []
    (request,) = recorder.requests
    assert request.url.path == "/api/pmcp/tasks/dead"
    assert request.url.params.get_list("kind") == ["a", "b"]
    assert "run_id" not in request.url.params and "cursor" not in request.url.params


def test_the_offset_walks_keyset_pages_and_stops_at_the_last():
    def page(ids, cursor):
        rows = [{"id": str(uuid.UUID(int=n)), "status": "active"} for n in ids]
        return httpx2.Response(200, json={"results": rows, "next_cursor": cursor, "next": None})

    client, recorder = remote(page([1, 2, 3], "c1"), page([4, 5, 6], "c2"), page([7], None))
    runs = client.list_runs(offset=2, limit=10)
    assert [run.pk.int for run in runs] == [3, 4, 5, 6, 7]
    cursors = [request.url.params.get("cursor") for request in recorder.requests]
    assert cursors == [None, "c1", "c2"]
    assert [int(r.url.params["limit"]) for r in recorder.requests] == [12, 9, 6]


def test_a_walk_ends_when_the_cursor_does_not_move():
    stuck = httpx2.Response(200, json={"results": [], "next_cursor": "same", "next": None})
    client, recorder = remote(stuck)
    assert client.list_run_tasks(run_id=uuid.uuid4()) == []
    assert len(recorder.requests) == 2  # the second answer repeats the cursor: stop


def test_offsets_beyond_the_remote_bound_are_refused_before_any_request():
    client, recorder = remote(httpx2.Response(500))
    with pytest.raises(exceptions.ValidationError) as refused:
        client.list_dead_tasks(offset=limits.MAX_REMOTE_OFFSET + 1)
    assert refused.value.details == {"field": "offset"}
    assert recorder.requests == []


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda c: c.enqueue_task(run_id=uuid.uuid4(), kind="k", input={"x": object()}), "input"),
        (
            lambda c: c.complete_task(
                task_id=TASK_ID, lease_id=TASK_ID, worker_id="w", output=float("nan")
            ),
            "output",
        ),
        (lambda c: c.cancel_task(task_id="not-a-uuid"), "task_id"),
        (lambda c: c.list_pending_tasks(ready_by="2026-01-01"), "ready_by"),
        (lambda c: c.list_runs(statuses=["nope"]), "statuses"),
        (lambda c: c.claim_next_task(worker_id="w", kinds=[]), "kinds"),
        (lambda c: c.enqueue_tasks(run_id=uuid.uuid4(), tasks={"kind": "k"}), "tasks"),
    ],
)
def test_arguments_the_wire_cannot_carry_are_refused_before_any_request(call, field):
    client, recorder = remote(httpx2.Response(500))
    with pytest.raises(exceptions.ValidationError) as refused:
        call(client)
    assert refused.value.details.get("field") == field
    assert recorder.requests == []


def test_get_of_a_malformed_id_is_none_without_a_request():
    client, recorder = remote(httpx2.Response(500))
    assert client.get_task(task_id="nope") is None
    assert client.get_run(run_id=42) is None
    assert client.get_current_context_snapshot(run_id="") is None
    assert recorder.requests == []


# -- answers ------------------------------------------------------------------------------------


@pytest.mark.parametrize("code", sorted(ERRORS_BY_CODE))
def test_each_error_code_is_the_local_exception_class(code):
    details = {"task_id": str(TASK_ID), "field": "x"}
    client, _ = remote(envelope(409, code, details))
    with pytest.raises(ERRORS_BY_CODE[code]) as raised:
        client.cancel_task(task_id=TASK_ID)
    assert type(raised.value) is ERRORS_BY_CODE[code]
    assert raised.value.message == f"said {code}"
    assert raised.value.details == details


def test_a_record_not_found_reads_as_none_but_an_unknown_endpoint_does_not():
    client, _ = remote(envelope(404, "not_found", {"task_id": str(TASK_ID)}))
    assert client.get_task(task_id=TASK_ID) is None
    client, _ = remote(envelope(404, "not_found"))  # not_found_view: no record named
    with pytest.raises(RemoteError) as raised:
        client.get_task(task_id=TASK_ID)
    assert type(raised.value) is RemoteError
    assert raised.value.details == {"status": 404, "code": "not_found"}


@pytest.mark.parametrize(
    ("status", "code"), [(401, "not_authenticated"), (401, "authentication_failed")]
)
def test_refused_credentials_are_remote_errors_that_are_not_retried(status, code):
    client, _ = remote(envelope(status, code))
    with pytest.raises(RemoteError) as raised:
        client.get_run(run_id=TASK_ID)
    assert not isinstance(raised.value, RemoteTransientError)
    assert raised.value.details == {"status": status, "code": code}


def test_a_refused_permission_is_the_orchestrators_own_error_and_not_retried():
    client, _ = remote(envelope(403, "permission_denied"))
    with pytest.raises(PermissionDeniedError) as raised:
        client.get_run(run_id=TASK_ID)
    assert not isinstance(raised.value, RemoteTransientError)


@pytest.mark.parametrize(
    ("answer", "retry_after"),
    [
        (envelope(503, "unavailable", **{"Retry-After": "1"}), 1.0),
        (envelope(429, "throttled", {"wait": 120}, **{"Retry-After": "120"}), 30.0),
        (httpx2.Response(500, text="<html>oops</html>"), None),
        (httpx2.Response(502), None),
        (envelope(429, "throttled", **{"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}), None),
    ],
)
def test_5xx_and_429_are_transient_with_the_servers_wait(answer, retry_after):
    assert MAX_RETRY_AFTER_SECONDS == 30.0
    client, _ = remote(answer)
    with pytest.raises(RemoteTransientError) as raised:
        client.heartbeat_lease(task_id=TASK_ID, lease_id=TASK_ID, worker_id="w")
    assert raised.value.retry_after == retry_after
    assert raised.value.details["status"] == answer.status_code


def test_a_transient_answer_says_the_envelopes_code_and_message():
    client, _ = remote(envelope(429, "auth_throttled"))
    with pytest.raises(RemoteTransientError, match=r"^API answered 429 \(auth_throttled: said"):
        client.list_runs()
    client, _ = remote(httpx2.Response(502, text="<html>a proxy page</html>"))
    with pytest.raises(RemoteTransientError, match=r"^API answered 502\.$"):
        client.list_runs()


@pytest.mark.parametrize(
    "failure",
    [
        httpx2.ConnectError("refused"),
        httpx2.ReadTimeout("slow"),
        httpx2.PoolTimeout("busy"),
        httpx2.RemoteProtocolError("closed"),
    ],
)
def test_transport_failures_are_transient(failure):
    client, _ = remote(failure)
    with pytest.raises(RemoteTransientError, match=type(failure).__name__):
        client.list_runs()


def test_redirects_and_bodies_that_are_not_json_are_remote_errors():
    client, recorder = remote(httpx2.Response(301, headers={"Location": "https://elsewhere/"}))
    with pytest.raises(RemoteError, match="redirect to 'https://elsewhere/'"):
        client.expire_leases()
    assert len(recorder.requests) == 1  # not followed
    client, _ = remote(httpx2.Response(200, text="<html>a proxy page</html>"))
    with pytest.raises(RemoteError, match="not JSON"):
        client.expire_leases()


def test_a_server_down_is_transient():
    with RemoteOrchestrator(base_url=UNREACHABLE, token=TOKEN, timeout=2) as client:
        with pytest.raises(RemoteTransientError, match="ConnectError"):
            client.get_run(run_id=TASK_ID)


# -- the worker's retry loop ---------------------------------------------------------------------


def test_the_retry_loop_retries_transient_errors_and_waits_at_least_retry_after(
    monkeypatch, caplog
):
    client, recorder = remote(
        envelope(429, "throttled", **{"Retry-After": "3"}),
        httpx2.ConnectError("refused"),
        httpx2.Response(204),
    )
    env = environment_for(client)
    assert isinstance(env, RemoteEnvironment)
    waits: list[float] = []
    monkeypatch.setattr("parallel_mcp.worker.environment.time.sleep", waits.append)
    with caplog.at_level(logging.WARNING, logger="parallel_mcp.worker"):
        claim = env.retry(lambda: client.claim_next_task(worker_id="w"), what="claim", attempts=5)
    assert claim is None and len(recorder.requests) == 3
    assert waits[0] >= 3.0 and waits[1] < 3.0  # the server's wait, then the own backoff
    assert "API hiccup during claim" in caplog.text and TOKEN not in caplog.text


def test_the_retry_loop_gives_up_after_its_attempts_and_passes_other_errors_on(monkeypatch):
    monkeypatch.setattr("parallel_mcp.worker.environment.time.sleep", lambda seconds: None)
    client, recorder = remote(httpx2.Response(503))
    env = RemoteEnvironment(client)
    with pytest.raises(RemoteTransientError):
        env.retry(lambda: client.expire_leases(), what="expiry", attempts=3)
    assert len(recorder.requests) == 3
    client, recorder = remote(envelope(409, "lease_conflict", {"task_id": str(TASK_ID)}))
    with pytest.raises(exceptions.LeaseConflictError):
        RemoteEnvironment(client).retry(
            lambda: client.heartbeat_lease(task_id=TASK_ID, lease_id=TASK_ID, worker_id="w"),
            what="heartbeat",
            attempts=3,
        )
    assert len(recorder.requests) == 1


# -- construction, secrecy, the missing extra ----------------------------------------------------


def test_the_token_never_shows():
    client, _ = remote(httpx2.ConnectError(f"refused, token {TOKEN[:4]}…"))
    assert TOKEN not in repr(client) and repr(client) == f"RemoteOrchestrator({BASE})"
    assert TOKEN not in repr(vars(client)) and TOKEN not in repr(vars(client._http))
    assert "[secure]" in repr(client._http._client.headers)


@pytest.mark.parametrize("url", ["ftp://host/api/", "host:8000/api/pmcp/", "http://", ""])
def test_bad_urls_and_empty_tokens_are_refused(url):
    with pytest.raises(exceptions.ValidationError) as refused:
        RemoteOrchestrator(base_url=url, token=TOKEN)
    assert refused.value.details == {"field": "api"}
    with pytest.raises(exceptions.ValidationError) as refused:
        RemoteOrchestrator(base_url=BASE, token="")
    assert refused.value.details == {"field": "token"}


def test_pmcp_worker_api_without_httpx2_names_the_extra(monkeypatch):
    for name in ("parallel_mcp.worker.remote", "parallel_mcp.worker.transport"):
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "httpx2", None)  # as if not installed
    with pytest.raises(CommandError) as refused:
        call_command("pmcp_worker", "--api", BASE, "--token", TOKEN)
    assert str(refused.value).startswith(
        "--api needs the HTTP client httpx2: install parallel-mcp with its remote extra"
    )

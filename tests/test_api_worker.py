"""The worker protocol over HTTP, exactly as remote workers use it."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from parallel_mcp import Orchestrator
from parallel_mcp.selectors import outstanding_input_requests
from parallel_mcp.services.tool_calls import start_tool_call
from tests.api_helpers import error_of
from tests.test_api_runs import RUN_FIELDS
from tests.test_api_tasks import TASK_FIELDS

pytestmark = pytest.mark.django_db
pytest_plugins = ["tests.api_fixtures"]

LEASE_FIELDS = {
    "id",
    "run_id",
    "task_id",
    "attempt_id",
    "worker_id",
    "status",
    "acquired_at",
    "expires_at",
    "heartbeat_at",
    "released_at",
    "client_token",
}
ATTEMPT_FIELDS = {
    "id",
    "run_id",
    "task_id",
    "worker_id",
    "status",
    "leased_at",
    "started_at",
    "ended_at",
    "lease_expires_at",
    "error",
    "output",
    "metadata",
}


@pytest.fixture
def orch() -> Orchestrator:
    return Orchestrator()


@pytest.fixture
def run(orch):
    return orch.create_run(namespace="remote", context={"release": 7})


def claim(api, worker_id="w1", **body):
    response = api.post("worker/claim", {"worker_id": worker_id, **body})
    assert response.status_code == 200, response.content
    return response.json()


def lease(body) -> dict:
    return {"lease_id": body["lease"]["id"], "worker_id": body["lease"]["worker_id"]}


def when(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_a_task_from_claim_to_completion(worker, orch, run):
    task = orch.enqueue_task(run_id=run.pk, kind="site.apply", input={"n": 1})
    body = claim(worker, lease_ms=60_000, kinds=["site.apply"])
    assert set(body) == {"run", "task", "attempt", "lease", "context"}
    assert set(body["run"]) == RUN_FIELDS and set(body["task"]) == TASK_FIELDS
    assert set(body["lease"]) == LEASE_FIELDS and set(body["attempt"]) == ATTEMPT_FIELDS
    assert body["context"] == {"release": 7}
    assert body["task"]["id"] == str(task.pk) and body["task"]["status"] == "leased"
    assert body["task"]["input"] == {"n": 1} and body["task"]["attempt_count"] == 1
    expires = when(body["lease"]["expires_at"]) - when(body["lease"]["acquired_at"])
    assert expires == timedelta(milliseconds=60_000)
    path = f"tasks/{task.pk}"

    running = worker.post(f"{path}/running", lease(body))
    assert running.status_code == 200 and running.json()["status"] == "running"

    beat = worker.post(f"{path}/heartbeat", {**lease(body), "lease_ms": 120_000})
    assert beat.status_code == 200, beat.content
    assert beat.json()["cancelled"] is False
    new = beat.json()["lease"]
    assert when(new["expires_at"]) - when(new["heartbeat_at"]) == timedelta(milliseconds=120_000)

    progress = worker.post(f"{path}/progress", {**lease(body), "progress": 0.5, "message": "half"})
    assert progress.json()["progress"] == 0.5
    assert progress.json()["progress_message"] == "half"

    done = worker.post(
        f"{path}/complete",
        {
            **lease(body),
            "output": {"ok": True},
            "metadata": {"t": 1},
            "next_context": {"release": 8},
            "next_context_label": "after apply",
        },
    )
    assert done.status_code == 200, done.content
    assert set(done.json()) == TASK_FIELDS
    assert done.json()["status"] == "completed" and done.json()["output"] == {"ok": True}
    assert orch.get_current_context_snapshot(run_id=run.pk).payload == {"release": 8}
    types = iter(e.event_type for e in orch.list_run_events(run_id=run.pk))
    expected = ["task.claimed", "task.running", "task.lease_heartbeat", "task.progress"]
    assert all(name in types for name in [*expected, "task.completed"])  # in this order


def test_claim_answers_204_without_a_body_when_nothing_is_claimable(worker, orch, run):
    orch.enqueue_task(run_id=run.pk, kind="other")
    response = worker.post("worker/claim", {"worker_id": "w", "kinds": ["mine"]})
    assert response.status_code == 204 and response.content == b""
    response = worker.post("worker/claim", {"worker_id": "w", "kinds": None, "lease_ms": None})
    assert response.status_code == 200


def test_claim_context_is_null_without_context(worker, orch):
    run = orch.create_run()
    orch.enqueue_task(run_id=run.pk, kind="k")
    assert claim(worker)["context"] is None


def test_claim_with_client_token_replays(worker, orch, run):
    orch.enqueue_task(run_id=run.pk, kind="k")
    orch.enqueue_task(run_id=run.pk, kind="k")
    first = claim(worker, client_token="c-1")
    again = claim(worker, client_token="c-1")
    assert again["lease"]["id"] == first["lease"]["id"]
    assert again["lease"]["client_token"] == "c-1"
    other = worker.post("worker/claim", {"worker_id": "w2", "client_token": "c-1"})
    assert other.status_code == 409 and error_of(other)["code"] == "idempotency_conflict"


def test_heartbeat_tells_a_worker_its_task_was_cancelled(worker, operator, orch, run):
    task = orch.enqueue_task(run_id=run.pk, kind="k")
    body = claim(worker)
    assert operator.post(f"tasks/{task.pk}/cancel").status_code == 200
    response = worker.post(f"tasks/{task.pk}/heartbeat", lease(body))
    assert response.status_code == 409
    error = error_of(response)
    assert error["code"] == "lease_conflict" and error["details"]["cancelled"] is True
    # Even after the cancelled task was re-executed, the old lease is a cancelled one.
    operator.post(f"tasks/{task.pk}/retry")
    error = error_of(worker.post(f"tasks/{task.pk}/heartbeat", lease(body)))
    assert error["details"]["cancelled"] is True
    # Every fenced call says so, not only the heartbeat.
    error = error_of(worker.post(f"tasks/{task.pk}/complete", lease(body)))
    assert error["code"] == "lease_conflict" and error["details"]["cancelled"] is True


def test_heartbeat_tells_a_worker_its_run_was_cancelled(worker, operator, orch, run):
    task = orch.enqueue_task(run_id=run.pk, kind="k")
    body = claim(worker)
    worker.post(f"tasks/{task.pk}/running", lease(body))
    operator.post(f"runs/{run.pk}/cancel", {"reason": "stop"})
    error = error_of(worker.post(f"tasks/{task.pk}/heartbeat", lease(body)))
    assert error["code"] == "lease_conflict" and error["details"]["cancelled"] is True


def test_other_lease_conflicts_are_not_cancellations(worker, orch, run):
    task = orch.enqueue_task(run_id=run.pk, kind="k")
    body = claim(worker)
    wrong = {**lease(body), "worker_id": "intruder"}
    response = worker.post(f"tasks/{task.pk}/heartbeat", wrong)
    assert response.status_code == 409
    assert error_of(response)["details"]["cancelled"] is False
    worker.post(f"tasks/{task.pk}/complete", lease(body))
    error = error_of(worker.post(f"tasks/{task.pk}/heartbeat", lease(body)))
    assert error["code"] == "lease_conflict" and error["details"]["cancelled"] is False


def test_expired_lease_is_410(worker, orch, run):
    orch.enqueue_task(run_id=run.pk, kind="k")
    with worker.acting():
        old = orch.claim_next_task(
            worker_id="w1", lease_ms=1_000, now=timezone.now() - timedelta(minutes=5)
        )
    ids = {"lease_id": str(old.lease.pk), "worker_id": "w1"}
    for action, extra in (
        ("running", {}),
        ("heartbeat", {}),
        ("progress", {"progress": 0.1}),
        ("complete", {}),
        ("fail", {"error": "x"}),
        ("release", {}),
        ("pause", {"status": "blocked"}),
    ):
        response = worker.post(f"tasks/{old.task.pk}/{action}", {**ids, **extra})
        assert response.status_code == 410, (action, response.content)
        assert error_of(response)["code"] == "lease_expired"


def test_fail_with_and_without_retry(worker, orch, run):
    retried = orch.enqueue_task(run_id=run.pk, kind="r", max_attempts=2, retry={"delay_ms": 60_000})
    final = orch.enqueue_task(run_id=run.pk, kind="f")
    body = claim(worker, kinds=["r"])
    response = worker.post(
        f"tasks/{retried.pk}/fail",
        {**lease(body), "error": "flaky", "retry": True, "metadata": {"why": "net"}},
    )
    assert response.status_code == 200
    again = response.json()
    assert again["status"] == "queued" and again["error"] == "flaky"
    assert again["not_before"] is not None and again["metadata"] == {"why": "net"}

    body = claim(worker, kinds=["f"])
    failed = worker.post(f"tasks/{final.pk}/fail", {**lease(body), "error": "bad input"}).json()
    assert failed["status"] == "failed" and failed["dead"] is False


def test_complete_and_fail_with_a_client_token_apply_once(worker, orch, run):
    task = orch.enqueue_task(run_id=run.pk, kind="k")
    body = claim(worker)
    payload = {**lease(body), "output": 1, "client_token": "done-1"}
    first = worker.post(f"tasks/{task.pk}/complete", payload)
    second = worker.post(f"tasks/{task.pk}/complete", payload)
    assert first.status_code == second.status_code == 200
    assert second.json()["status"] == "completed"
    completed = [e for e in orch.list_run_events(run_id=run.pk) if e.event_type == "task.completed"]
    assert len(completed) == 1
    other = worker.post(
        f"tasks/{task.pk}/fail", {**lease(body), "error": "x", "client_token": "done-1"}
    )
    assert other.status_code == 409 and error_of(other)["code"] == "idempotency_conflict"


def test_release_gives_the_task_back(worker, orch, run):
    task = orch.enqueue_task(run_id=run.pk, kind="k")
    body = claim(worker)
    response = worker.post(f"tasks/{task.pk}/release", {**lease(body), "reason": "shutting down"})
    assert response.status_code == 200
    assert response.json()["status"] == "queued" and response.json()["lease_id"] is None


def test_pause_blocked_by_and_waiting_input(worker, operator, orch, run):
    blocker = orch.enqueue_task(run_id=run.pk, kind="blocker")
    task = orch.enqueue_task(run_id=run.pk, kind="k")
    body = claim(worker, kinds=["k"])
    paused = worker.post(
        f"tasks/{task.pk}/pause",
        {**lease(body), "status": "blocked", "reason": "wait", "blocked_by": [str(blocker.pk)]},
    )
    assert paused.status_code == 200, paused.content
    assert paused.json()["status"] == "blocked"
    blockers = operator.get(f"tasks/{task.pk}").json()["blockers"]
    assert blockers[0]["kind"] == "paused" and blockers[0]["task_id"] == str(blocker.pk)
    blocking = claim(worker, kinds=["blocker"])
    worker.post(f"tasks/{blocker.pk}/complete", lease(blocking))
    assert orch.get_task(task_id=task.pk).status == "queued"

    body = claim(worker, kinds=["k"])
    waiting = worker.post(f"tasks/{task.pk}/pause", {**lease(body), "status": "waiting_input"})
    assert waiting.json()["status"] == "waiting_input"
    unknown = worker.post(
        f"tasks/{task.pk}/pause",
        {**lease(body), "status": "blocked", "blocked_by": [str(run.pk)]},
    )
    assert unknown.status_code == 409  # no longer leased
    resumed = operator.post(f"tasks/{task.pk}/resume", {"input": {"answer": 42}})
    assert resumed.json()["status"] == "queued"


def test_pause_with_an_unknown_blocker_is_400(worker, orch, run):
    task = orch.enqueue_task(run_id=run.pk, kind="k")
    body = claim(worker)
    response = worker.post(
        f"tasks/{task.pk}/pause",
        {**lease(body), "status": "blocked", "blocked_by": [str(run.pk)]},
    )
    assert response.status_code == 400 and error_of(response)["code"] == "invalid_dependency"
    assert orch.get_task(task_id=task.pk).status == "leased"


def test_pause_waiting_input_with_input_requests_of_a_tool_call(worker, orch, run):
    call = start_tool_call(
        using="default", tool="t", kind="k.tool", input={}, principal="local", ttl_ms=None
    )
    request = {"method": "elicitation/create", "params": {"message": "Name?"}}
    body = claim(worker, kinds=["k.tool"])
    refusals = [
        ({"status": "blocked", "input_requests": {"q": request}}, "waiting_input"),
        ({"status": "waiting_input", "input_requests": {"q": {"method": "x"}}}, "method"),
        ({"status": "waiting_input", "input_requests": {}}, "non-empty"),
    ]
    for extra, message in refusals:
        refused = worker.post(f"tasks/{call.task_id}/pause", {**lease(body), **extra})
        assert refused.status_code == 400, refused.content
        assert error_of(refused)["code"] == "validation_error"
        assert message in error_of(refused)["message"]
    paused = worker.post(
        f"tasks/{call.task_id}/pause",
        {**lease(body), "status": "waiting_input", "input_requests": {"q": request}},
    )
    assert paused.status_code == 200, paused.content
    assert paused.json()["status"] == "waiting_input"
    assert outstanding_input_requests(using="default", run_id=call.run_id) == {"q": request}

    # A run no MCP tool call created has no client to ask: a data refusal, nothing written.
    task = orch.enqueue_task(run_id=run.pk, kind="k.plain")
    body = claim(worker, kinds=["k.plain"])
    refused = worker.post(
        f"tasks/{task.pk}/pause",
        {**lease(body), "status": "waiting_input", "input_requests": {"q": request}},
    )
    assert refused.status_code == 400
    assert error_of(refused)["details"]["field"] == "input_requests"
    assert orch.get_task(task_id=task.pk).status == "leased"


def test_worker_bodies_ignore_unknown_fields(worker, orch, run):
    orch.enqueue_task(run_id=run.pk, kind="k")
    response = worker.post("worker/claim", {"worker_id": "w", "client_version": "2.0"})
    assert response.status_code == 200


def test_a_fan_out_run_end_to_end_over_http(worker, operator):
    created = operator.post("runs", {"namespace": "fan", "context": {"n": 0}}).json()
    run_id = created["id"]
    batch = operator.post(
        f"runs/{run_id}/tasks/batch",
        {
            "tasks": [
                *({"kind": "part", "key": f"p{i}", "input": {"i": i}} for i in range(4)),
                {"kind": "join", "key": "join", "depends_on": [f"p{i}" for i in range(4)]},
            ]
        },
    )
    assert batch.status_code == 201
    seen = []
    while True:
        response = worker.post("worker/claim", {"worker_id": "remote", "lease_ms": 10_000})
        if response.status_code == 204:
            break
        body = response.json()
        seen.append(body["task"]["key"])
        path = f"tasks/{body['task']['id']}"
        assert worker.post(f"{path}/running", lease(body)).status_code == 200
        output = {"i": (body["task"]["input"] or {}).get("i")}
        assert worker.post(f"{path}/complete", {**lease(body), "output": output}).status_code == 200
    assert seen[-1] == "join" and sorted(seen[:-1]) == ["p0", "p1", "p2", "p3"]
    final = operator.get(f"runs/{run_id}").json()
    assert final["status"] == "completed" and final["progress"] == 1.0

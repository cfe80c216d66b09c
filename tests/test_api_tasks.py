"""Tasks over HTTP: detail with attempts and blockers, operator actions, pending / dead /
stuck lists."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from parallel_mcp import Orchestrator
from tests.api_helpers import error_of

pytestmark = pytest.mark.django_db
pytest_plugins = ["tests.api_fixtures"]

TASK_FIELDS = {
    "id",
    "run_id",
    "key",
    "kind",
    "status",
    "priority",
    "max_attempts",
    "attempt_count",
    "retry_delay_ms",
    "retry_backoff",
    "retry_max_delay_ms",
    "timeout_ms",
    "not_before",
    "input",
    "output",
    "metadata",
    "error",
    "progress",
    "progress_message",
    "context_snapshot_id",
    "lease_id",
    "leased_by",
    "lease_expires_at",
    "dead",
    "created_at",
    "updated_at",
    "started_at",
    "completed_at",
    "depends_on_task_ids",
}


@pytest.fixture
def orch() -> Orchestrator:
    return Orchestrator()


@pytest.fixture
def run(orch):
    return orch.create_run(namespace="tasks")


def finish(orch, claim, *, fail: bool = False, **kwargs):
    ids = {"task_id": claim.task.pk, "lease_id": claim.lease.pk, "worker_id": claim.lease.worker_id}
    if fail:
        return orch.fail_task(**ids, error=kwargs.pop("error", "boom"), **kwargs)
    return orch.complete_task(**ids, **kwargs)


def test_detail_has_every_field_attempts_and_blockers(operator, orch, run):
    first = orch.enqueue_task(run_id=run.pk, kind="a", max_attempts=3)
    second = orch.enqueue_task(run_id=run.pk, kind="b", depends_on=[first.pk])
    claim = orch.claim_next_task(worker_id="w1")
    finish(orch, claim, fail=True, retry=True)
    claim = orch.claim_next_task(worker_id="w2")

    body = operator.get(f"tasks/{first.pk}").json()
    assert set(body) == TASK_FIELDS | {"attempts", "blockers", "input_responses"}
    assert body["input_responses"] == {}  # asked nothing
    assert [attempt["worker_id"] for attempt in body["attempts"]] == ["w1", "w2"]
    assert [attempt["status"] for attempt in body["attempts"]] == ["failed", "leased"]
    assert set(body["attempts"][0]) == {
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
    assert [blocker["kind"] for blocker in body["blockers"]] == ["leased"]
    assert body["leased_by"] == "w2" and body["lease_id"] == str(claim.lease.pk)

    dependent = operator.get(f"tasks/{second.pk}").json()
    assert dependent["depends_on_task_ids"] == [str(first.pk)]
    assert dependent["attempts"] == []
    assert dependent["blockers"] == [
        {
            "kind": "dependency_pending",
            "message": dependent["blockers"][0]["message"],
            "task_id": str(first.pk),
            "until": None,
        }
    ]


def test_detail_shows_only_the_most_recent_attempts(operator, orch, run, settings):
    settings.PARALLEL_MCP_API = {"TASK_DETAIL_ATTEMPTS": 2}
    task = orch.enqueue_task(run_id=run.pk, kind="a")
    for worker in ("w1", "w2", "w3"):
        claim = orch.claim_next_task(worker_id=worker)
        orch.release_task(task_id=task.pk, lease_id=claim.lease.pk, worker_id=worker)
    attempts = operator.get(f"tasks/{task.pk}").json()["attempts"]
    assert [attempt["worker_id"] for attempt in attempts] == ["w2", "w3"]


def test_resume_with_and_without_input(operator, orch, run):
    orch.enqueue_task(run_id=run.pk, kind="a", input={"old": True})
    claim = orch.claim_next_task(worker_id="w")
    ids = {"task_id": claim.task.pk, "lease_id": claim.lease.pk, "worker_id": "w"}
    orch.pause_task(**ids, status="waiting_input", reason="needs approval")
    blockers = operator.get(f"tasks/{claim.task.pk}").json()["blockers"]
    assert blockers[0]["kind"] == "paused" and "needs approval" in blockers[0]["message"]

    response = operator.post(f"tasks/{claim.task.pk}/resume", {"input": {"approved": True}})
    assert response.status_code == 200, response.content
    assert response.json()["status"] == "queued"
    assert response.json()["input"] == {"approved": True}

    claim = orch.claim_next_task(worker_id="w")
    orch.pause_task(**{**ids, "lease_id": claim.lease.pk}, status="blocked")
    kept = operator.post(f"tasks/{claim.task.pk}/resume").json()
    assert kept["input"] == {"approved": True}

    claim = orch.claim_next_task(worker_id="w")
    orch.pause_task(**{**ids, "lease_id": claim.lease.pk}, status="blocked")
    cleared = operator.post(f"tasks/{claim.task.pk}/resume", {"input": None}).json()
    assert cleared["input"] is None


def test_cancel_task(operator, orch, run):
    task = orch.enqueue_task(run_id=run.pk, kind="a")
    response = operator.post(f"tasks/{task.pk}/cancel", {"reason": "not needed"})
    assert response.status_code == 200 and response.json()["status"] == "cancelled"
    again = operator.post(f"tasks/{task.pk}/cancel")
    assert again.status_code == 409 and error_of(again)["code"] == "invalid_transition"


def test_retry_with_and_without_cascade(operator, orch, run):
    first = orch.enqueue_task(run_id=run.pk, kind="a")
    second = orch.enqueue_task(run_id=run.pk, kind="b", depends_on=[first.pk])
    finish(orch, orch.claim_next_task(worker_id="w"))
    finish(orch, orch.claim_next_task(worker_id="w"))
    response = operator.post(f"tasks/{first.pk}/retry", {"cascade": False, "reason": "again"})
    assert response.status_code == 200 and response.json()["status"] == "queued"
    assert orch.get_task(task_id=second.pk).status == "completed"
    finish(orch, orch.claim_next_task(worker_id="w"))
    assert operator.post(f"tasks/{first.pk}/retry").json()["status"] == "queued"  # cascade
    assert orch.get_task(task_id=second.pk).status == "queued"
    queued = operator.post(f"tasks/{first.pk}/retry")
    assert queued.status_code == 409 and error_of(queued)["code"] == "invalid_transition"


def test_dead_list_and_requeue(operator, orch, run):
    task = orch.enqueue_task(run_id=run.pk, kind="a", max_attempts=1)
    orch.enqueue_task(run_id=run.pk, kind="b")
    finish(orch, orch.claim_next_task(worker_id="w", kinds=["a"]), fail=True, retry=True)
    dead = operator.get("tasks/dead").json()
    assert [row["id"] for row in dead["results"]] == [str(task.pk)]
    assert dead["results"][0]["dead"] is True and dead["next_cursor"] is None
    assert operator.get("tasks/dead", {"kind": "b"}).json()["results"] == []
    assert len(operator.get("tasks/dead", {"run_id": str(run.pk)}).json()["results"]) == 1

    later = timezone.now() + timedelta(hours=1)
    response = operator.post(
        f"tasks/{task.pk}/requeue", {"not_before": later.isoformat(), "reason": "fixed"}
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["status"] == "queued" and body["dead"] is False and body["attempt_count"] == 0
    assert operator.get("tasks/dead").json()["results"] == []
    again = operator.post(f"tasks/{task.pk}/requeue")
    assert again.status_code == 409 and error_of(again)["code"] == "invalid_transition"


def test_pending_in_claim_order_with_filters(operator, orch, run):
    low = orch.enqueue_task(run_id=run.pk, kind="a", priority=0)
    high = orch.enqueue_task(run_id=run.pk, kind="b", priority=5)
    blocked = orch.enqueue_task(run_id=run.pk, kind="a", depends_on=[low.pk])
    later = orch.enqueue_task(
        run_id=run.pk, kind="a", not_before=timezone.now() + timedelta(hours=1)
    )

    def ids(**params):
        response = operator.get("tasks/pending", params)
        assert response.status_code == 200, response.content
        return [row["id"] for row in response.json()["results"]]

    assert ids() == [str(high.pk), str(low.pk), str(blocked.pk), str(later.pk)]
    assert ids(ready="true") == [str(high.pk), str(low.pk)]
    assert ids(kind="a") == [str(low.pk), str(blocked.pk), str(later.pk)]
    assert ids(run_id=str(orch.create_run().pk)) == []
    # ready_by: what a claim could take at that time (list_pending_tasks' ready_by)
    in_two_hours = (timezone.now() + timedelta(hours=2)).isoformat()
    assert ids(ready_by=in_two_hours) == [str(high.pk), str(low.pk), str(later.pk)]
    assert ids(ready_by=timezone.now().isoformat(), kind="a") == [str(low.pk)]
    # both: ready_by is the time that counts (query parameters cannot say "not both")
    assert ids(ready="true", ready_by=in_two_hours) == ids(ready_by=in_two_hours)
    assert ids(ready="false", ready_by=in_two_hours) == ids(ready_by=in_two_hours)


def test_pending_refuses_naive_and_unreadable_times(operator):
    now = timezone.now()
    for params, field in (
        ({"ready_by": now.replace(tzinfo=None).isoformat()}, "ready_by"),
        ({"ready_by": "tomorrow"}, "ready_by"),
    ):
        response = operator.get("tasks/pending", params)
        assert response.status_code == 400, params
        error = error_of(response)
        assert error["code"] == "validation_error" and error["details"]["field"] == field


def test_stuck_list(operator, orch, run):
    orch.enqueue_task(run_id=run.pk, kind="a", timeout_ms=1_000)
    start = timezone.now() - timedelta(seconds=30)
    claim = orch.claim_next_task(worker_id="w", lease_ms=3_600_000, now=start)
    body = operator.get("tasks/stuck").json()
    assert [row["id"] for row in body["results"]] == [str(claim.task.pk)]
    assert operator.get("tasks/stuck", {"running_longer_than_ms": 0}).json()["results"]

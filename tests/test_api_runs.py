"""Runs over HTTP: create, list with filters, detail, cancel, copy, context, events, tasks."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.utils import timezone

from parallel_mcp import Orchestrator
from parallel_mcp.models import Task
from tests.api_helpers import error_of
from tests.conftest import at

pytestmark = pytest.mark.django_db
pytest_plugins = ["tests.api_fixtures"]

RUN_FIELDS = {
    "id",
    "namespace",
    "external_id",
    "status",
    "metadata",
    "current_context_snapshot_id",
    "max_parallel",
    "cancel_requested_at",
    "cancel_reason",
    "tasks_total",
    "tasks_active",
    "tasks_waiting",
    "tasks_stuck",
    "tasks_completed",
    "tasks_failed",
    "tasks_cancelled",
    "progress",
    "created_at",
    "updated_at",
}


@pytest.fixture
def orch() -> Orchestrator:
    return Orchestrator()


def test_create_run_returns_201_with_every_field(operator, orch):
    response = operator.post(
        "runs",
        {
            "namespace": "sites",
            "external_id": "deploy-1",
            "metadata": {"by": "ops"},
            "context": {"release": 1},
            "max_parallel": 2,
        },
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert set(body) == RUN_FIELDS
    run = orch.get_run(run_id=body["id"])
    assert body["namespace"] == "sites" and body["external_id"] == "deploy-1"
    assert body["metadata"] == {"by": "ops"} and body["max_parallel"] == 2
    assert body["status"] == "pending" and body["progress"] == 0.0
    assert body["current_context_snapshot_id"] == str(run.current_context_snapshot_id)
    assert orch.get_current_context_snapshot(run_id=run.pk).payload == {"release": 1}
    assert body["created_at"].endswith("Z") or "+" in body["created_at"]


def test_create_run_with_defaults_and_with_an_id(operator):
    body = operator.post("runs").json()
    assert body["namespace"] == "default" and body["current_context_snapshot_id"] is None
    chosen = str(uuid.uuid4())
    assert operator.post("runs", {"id": chosen}).json()["id"] == chosen


def test_detail_has_counters_and_progress(operator, orch):
    run = orch.create_run(namespace="n")
    first = orch.enqueue_task(run_id=run.pk, kind="k")
    orch.enqueue_task(run_id=run.pk, kind="k", depends_on=[first.pk])
    orch.enqueue_task(run_id=run.pk, kind="k")
    claim = orch.claim_next_task(worker_id="w")
    orch.complete_task(task_id=claim.task.pk, lease_id=claim.lease.pk, worker_id="w")
    other = orch.claim_next_task(worker_id="w")
    orch.cancel_task(task_id=other.task.pk)
    body = operator.get(f"runs/{run.pk}").json()
    assert body["tasks_total"] == 3
    assert body["tasks_completed"] + body["tasks_cancelled"] == 2
    assert body["tasks_active"] + body["tasks_stuck"] == 1
    assert body["progress"] == pytest.approx(2 / 3)


def test_list_runs_filters(operator, orch):
    a = orch.create_run(namespace="a", external_id="x", now=at(0))
    b = orch.create_run(namespace="b", now=at(10))
    c = orch.create_run(namespace="a", now=at(20))
    orch.cancel_run(run_id=c.pk, now=at(30))
    orch.enqueue_task(run_id=b.pk, kind="k", now=at(40))

    def ids(**params):
        response = operator.get("runs", params)
        assert response.status_code == 200, response.content
        return [row["id"] for row in response.json()["results"]]

    assert ids() == [str(b.pk), str(c.pk), str(a.pk)]  # updated_at desc
    assert ids(order_dir="asc") == [str(a.pk), str(c.pk), str(b.pk)]
    assert ids(order_by="created_at") == [str(c.pk), str(b.pk), str(a.pk)]
    assert ids(namespace="a") == [str(c.pk), str(a.pk)]
    assert ids(external_id="x") == [str(a.pk)]
    assert ids(status="cancelled") == [str(c.pk)]
    assert ids(status="cancelled,pending") == [str(c.pk), str(a.pk)]
    assert set(ids(status=["cancelled", "active"])) == {str(c.pk), str(b.pk)}
    assert ids(updated_after=at(30).isoformat()) == [str(b.pk), str(c.pk)]
    assert ids(updated_before=at(30).isoformat()) == [str(a.pk)]
    assert ids(updated_after=at(1).isoformat(), updated_before=at(40).isoformat()) == [str(c.pk)]


def test_cancel_run(operator, orch):
    run = orch.create_run()
    task = orch.enqueue_task(run_id=run.pk, kind="k")
    response = operator.post(f"runs/{run.pk}/cancel", {"reason": "enough"})
    assert response.status_code == 200
    assert response.json()["status"] == "cancelled"
    assert response.json()["cancel_reason"] == "enough"
    assert orch.get_task(task_id=task.pk).status == "cancelled"
    again = operator.post(f"runs/{run.pk}/cancel")  # a terminal run: unchanged
    assert again.status_code == 200 and again.json()["status"] == "cancelled"


def test_copy_run(operator, orch):
    run = orch.create_run(namespace="n")
    a = orch.enqueue_task(run_id=run.pk, kind="a", key="a")
    orch.enqueue_task(run_id=run.pk, kind="b", key="b", depends_on=[a.pk])
    response = operator.post(f"runs/{run.pk}/copy")
    assert response.status_code == 201
    copy = response.json()
    assert copy["id"] != str(run.pk) and copy["tasks_total"] == 2
    tasks = operator.get(f"runs/{copy['id']}/tasks").json()["results"]
    by_key = {task["key"]: task for task in tasks}
    assert by_key["b"]["depends_on_task_ids"] == [by_key["a"]["id"]]
    assert operator.post(f"runs/{run.pk}/copy", {"extra": 1}).status_code == 400


def test_context_get_and_append(operator, orch):
    run = orch.create_run()
    assert operator.get(f"runs/{run.pk}/context").json() == {"snapshot": None}
    response = operator.post(f"runs/{run.pk}/context", {"payload": {"a": 1}, "label": "first"})
    assert response.status_code == 201
    snapshot = response.json()
    assert set(snapshot) == {
        "id",
        "run_id",
        "task_id",
        "scope",
        "parent_snapshot_id",
        "label",
        "payload",
        "created_at",
    }
    current = operator.get(f"runs/{run.pk}/context").json()["snapshot"]
    assert current == snapshot
    second = operator.post(f"runs/{run.pk}/context", {"payload": [1, 2]}).json()
    assert second["parent_snapshot_id"] == snapshot["id"]
    assert operator.get(f"runs/{run.pk}/context").json()["snapshot"]["payload"] == [1, 2]
    assert operator.post(f"runs/{run.pk}/context", {"payload": None}).status_code == 400
    task_scope = operator.post(f"runs/{run.pk}/context", {"payload": 1, "scope": "task"})
    assert error_of(task_scope)["details"]["field"] == "task_id"
    assert operator.get(f"runs/{uuid.uuid4()}/context").status_code == 404


def test_events_of_a_run(operator, orch):
    run = orch.create_run()
    other = orch.create_run()
    orch.enqueue_task(run_id=run.pk, kind="k")
    orch.enqueue_task(run_id=other.pk, kind="k")
    body = operator.get(f"runs/{run.pk}/events").json()
    types = [event["event_type"] for event in body["results"]]
    assert types == ["run.created", "task.enqueued", "run.status.changed"]
    assert {event["run_id"] for event in body["results"]} == {str(run.pk)}
    assert body["next_cursor"] == body["results"][-1]["id"] and body["has_more"] is False
    later = operator.get(f"runs/{run.pk}/events", {"after_id": body["next_cursor"]}).json()
    assert later == {"results": [], "next_cursor": body["next_cursor"], "has_more": False}
    only = operator.get(f"runs/{run.pk}/events", {"type": "task.enqueued"}).json()
    assert [event["event_type"] for event in only["results"]] == ["task.enqueued"]


def test_enqueue_one_task_with_every_field(operator, orch):
    run = orch.create_run()
    dep = orch.enqueue_task(run_id=run.pk, kind="dep")
    snapshot = orch.append_context_snapshot(run_id=run.pk, payload={"c": 1})
    task_id = str(uuid.uuid4())
    response = operator.post(
        f"runs/{run.pk}/tasks",
        {
            "id": task_id,
            "kind": "site.apply",
            "key": " spaced key ",
            "priority": 7,
            "max_attempts": 3,
            "retry": {"delay_ms": 100, "backoff": "exponential", "max_delay_ms": 1000},
            "timeout_ms": 5000,
            "input": {"region": "eu"},
            "metadata": {"m": True},
            "depends_on": [{"task_id": str(dep.pk), "required": False}],
            "not_before": "2030-01-01T00:00:00Z",
            "context_snapshot_id": str(snapshot.pk),
        },
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["id"] == task_id and body["key"] == " spaced key "
    assert body["retry_backoff"] == "exponential" and body["retry_delay_ms"] == 100
    assert body["depends_on_task_ids"] == [str(dep.pk)]
    assert body["not_before"].startswith("2030-01-01T00:00:00")
    assert body["context_snapshot_id"] == str(snapshot.pk)
    task = Task.objects.get(pk=task_id)
    assert task.priority == 7 and task.input == {"region": "eu"} and task.timeout_ms == 5000


def test_enqueue_a_batch_with_keys(operator, orch):
    run = orch.create_run()
    response = operator.post(
        f"runs/{run.pk}/tasks/batch",
        {
            "tasks": [
                {"kind": "fetch", "key": "a"},
                {"kind": "fetch", "key": "b"},
                {"kind": "merge", "key": "join", "depends_on": ["a", "b"]},
            ]
        },
    )
    assert response.status_code == 201, response.content
    tasks = response.json()["tasks"]
    assert [task["key"] for task in tasks] == ["a", "b", "join"]
    assert tasks[2]["depends_on_task_ids"] == [tasks[0]["id"], tasks[1]["id"]]
    empty = operator.post(f"runs/{run.pk}/tasks/batch", {"tasks": []})
    assert empty.status_code == 201 and empty.json() == {"tasks": []}


def test_tasks_of_a_run_with_filters(operator, orch):
    run = orch.create_run()
    a = orch.enqueue_task(run_id=run.pk, kind="x", now=at(0))
    b = orch.enqueue_task(run_id=run.pk, kind="y", depends_on=[a.pk], now=at(1))
    orch.enqueue_task(run_id=orch.create_run().pk, kind="x")
    orch.cancel_task(task_id=a.pk)

    def ids(**params):
        response = operator.get(f"runs/{run.pk}/tasks", params)
        assert response.status_code == 200, response.content
        return [row["id"] for row in response.json()["results"]]

    assert ids() == [str(a.pk), str(b.pk)]
    assert ids(kind="y") == [str(b.pk)]
    assert ids(status="cancelled") == [str(a.pk)]
    assert ids(status="queued,leased", kind=["x", "y"]) == [str(b.pk)]
    rows = operator.get(f"runs/{run.pk}/tasks").json()["results"]
    assert rows[1]["depends_on_task_ids"] == [str(a.pk)]
    assert operator.get(f"runs/{uuid.uuid4()}/tasks").status_code == 404


def test_maintenance_expire_leases_and_prune(operator, orch):
    run = orch.create_run()
    task = orch.enqueue_task(run_id=run.pk, kind="k", max_attempts=1)
    orch.claim_next_task(worker_id="w", lease_ms=1_000, now=timezone.now() - timedelta(hours=2))
    response = operator.post("maintenance/expire-leases")
    assert response.status_code == 200
    assert response.json() == {"expired_task_ids": [str(task.pk)], "count": 1}
    assert orch.get_task(task_id=task.pk).dead is True
    assert operator.post("maintenance/expire-leases").json()["count"] == 0

    finished = orch.create_run()
    orch.cancel_run(run_id=finished.pk)
    live = orch.create_run()
    orch.enqueue_task(run_id=live.pk, kind="k")
    keep = operator.post("maintenance/prune", {"older_than_ms": 3_600_000}).json()
    assert keep == {"pruned_run_ids": [], "count": 0}  # nothing that old
    future = (timezone.now() + timedelta(minutes=1)).isoformat()
    pruned = operator.post(
        "maintenance/prune", {"older_than": future, "statuses": ["cancelled"], "limit": 10}
    ).json()
    assert pruned["pruned_run_ids"] == [str(finished.pk)] and pruned["count"] == 1
    assert operator.get(f"runs/{finished.pk}").status_code == 404
    assert operator.get(f"runs/{live.pk}").status_code == 200
    everything = operator.post("maintenance/prune", {"older_than": future}).json()
    assert str(run.pk) in everything["pruned_run_ids"]  # failed (dead-lettered)
    assert str(live.pk) not in everything["pruned_run_ids"]  # not terminal

"""Lifecycle extensions: copy_run."""

from __future__ import annotations

import uuid

import pytest

from parallel_mcp.exceptions import RecordNotFoundError, ValidationError
from parallel_mcp.models import (
    Attempt,
    ContextSnapshot,
    Event,
    Lease,
    Run,
    Task,
    TaskDependency,
)
from tests.conftest import at

pytestmark = pytest.mark.django_db

DEFINITION_FIELDS = (
    "kind",
    "key",
    "priority",
    "max_attempts",
    "retry_delay_ms",
    "retry_backoff",
    "retry_max_delay_ms",
    "timeout_ms",
    "input",
    "metadata",
)


def lease_of(c, worker="w1") -> dict:
    return {"task_id": c.task.id, "lease_id": c.lease.id, "worker_id": worker}


def take(orch, task, worker="w1", now=None):
    c = orch.claim_next_task(worker_id=worker, kinds=[task.kind], now=now or at(1))
    assert c is not None and c.task.id == task.id
    return c


def source_state(run_id) -> dict:
    """Everything of a run, to compare before and after a copy."""
    return {
        "run": Run.objects.filter(pk=run_id).values().get(),
        "tasks": list(Task.objects.filter(run_id=run_id).order_by("id").values()),
        "edges": list(TaskDependency.objects.filter(run_id=run_id).order_by("id").values()),
        "attempts": list(Attempt.objects.filter(run_id=run_id).order_by("id").values()),
        "leases": list(Lease.objects.filter(run_id=run_id).order_by("id").values()),
        "snapshots": list(ContextSnapshot.objects.filter(run_id=run_id).order_by("id").values()),
        "events": list(Event.objects.filter(run_id=run_id).order_by("id").values()),
    }


def edges_by_key(run_id) -> set[tuple[str, str, bool]]:
    return set(
        TaskDependency.objects.filter(run_id=run_id).values_list(
            "task__key", "depends_on__key", "required"
        )
    )


@pytest.fixture
def source(orch):
    """A run part-way through: a diamond (one optional edge) plus a loose task, with
    context snapshots, a completed, a failed and a running task."""
    run = orch.create_run(
        namespace="copy-ns",
        external_id="ext-1",
        metadata={"owner": "ops"},
        context={"v": 1},
        max_parallel=3,
        now=at(0),
    )
    tasks = orch.enqueue_tasks(
        run_id=run.id,
        tasks=[
            {
                "kind": "fetch",
                "key": "a",
                "priority": 5,
                "max_attempts": 3,
                "retry": {"delay_ms": 100, "backoff": "exponential", "max_delay_ms": 5_000},
                "timeout_ms": 60_000,
                "input": {"url": "https://example.invalid"},
                "metadata": {"team": "x"},
            },
            {"kind": "parse", "key": "b", "depends_on": ["a"], "input": [1, 2]},
            {
                "kind": "index",
                "key": "c",
                "depends_on": [{"task_id": "a", "required": False}],
                "priority": -2,
                "retry": {"delay_ms": 7, "backoff": "fixed"},
            },
            {"kind": "merge", "key": "d", "depends_on": ["b", {"task_id": "c", "required": False}]},
            {"kind": "loose", "key": "e", "not_before": at(3600), "input": "s"},
        ],
        now=at(0),
    )
    by_key = {task.key: task for task in tasks}
    c = take(orch, by_key["a"], now=at(1))
    orch.mark_task_running(**lease_of(c), now=at(1))
    orch.complete_task(
        **lease_of(c), output={"ok": 1}, next_context={"v": 2}, next_context_label="a", now=at(2)
    )
    c = take(orch, by_key["c"], now=at(3))
    orch.fail_task(**lease_of(c), error="bad", now=at(3))
    take(orch, by_key["b"], now=at(4))
    orch.append_context_snapshot(run_id=run.id, payload={"v": 3, "latest": True}, now=at(5))
    return run


def test_copy_run_copies_every_task_definition_and_the_graph(orch, source):
    before = source_state(source.id)
    originals = {task.key: task for task in Task.objects.filter(run_id=source.id)}

    copy = orch.copy_run(run_id=source.id, now=at(100))

    assert copy.id != source.id
    assert copy.namespace == "copy-ns"
    assert copy.max_parallel == 3
    copies = {task.key: task for task in Task.objects.filter(run_id=copy.id)}
    assert set(copies) == {"a", "b", "c", "d", "e"}
    assert not set(task.id for task in copies.values()) & {t.id for t in originals.values()}
    for key, original in originals.items():
        duplicate = copies[key]
        for field in DEFINITION_FIELDS:
            assert getattr(duplicate, field) == getattr(original, field), (key, field)
        assert duplicate.status == "queued"
        assert duplicate.attempt_count == 0
        assert duplicate.output is None and duplicate.error is None
        assert duplicate.progress == 0.0
        assert duplicate.dead is False
        assert duplicate.started_at is None and duplicate.completed_at is None
        assert duplicate.lease_id is None
        assert duplicate.created_at == at(100)
    assert (
        edges_by_key(copy.id)
        == edges_by_key(source.id)
        == {
            ("b", "a", True),
            ("c", "a", False),
            ("d", "b", True),
            ("d", "c", False),
        }
    )
    assert set(copies["d"].depends_on_task_ids) == {copies["b"].id, copies["c"].id}
    # No edge crosses runs.
    assert not TaskDependency.objects.filter(run_id=copy.id, depends_on__run_id=source.id).exists()
    # The original is untouched.
    assert source_state(source.id) == before


def test_copy_run_counters_status_and_events(orch, source):
    copy = orch.copy_run(run_id=source.id, now=at(100))

    stored = Run.objects.get(pk=copy.id)
    assert stored.status == "active"
    assert stored.tasks_total == 5
    assert stored.tasks_active == 5
    assert (stored.tasks_waiting, stored.tasks_stuck) == (0, 0)
    assert (stored.tasks_completed, stored.tasks_failed, stored.tasks_cancelled) == (0, 0, 0)
    assert stored.created_at == at(100)
    events = list(Event.objects.filter(run_id=copy.id).order_by("id"))
    assert events[0].event_type == "run.created"
    assert events[0].payload["source_run_id"] == str(source.id)
    assert events[0].payload["max_parallel"] == 3
    types = [event.event_type for event in events]
    assert types.count("task.enqueued") == 5
    assert types.count("context.snapshot.created") == 1
    assert "task.completed" not in types and "task.claimed" not in types


def test_copy_run_context_is_the_sources_current_snapshot(orch, source):
    copy = orch.copy_run(run_id=source.id, now=at(100))

    snapshot = orch.get_current_context_snapshot(run_id=copy.id)
    assert snapshot is not None
    assert snapshot.run_id == copy.id
    assert snapshot.payload == {"v": 3, "latest": True}
    assert snapshot.label == "run.initial"
    assert ContextSnapshot.objects.filter(run_id=copy.id).count() == 1
    # Copied tasks see the copy's context, never a snapshot of the source run.
    for task in Task.objects.filter(run_id=copy.id):
        assert task.context_snapshot_id == snapshot.id


def test_copy_run_of_a_run_without_context_has_none(orch, run):
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    copy = orch.copy_run(run_id=run.id, now=at(1))
    assert orch.get_current_context_snapshot(run_id=copy.id) is None
    assert Task.objects.get(run_id=copy.id).context_snapshot_id is None
    assert Run.objects.get(pk=copy.id).max_parallel is None


def test_copy_run_of_a_keyless_diamond_copies_each_task_once(orch, run):
    a = orch.enqueue_task(run_id=run.id, kind="a", now=at(0))
    b = orch.enqueue_task(run_id=run.id, kind="b", depends_on=[a.id], now=at(0))
    c = orch.enqueue_task(run_id=run.id, kind="c", depends_on=[a.id], now=at(0))
    orch.enqueue_task(run_id=run.id, kind="d", depends_on=[b.id, c.id], now=at(0))

    copy = orch.copy_run(run_id=run.id, now=at(1))

    kinds = sorted(Task.objects.filter(run_id=copy.id).values_list("kind", flat=True))
    assert kinds == ["a", "b", "c", "d"]
    edges = set(
        TaskDependency.objects.filter(run_id=copy.id).values_list("task__kind", "depends_on__kind")
    )
    assert edges == {("b", "a"), ("c", "a"), ("d", "b"), ("d", "c")}
    unmet = dict(Task.objects.filter(run_id=copy.id).values_list("kind", "unmet_dependencies"))
    assert unmet == {"a": 0, "b": 1, "c": 1, "d": 2}


def test_the_copy_runs_through_its_graph_on_its_own(orch, run):
    a = orch.enqueue_task(run_id=run.id, kind="a", now=at(0))
    b = orch.enqueue_task(run_id=run.id, kind="b", depends_on=[a.id], now=at(0))
    orch.enqueue_task(
        run_id=run.id, kind="c", depends_on=[{"task_id": b.id, "required": False}], now=at(0)
    )
    copy = orch.copy_run(run_id=run.id, now=at(1))
    orch.cancel_run(run_id=run.id, now=at(1))  # only the copy's tasks can be claimed now

    c = orch.claim_next_task(worker_id="w", now=at(2))
    assert (c.run.id, c.task.kind) == (copy.id, "a")
    assert orch.claim_next_task(worker_id="w", now=at(2)) is None  # b waits for a
    orch.complete_task(**lease_of(c, "w"), now=at(3))
    c = orch.claim_next_task(worker_id="w", now=at(4))
    assert (c.run.id, c.task.kind) == (copy.id, "b")
    assert orch.claim_next_task(worker_id="w", now=at(4)) is None  # c waits for b
    orch.fail_task(**lease_of(c, "w"), error="x", now=at(5))
    # b failed: the optional dependent c runs anyway.
    c = orch.claim_next_task(worker_id="w", now=at(6))
    assert (c.run.id, c.task.kind) == (copy.id, "c")
    orch.complete_task(**lease_of(c, "w"), now=at(7))
    assert orch.get_run(run_id=copy.id).status == "failed"
    assert orch.get_run(run_id=run.id).status == "cancelled"


def test_copy_run_keeps_claim_order(orch, run):
    orch.enqueue_task(run_id=run.id, kind="k", key="old", now=at(0))
    orch.enqueue_task(run_id=run.id, kind="k", key="newer", now=at(5))
    orch.enqueue_task(run_id=run.id, kind="k", key="urgent", priority=9, now=at(9))
    orch.enqueue_task(run_id=run.id, kind="k", key="newest", now=at(9))
    copy = orch.copy_run(run_id=run.id, now=at(20))
    orch.cancel_run(run_id=run.id, now=at(20))

    order = []
    while (c := orch.claim_next_task(worker_id="w", now=at(21))) is not None:
        assert c.run.id == copy.id
        order.append(c.task.key)
    assert order == ["urgent", "old", "newer", "newest"]


def test_copy_run_of_an_empty_run(orch, run):
    copy = orch.copy_run(run_id=run.id, now=at(1))
    stored = Run.objects.get(pk=copy.id)
    assert stored.status == "pending"
    assert stored.tasks_total == 0
    [created] = Event.objects.filter(run_id=copy.id, event_type="run.created")
    assert created.payload["source_run_id"] == str(run.id)


@pytest.mark.parametrize("how", ["cancel_run", "completed", "failed"])
def test_copy_run_of_a_terminal_run_gives_a_fresh_runnable_run(orch, run, how):
    a = orch.enqueue_task(run_id=run.id, kind="a", max_attempts=2, now=at(0))
    c = take(orch, a, now=at(1))
    if how == "cancel_run":
        orch.cancel_run(run_id=run.id, reason="abort", now=at(2))
    elif how == "completed":
        orch.complete_task(**lease_of(c), now=at(2))
    else:
        orch.fail_task(**lease_of(c), error="boom", now=at(2))
    terminal = orch.get_run(run_id=run.id).status
    before = source_state(run.id)

    copy = orch.copy_run(run_id=run.id, now=at(3))

    assert orch.get_run(run_id=copy.id).status == "active"
    assert orch.get_run(run_id=run.id).status == terminal
    duplicate = Task.objects.get(run_id=copy.id)
    assert (duplicate.status, duplicate.attempt_count, duplicate.max_attempts) == ("queued", 0, 2)
    c = orch.claim_next_task(worker_id="w", now=at(4))
    assert c is not None and c.task.id == duplicate.id
    assert source_state(run.id) == before


def test_copy_run_of_an_unknown_or_malformed_run(orch):
    runs_before = Run.objects.count()
    with pytest.raises(RecordNotFoundError):
        orch.copy_run(run_id=uuid.uuid4(), now=at(1))
    with pytest.raises(ValidationError):
        orch.copy_run(run_id="nope", now=at(1))
    assert Run.objects.count() == runs_before

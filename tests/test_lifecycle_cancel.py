"""Lifecycle extensions: cancel_task."""

from __future__ import annotations

import uuid

import pytest

from parallel_mcp.exceptions import (
    InvalidTransitionError,
    LeaseConflictError,
    RecordNotFoundError,
    ValidationError,
)
from parallel_mcp.models import Attempt, Event, Lease, Run, Task
from tests.conftest import at, live_worker

pytestmark = pytest.mark.django_db


def lease_of(c, worker="w1") -> dict:
    return {"task_id": c.task.id, "lease_id": c.lease.id, "worker_id": worker}


def enqueue(orch, run, kind, **kwargs):
    kwargs.setdefault("now", at(0))
    return orch.enqueue_task(run_id=run.id, kind=kind, **kwargs)


def take(orch, task, worker="w1", now=None, **kwargs):
    c = orch.claim_next_task(worker_id=worker, kinds=[task.kind], now=now or at(1), **kwargs)
    assert c is not None and c.task.id == task.id
    return c


def finish(orch, task, outcome="complete", now=None):
    c = take(orch, task, now=now)
    if outcome == "complete":
        return orch.complete_task(**lease_of(c), output={"done": True}, now=now or at(1))
    return orch.fail_task(**lease_of(c), error="boom", now=now or at(1))


def run_status(orch, run) -> str:
    return orch.get_run(run_id=run.id).status


def task_events(run, task, event_type) -> list[Event]:
    return list(
        Event.objects.filter(run_id=run.id, task_id=task.id, event_type=event_type).order_by("id")
    )


def into_state(orch, task, state):
    """Bring ``task`` (queued) into ``state``; return the claim when one was made."""
    if state == "queued":
        return None
    c = take(orch, task, now=at(1))
    if state == "leased":
        return c
    if state == "running":
        orch.mark_task_running(**lease_of(c), now=at(2))
        return c
    orch.pause_task(**lease_of(c), status=state, reason="parked", now=at(2))
    return c


NON_TERMINAL = ["queued", "leased", "running", "blocked", "waiting_input"]


@pytest.mark.parametrize("state", NON_TERMINAL)
def test_cancel_task_from_every_non_terminal_state(orch, run, state):
    task = enqueue(orch, run, "only")
    c = into_state(orch, task, state)
    assert orch.get_task(task_id=task.id).status == state

    result = orch.cancel_task(task_id=task.id, reason="operator said stop", now=at(5))

    assert result.status == "cancelled"
    stored = orch.get_task(task_id=task.id)
    assert stored.status == "cancelled"
    assert stored.completed_at == at(5)
    assert (stored.lease_id, stored.leased_by, stored.lease_expires_at) == (None, None, None)
    [event] = task_events(run, task, "task.cancelled")
    assert event.payload["reason"] == "operator said stop"
    assert event.payload["from"] == state
    assert event.created_at == at(5)
    if state in ("leased", "running"):
        attempt = Attempt.objects.get(pk=c.lease.id)
        lease = Lease.objects.get(pk=c.lease.id)
        assert attempt.status == "cancelled"
        assert attempt.ended_at == at(5)
        assert attempt.error == "operator said stop"
        assert lease.status == "cancelled"
        assert lease.released_at == at(5)
        assert event.attempt_id == c.lease.id
    # The run's only task is cancelled: the run derives cancelled.
    assert run_status(orch, run) == "cancelled"
    stored_run = Run.objects.get(pk=run.id)
    assert stored_run.tasks_cancelled == 1
    assert stored_run.tasks_active == stored_run.tasks_waiting == stored_run.tasks_stuck == 0


def test_cancel_task_without_reason(orch, run):
    task = enqueue(orch, run, "only")
    orch.cancel_task(task_id=task.id, now=at(2))
    [event] = task_events(run, task, "task.cancelled")
    assert event.payload["reason"] is None
    assert event.payload["from"] == "queued"


FENCED_CALLS = ["heartbeat", "complete", "fail", "report_progress", "release", "pause"]


@pytest.mark.parametrize(
    ("state", "call"),
    [("leased", call) for call in [*FENCED_CALLS, "mark_running"]]
    + [("running", call) for call in FENCED_CALLS],
)
def test_the_worker_holding_the_lease_is_fenced_out(orch, run, state, call):
    task = enqueue(orch, run, "only")
    c = into_state(orch, task, state)
    orch.cancel_task(task_id=task.id, reason="stop", now=at(3))
    ids = lease_of(c)
    calls = {
        "heartbeat": lambda: orch.heartbeat_lease(**ids, lease_ms=30_000, now=at(4)),
        "complete": lambda: orch.complete_task(**ids, output={"x": 1}, now=at(4)),
        "fail": lambda: orch.fail_task(**ids, error="late", now=at(4)),
        "report_progress": lambda: orch.report_progress(**ids, progress=0.5, now=at(4)),
        "release": lambda: orch.release_task(**ids, now=at(4)),
        "pause": lambda: orch.pause_task(**ids, status="blocked", now=at(4)),
        "mark_running": lambda: orch.mark_task_running(**ids, now=at(4)),
    }
    with pytest.raises(LeaseConflictError) as conflict:
        calls[call]()
    assert conflict.value.details["cancelled"] is True  # every door shows it
    stored = orch.get_task(task_id=task.id)
    assert stored.status == "cancelled"
    assert stored.output is None and stored.progress == 0.0
    assert run_status(orch, run) == "cancelled"


def test_a_lease_conflict_says_whether_a_cancellation_caused_it(orch, run):
    task = enqueue(orch, run, "only")
    other = enqueue(orch, run, "other")
    c = take(orch, task)
    with pytest.raises(LeaseConflictError) as conflict:  # the wrong worker: not cancelled
        orch.heartbeat_lease(**lease_of(c, "intruder"), lease_ms=1000, now=at(2))
    assert conflict.value.details["cancelled"] is False
    orch.cancel_task(task_id=task.id, now=at(3))
    orch.retry_task(task_id=task.id, now=at(4))
    again = take(orch, task, "w2", now=at(5))
    # Re-executed and held by another worker: the old lease was still closed by a cancellation.
    with pytest.raises(LeaseConflictError) as conflict:
        orch.complete_task(**lease_of(c), now=at(6))
    assert conflict.value.details["cancelled"] is True
    orch.complete_task(**lease_of(again, "w2"), now=at(6))
    with pytest.raises(LeaseConflictError) as conflict:  # completed meanwhile: not cancelled
        orch.heartbeat_lease(**lease_of(again, "w2"), lease_ms=1000, now=at(7))
    assert conflict.value.details == {
        "task_id": str(task.id),
        "lease_id": str(again.lease.id),
        "status": "completed",
        "cancelled": False,
    }
    held = take(orch, other, now=at(8))
    orch.cancel_run(run_id=run.id, now=at(9))
    with pytest.raises(LeaseConflictError) as conflict:
        orch.heartbeat_lease(**lease_of(held), lease_ms=1000, now=at(10))
    assert conflict.value.details["cancelled"] is True


@pytest.mark.parametrize("terminal", ["completed", "failed", "cancelled"])
def test_cancel_task_of_a_terminal_task_is_refused(orch, run, terminal):
    task = enqueue(orch, run, "only")
    if terminal == "cancelled":
        orch.cancel_task(task_id=task.id, now=at(1))
    else:
        finish(orch, task, "complete" if terminal == "completed" else "fail")
    events_before = Event.objects.filter(run_id=run.id).count()
    status_before = run_status(orch, run)

    with pytest.raises(InvalidTransitionError) as info:
        orch.cancel_task(task_id=task.id, reason="too late", now=at(9))

    assert info.value.details["current"] == terminal
    assert orch.get_task(task_id=task.id).status == terminal
    assert Event.objects.filter(run_id=run.id).count() == events_before
    assert run_status(orch, run) == status_before


def test_cancel_task_of_an_unknown_or_malformed_id(orch, run):
    with pytest.raises(RecordNotFoundError):
        orch.cancel_task(task_id=uuid.uuid4(), now=at(1))
    with pytest.raises(ValidationError):
        orch.cancel_task(task_id="not-a-uuid", now=at(1))


def test_run_whose_other_task_completed_derives_completed(orch, run):
    a = enqueue(orch, run, "a")
    b = enqueue(orch, run, "b")
    finish(orch, a)
    assert run_status(orch, run) == "active"
    orch.cancel_task(task_id=b.id, now=at(3))
    assert run_status(orch, run) == "completed"
    changes = [
        e.payload for e in Event.objects.filter(run_id=run.id, event_type="run.status.changed")
    ]
    assert changes[-1] == {"from": "active", "to": "completed"}


def test_run_with_every_task_cancelled_derives_cancelled(orch, run):
    tasks = [enqueue(orch, run, f"k{i}") for i in range(3)]
    for index, task in enumerate(tasks[:-1]):
        orch.cancel_task(task_id=task.id, now=at(1 + index))
        assert run_status(orch, run) == "active"
    orch.cancel_task(task_id=tasks[-1].id, now=at(5))
    assert run_status(orch, run) == "cancelled"


def test_run_with_a_failed_and_a_cancelled_task_derives_failed(orch, run):
    a = enqueue(orch, run, "a")
    b = enqueue(orch, run, "b")
    finish(orch, a, "fail")
    assert run_status(orch, run) == "active"
    orch.cancel_task(task_id=b.id, now=at(3))
    assert run_status(orch, run) == "failed"


def test_cancelling_the_last_active_task_leaves_a_waiting_run(orch, run):
    a = enqueue(orch, run, "a")
    b = enqueue(orch, run, "b")
    into_state(orch, a, "waiting_input")
    assert run_status(orch, run) == "active"
    orch.cancel_task(task_id=b.id, now=at(3))
    assert run_status(orch, run) == "waiting"


def test_cancel_task_does_not_cancel_the_run(orch, run):
    a = enqueue(orch, run, "a")
    b = enqueue(orch, run, "b")
    orch.cancel_task(task_id=a.id, now=at(1))
    assert not Event.objects.filter(run_id=run.id, event_type="run.cancelled").exists()
    # The rest of the run goes on.
    c = take(orch, b, now=at(2))
    orch.complete_task(**lease_of(c), now=at(3))
    assert run_status(orch, run) == "completed"


def test_required_dependents_become_stuck_optional_ones_ready(orch, run):
    live_worker("optional")
    a = enqueue(orch, run, "a")
    required = enqueue(orch, run, "required", depends_on=[a.id])
    optional = enqueue(orch, run, "optional", depends_on=[{"task_id": a.id, "required": False}])
    grandchild = enqueue(orch, run, "grandchild", depends_on=[required.id])
    assert orch.claim_next_task(worker_id="w", kinds=["optional"], now=at(1)) is None

    orch.cancel_task(task_id=a.id, reason="not needed", now=at(2))

    stored = Run.objects.get(pk=run.id)
    assert stored.tasks_stuck == 2  # required and, through it, grandchild
    assert stored.tasks_active == 1  # optional
    assert stored.tasks_cancelled == 1
    assert stored.status == "active"
    for kind in ("required", "grandchild"):
        assert orch.claim_next_task(worker_id="w", kinds=[kind], now=at(3)) is None
    [blocker] = orch.explain_task(task_id=required.id, now=at(3))
    assert blocker.kind == "dependency_failed"
    assert blocker.task_id == a.id
    assert str(a.id) in blocker.message
    [blocker] = orch.explain_task(task_id=grandchild.id, now=at(3))
    assert blocker.kind == "dependency_failed"
    assert blocker.task_id == required.id
    assert orch.explain_task(task_id=optional.id, now=at(3)) == []

    c = take(orch, optional, now=at(4))
    orch.complete_task(**lease_of(c), now=at(5))
    # Only stuck tasks are left: they can never run, so the run is not active.
    assert run_status(orch, run) == "failed"


def test_cancelling_a_stuck_task_unsticks_nothing_but_keeps_counters_right(orch, run):
    live_worker("c")
    a = enqueue(orch, run, "a")
    b = enqueue(orch, run, "b", depends_on=[a.id])
    c = enqueue(orch, run, "c", depends_on=[{"task_id": b.id, "required": False}])
    keep = enqueue(orch, run, "keep")
    finish(orch, a, "fail", now=at(1))
    stored = Run.objects.get(pk=run.id)
    assert (stored.tasks_stuck, stored.tasks_failed) == (2, 1)  # b, and c through b

    orch.cancel_task(task_id=b.id, now=at(2))

    stored = Run.objects.get(pk=run.id)
    assert (stored.tasks_stuck, stored.tasks_cancelled, stored.tasks_active) == (0, 1, 2)
    # c's optional dependency is now terminal: it can run.
    assert orch.explain_task(task_id=c.id, now=at(3)) == []
    take(orch, c, now=at(3))
    assert keep.status == "queued"


def test_cancel_task_of_a_leased_task_then_the_task_is_not_claimable(orch, run):
    task = enqueue(orch, run, "only")
    enqueue(orch, run, "other")
    take(orch, task, now=at(1))
    orch.cancel_task(task_id=task.id, now=at(2))
    assert orch.claim_next_task(worker_id="w2", kinds=["only"], now=at(3)) is None
    assert Task.objects.get(pk=task.id).attempt_count == 1

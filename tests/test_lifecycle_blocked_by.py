"""Lifecycle extensions: pause_task(status="blocked", blocked_by=[...])."""

from __future__ import annotations

import uuid

import pytest

from parallel_mcp.exceptions import InvalidDependencyError, ValidationError
from parallel_mcp.models import Event, Run, Task
from tests.conftest import at, live_worker

pytestmark = pytest.mark.django_db


class Boom(Exception):
    pass


def lease_of(c, worker="w1") -> dict:
    return {"task_id": c.task.id, "lease_id": c.lease.id, "worker_id": worker}


def enqueue(orch, run, kind, **kwargs):
    kwargs.setdefault("now", at(0))
    return orch.enqueue_task(run_id=run.id, kind=kind, **kwargs)


def take(orch, task, worker="w1", now=None):
    c = orch.claim_next_task(worker_id=worker, kinds=[task.kind], now=now or at(1))
    assert c is not None and c.task.id == task.id
    return c


def complete(orch, task, now):
    c = take(orch, task, worker="wb", now=now)
    return orch.complete_task(**lease_of(c, "wb"), now=now)


def fail(orch, task, now):
    c = take(orch, task, worker="wb", now=now)
    return orch.fail_task(**lease_of(c, "wb"), error="boom", now=now)


def status(task) -> str:
    return Task.objects.get(pk=task.id).status


def can_claim(orch, task, now) -> bool:
    c = orch.claim_next_task(worker_id="probe", kinds=[task.kind], now=now)
    if c is None:
        return False
    assert c.task.id == task.id
    orch.release_task(**lease_of(c, "probe"), now=now)
    return True


def resumed_events(task) -> list[Event]:
    return list(Event.objects.filter(task_id=task.id, event_type="task.resumed").order_by("id"))


@pytest.fixture
def parked(orch, run):
    """``waiter`` paused with blocked_by the two queued tasks ``x`` and ``y``."""
    x = enqueue(orch, run, "x")
    y = enqueue(orch, run, "y")
    waiter = enqueue(orch, run, "waiter")
    c = take(orch, waiter, now=at(1))
    orch.pause_task(
        **lease_of(c),
        status="blocked",
        reason="needs x and y",
        blocked_by=[x.id, str(y.id)],
        now=at(2),
    )
    return x, y, waiter


def test_pause_with_blocked_by_records_the_blockers(orch, run, parked):
    x, y, waiter = parked
    assert status(waiter) == "blocked"
    [event] = Event.objects.filter(task_id=waiter.id, event_type="task.blocked")
    assert event.payload["blocked_by"] == [str(x.id), str(y.id)]
    assert event.payload["reason"] == "needs x and y"
    blockers = orch.explain_task(task_id=waiter.id, now=at(3))
    assert [(b.kind, b.task_id) for b in blockers] == [("paused", x.id), ("paused", y.id)]
    assert str(x.id) in blockers[0].message
    stored = Run.objects.get(pk=run.id)
    assert (stored.tasks_waiting, stored.tasks_active) == (1, 2)


def test_the_task_is_unblocked_with_the_last_blocker_not_before(orch, run, parked):
    x, y, waiter = parked
    live_worker("waiter")
    complete(orch, x, now=at(3))
    assert status(waiter) == "blocked"
    assert resumed_events(waiter) == []
    assert not can_claim(orch, waiter, at(4))
    [blocker] = orch.explain_task(task_id=waiter.id, now=at(4))
    assert (blocker.kind, blocker.task_id) == ("paused", y.id)

    complete(orch, y, now=at(5))

    assert status(waiter) == "queued"
    [event] = resumed_events(waiter)
    assert event.payload["unblocked_by"] == str(y.id)
    assert event.payload["from"] == "blocked"
    assert event.created_at == at(5)
    # Written by the very transaction that completed y: right after y's completion.
    completed = Event.objects.get(task_id=y.id, event_type="task.completed")
    between = Event.objects.filter(run_id=run.id, id__gt=completed.id, id__lt=event.id)
    assert not between.exclude(event_type="run.status.changed").exists()
    assert orch.explain_task(task_id=waiter.id, now=at(6)) == []
    stored = Run.objects.get(pk=run.id)
    assert (stored.tasks_waiting, stored.tasks_active, stored.status) == (0, 1, "active")
    c = take(orch, waiter, now=at(6))
    orch.complete_task(**lease_of(c), now=at(7))
    assert orch.get_run(run_id=run.id).status == "completed"


def test_unblocking_rolls_back_with_the_completion(orch, run, parked):
    x, y, waiter = parked
    complete(orch, x, now=at(3))
    c = take(orch, y, worker="wb", now=at(4))
    with pytest.raises(Boom), orch.transaction():
        orch.complete_task(**lease_of(c, "wb"), now=at(5))
        assert status(waiter) == "queued"  # inside the same transaction already
        raise Boom
    assert status(waiter) == "blocked"
    assert status(y) == "leased"
    assert resumed_events(waiter) == []


@pytest.mark.parametrize("outcome", ["failed", "cancelled"])
def test_a_failed_or_cancelled_blocker_leaves_the_task_blocked(orch, run, parked, outcome):
    x, y, waiter = parked
    complete(orch, x, now=at(3))
    if outcome == "failed":
        fail(orch, y, now=at(4))
    else:
        orch.cancel_task(task_id=y.id, now=at(4))

    assert status(waiter) == "blocked"
    [blocker] = orch.explain_task(task_id=waiter.id, now=at(5))
    assert blocker.kind == "paused"
    assert blocker.task_id == y.id
    assert str(y.id) in blocker.message
    assert outcome in blocker.message
    stored = Run.objects.get(pk=run.id)
    assert stored.status == "waiting"

    # Re-executing the blocker and completing it releases the waiter.
    orch.retry_task(task_id=y.id, now=at(6))
    assert status(waiter) == "blocked"
    complete(orch, y, now=at(7))
    assert status(waiter) == "queued"
    assert resumed_events(waiter)[-1].payload["unblocked_by"] == str(y.id)


def test_blockers_already_completed_queue_the_task_at_once(orch, run):
    x = enqueue(orch, run, "x")
    waiter = enqueue(orch, run, "waiter")
    complete(orch, x, now=at(1))
    c = take(orch, waiter, now=at(2))

    task = orch.pause_task(**lease_of(c), status="blocked", blocked_by=[x.id], now=at(3))

    assert task.status == "queued"
    assert status(waiter) == "queued"
    assert [e.event_type for e in Event.objects.filter(task_id=waiter.id).order_by("id")][-2:] == [
        "task.blocked",
        "task.resumed",
    ]
    stored = Run.objects.get(pk=run.id)
    assert (stored.tasks_waiting, stored.tasks_active, stored.status) == (0, 1, "active")
    assert can_claim(orch, waiter, at(4))


def test_blocked_by_with_waiting_input_is_refused(orch, run):
    x = enqueue(orch, run, "x")
    waiter = enqueue(orch, run, "waiter")
    c = take(orch, waiter, now=at(1))
    with pytest.raises(ValidationError):
        orch.pause_task(**lease_of(c), status="waiting_input", blocked_by=[x.id], now=at(2))
    assert status(waiter) == "leased"


@pytest.mark.parametrize("case", ["unknown", "foreign", "self", "duplicate", "malformed"])
def test_bad_blockers_are_refused_and_nothing_is_written(orch, run, case):
    x = enqueue(orch, run, "x")
    waiter = enqueue(orch, run, "waiter")
    other_run = orch.create_run(now=at(0))
    foreign = orch.enqueue_task(run_id=other_run.id, kind="f", now=at(0))
    c = take(orch, waiter, now=at(1))
    blocked_by = {
        "unknown": [x.id, uuid.uuid4()],
        "foreign": [foreign.id],
        "self": [x.id, waiter.id],
        "duplicate": [x.id, str(x.id)],
        "malformed": ["not-a-task"],
    }[case]
    events_before = Event.objects.count()

    with pytest.raises(InvalidDependencyError):
        orch.pause_task(**lease_of(c), status="blocked", blocked_by=blocked_by, now=at(2))

    assert status(waiter) == "leased"
    assert Event.objects.count() == events_before
    # The lease is still good.
    orch.complete_task(**lease_of(c), now=at(3))


def test_resume_task_overrides_the_blockers(orch, run, parked):
    x, y, waiter = parked
    orch.resume_task(task_id=waiter.id, now=at(3))
    assert status(waiter) == "queued"
    c = take(orch, waiter, now=at(4))
    orch.complete_task(**lease_of(c), now=at(5))
    # The blockers completing later do nothing to it.
    complete(orch, x, now=at(6))
    complete(orch, y, now=at(7))
    assert status(waiter) == "completed"
    assert len(resumed_events(waiter)) == 1
    assert orch.get_run(run_id=run.id).status == "completed"


def test_a_later_plain_pause_is_not_ended_by_the_old_blockers(orch, run, parked):
    x, y, waiter = parked
    orch.resume_task(task_id=waiter.id, now=at(3))
    c = take(orch, waiter, now=at(4))
    orch.pause_task(**lease_of(c), status="blocked", reason="manual hold", now=at(5))

    complete(orch, x, now=at(6))
    complete(orch, y, now=at(7))

    assert status(waiter) == "blocked"
    [blocker] = orch.explain_task(task_id=waiter.id, now=at(8))
    assert blocker.kind == "paused" and "manual hold" in blocker.message
    assert len(resumed_events(waiter)) == 1  # only the resume_task


def test_a_new_pause_with_other_blockers_forgets_the_old_ones(orch, run, parked):
    x, y, waiter = parked
    z = enqueue(orch, run, "z")
    orch.resume_task(task_id=waiter.id, now=at(3))
    c = take(orch, waiter, now=at(4))
    orch.pause_task(**lease_of(c), status="blocked", blocked_by=[z.id], now=at(5))
    complete(orch, x, now=at(6))
    complete(orch, y, now=at(7))
    assert status(waiter) == "blocked"
    complete(orch, z, now=at(8))
    assert status(waiter) == "queued"


def test_cancelling_a_blocked_task_is_final_even_when_its_blockers_complete(orch, run, parked):
    x, y, waiter = parked
    orch.cancel_task(task_id=waiter.id, reason="no longer needed", now=at(3))
    complete(orch, x, now=at(4))
    complete(orch, y, now=at(5))
    assert status(waiter) == "cancelled"
    assert resumed_events(waiter) == []
    assert orch.get_run(run_id=run.id).status == "completed"


def test_one_blocker_releases_several_waiters(orch, run):
    x = enqueue(orch, run, "x")
    waiters = [enqueue(orch, run, f"w{i}") for i in range(3)]
    for index, waiter in enumerate(waiters):
        c = take(orch, waiter, now=at(1 + index))
        orch.pause_task(**lease_of(c), status="blocked", blocked_by=[x.id], now=at(1 + index))
    assert Run.objects.get(pk=run.id).tasks_waiting == 3
    complete(orch, x, now=at(10))
    assert {status(waiter) for waiter in waiters} == {"queued"}
    assert Run.objects.get(pk=run.id).tasks_waiting == 0


def test_a_re_executed_blocker_does_not_count_twice(orch, run, parked):
    x, _y, waiter = parked
    complete(orch, x, now=at(3))
    orch.retry_task(task_id=x.id, now=at(4))
    complete(orch, x, now=at(5))
    # y has never completed: the waiter must still be blocked.
    assert status(waiter) == "blocked"


def test_a_blocker_re_executed_before_the_last_one_completes_still_counts(orch, run, parked):
    x, y, waiter = parked
    complete(orch, x, now=at(3))
    orch.retry_task(task_id=x.id, now=at(4))  # x is queued again: not complete
    complete(orch, y, now=at(5))
    assert status(waiter) == "blocked"


@pytest.mark.django_db(transaction=True)  # foreign keys are checked at commit
def test_prune_runs_removes_a_run_whose_task_was_blocked_by_others():
    from parallel_mcp import Orchestrator
    from parallel_mcp.models import TaskBlocker

    orch = Orchestrator()
    run = orch.create_run(now=at(0))
    x = enqueue(orch, run, "x")
    waiter = enqueue(orch, run, "waiter")
    c = take(orch, waiter, now=at(1))
    orch.pause_task(**lease_of(c), status="blocked", blocked_by=[x.id], now=at(2))
    orch.cancel_run(run_id=run.id, now=at(3))
    assert orch.get_run(run_id=run.id).status == "cancelled"

    result = orch.prune_runs(older_than=at(10), now=at(20))

    assert result.pruned_run_ids == [run.id]
    assert not Run.objects.filter(pk=run.id).exists()
    assert not Task.objects.filter(run_id=run.id).exists()
    assert not TaskBlocker.objects.filter(run_id=run.id).exists()


def test_too_many_blockers_are_refused_before_anything_is_read(orch, run, monkeypatch):
    from parallel_mcp.contract import limits

    monkeypatch.setattr(limits, "MAX_DEPENDENCIES", 2)
    blockers = [enqueue(orch, run, "x").id for _ in range(3)]
    waiter = enqueue(orch, run, "waiter")
    c = take(orch, waiter, now=at(1))
    events_before = Event.objects.count()

    with pytest.raises(ValidationError, match="more than 2 entries") as raised:
        orch.pause_task(**lease_of(c), status="blocked", blocked_by=blockers, now=at(2))

    assert raised.value.details["field"] == "blocked_by"
    assert status(waiter) == "leased"
    assert Event.objects.count() == events_before
    orch.pause_task(**lease_of(c), status="blocked", blocked_by=blockers[:2], now=at(3))
    assert status(waiter) == "blocked"

"""Lifecycle extensions: retry_task (re-execution, with and without cascade)."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest

from parallel_mcp.exceptions import (
    InvalidTransitionError,
    LeaseConflictError,
    RecordNotFoundError,
    RunTerminalError,
    ValidationError,
)
from parallel_mcp.models import Attempt, Event, Run, Task
from tests.conftest import at, live_worker

pytestmark = pytest.mark.django_db


def lease_of(c, worker="w1") -> dict:
    return {"task_id": c.task.id, "lease_id": c.lease.id, "worker_id": worker}


def enqueue(orch, run, kind, **kwargs):
    kwargs.setdefault("now", at(0))
    return orch.enqueue_task(run_id=run.id, kind=kind, **kwargs)


def take(orch, task, worker="w1", now=None):
    c = orch.claim_next_task(worker_id=worker, kinds=[task.kind], now=now or at(1))
    assert c is not None and c.task.id == task.id
    return c


def claimable(orch, task, now) -> bool:
    """Whether a claim for this task's kind would take it (then released again)."""
    c = orch.claim_next_task(worker_id="probe", kinds=[task.kind], now=now)
    if c is None:
        return False
    assert c.task.id == task.id
    orch.release_task(**lease_of(c, "probe"), now=now)
    return True


def complete(orch, task, now=None, output=None):
    now = now or at(1)
    c = take(orch, task, now=now)
    orch.mark_task_running(**lease_of(c), now=now)
    orch.report_progress(**lease_of(c), progress=0.5, message="half", now=now)
    return orch.complete_task(**lease_of(c), output=output or {"kind": task.kind}, now=now)


def fail(orch, task, now=None):
    now = now or at(1)
    c = take(orch, task, now=now)
    orch.mark_task_running(**lease_of(c), now=now)
    return orch.fail_task(**lease_of(c), error="boom", now=now)


def run_status(orch, run) -> str:
    return orch.get_run(run_id=run.id).status


def requeued_per_task(run) -> Counter:
    return Counter(
        Event.objects.filter(run_id=run.id, event_type="task.requeued").values_list(
            "task_id", flat=True
        )
    )


def diamond(orch, run):
    a = enqueue(orch, run, "a", key="a")
    b = enqueue(orch, run, "b", key="b", depends_on=[a.id])
    c = enqueue(orch, run, "c", key="c", depends_on=[a.id])
    d = enqueue(orch, run, "d", key="d", depends_on=[b.id, c.id])
    return a, b, c, d


# -- single task ------------------------------------------------------------------------------


@pytest.mark.parametrize("terminal", ["completed", "failed", "dead", "cancelled"])
def test_retry_task_requeues_a_finished_task_clearing_its_results(orch, run, terminal):
    task = enqueue(orch, run, "only", max_attempts=1)
    c = take(orch, task, now=at(1))
    orch.mark_task_running(**lease_of(c), now=at(2))
    orch.report_progress(**lease_of(c), progress=0.4, message="going", now=at(3))
    if terminal == "completed":
        orch.complete_task(**lease_of(c), output={"v": 1}, now=at(4))
    elif terminal == "failed":
        orch.fail_task(**lease_of(c), error="boom", now=at(4))
    elif terminal == "dead":
        orch.fail_task(**lease_of(c), error="boom", retry=True, now=at(4))
    else:
        orch.cancel_task(task_id=task.id, reason="stop", now=at(4))
    before = Task.objects.get(pk=task.id)
    assert before.completed_at == at(4) and before.started_at == at(2)
    assert before.dead is (terminal == "dead")
    attempts_before = Attempt.objects.filter(task_id=task.id).count()
    events_before = list(Event.objects.filter(run_id=run.id).values_list("id", "event_type"))
    assert run_status(orch, run) != "active"

    result = orch.retry_task(task_id=task.id, reason="try again", now=at(10))

    assert result.status == "queued"
    stored = Task.objects.get(pk=task.id)
    assert stored.status == "queued"
    assert stored.output is None
    assert stored.error is None
    assert stored.progress == 0.0
    assert stored.started_at is None
    assert stored.completed_at is None
    assert stored.dead is False
    assert stored.attempt_count == 0
    assert stored.not_before is None
    assert (stored.lease_id, stored.leased_by, stored.lease_expires_at) == (None, None, None)
    assert orch.list_dead_tasks(run_id=run.id) == []
    # History is kept.
    assert Attempt.objects.filter(task_id=task.id).count() == attempts_before == 1
    after = list(Event.objects.filter(run_id=run.id).values_list("id", "event_type"))
    assert after[: len(events_before)] == events_before
    [requeued] = Event.objects.filter(task_id=task.id, event_type="task.requeued")
    expected_from = "failed" if terminal == "dead" else terminal
    assert requeued.payload["reason"] == "try again"
    assert requeued.payload["from"] == expected_from
    assert requeued.created_at == at(10)
    assert run_status(orch, run) == "active"
    # It runs again, with its attempts counted afresh.
    again = take(orch, task, now=at(11))
    assert again.task.attempt_count == 1
    assert again.lease.id != c.lease.id
    orch.complete_task(**lease_of(again), output={"v": 2}, now=at(12))
    assert run_status(orch, run) == "completed"


@pytest.mark.parametrize("state", ["queued", "leased", "running", "blocked", "waiting_input"])
def test_retry_task_of_a_non_terminal_task_is_refused(orch, run, state):
    task = enqueue(orch, run, "only")
    if state != "queued":
        c = take(orch, task, now=at(1))
        if state == "running":
            orch.mark_task_running(**lease_of(c), now=at(2))
        elif state in ("blocked", "waiting_input"):
            orch.pause_task(**lease_of(c), status=state, now=at(2))
    events_before = Event.objects.filter(run_id=run.id).count()

    with pytest.raises(InvalidTransitionError) as info:
        orch.retry_task(task_id=task.id, now=at(5))

    assert info.value.details["current"] == state
    assert Task.objects.get(pk=task.id).status == state
    assert Event.objects.filter(run_id=run.id).count() == events_before


def test_retry_task_in_a_cancelled_run_is_refused(orch, run):
    a = enqueue(orch, run, "a")
    enqueue(orch, run, "b")
    complete(orch, a, now=at(1))
    orch.cancel_run(run_id=run.id, reason="abort", now=at(2))
    events_before = Event.objects.filter(run_id=run.id).count()

    for task_id in (a.id, *Task.objects.filter(run_id=run.id).values_list("id", flat=True)):
        with pytest.raises(RunTerminalError):
            orch.retry_task(task_id=task_id, now=at(3))

    assert Task.objects.get(pk=a.id).status == "completed"
    assert Event.objects.filter(run_id=run.id).count() == events_before
    assert run_status(orch, run) == "cancelled"


def test_retry_task_arguments(orch, run):
    task = enqueue(orch, run, "only")
    complete(orch, task)
    with pytest.raises(RecordNotFoundError):
        orch.retry_task(task_id=uuid.uuid4(), now=at(2))
    with pytest.raises(ValidationError):
        orch.retry_task(task_id="nope", now=at(2))
    with pytest.raises(ValidationError):
        orch.retry_task(task_id=task.id, cascade="yes", now=at(2))
    assert Task.objects.get(pk=task.id).status == "completed"


def test_the_lease_of_a_cancelled_then_retried_task_stays_dead(orch, run):
    task = enqueue(orch, run, "only")
    old = take(orch, task, now=at(1))
    orch.cancel_task(task_id=task.id, now=at(2))
    orch.retry_task(task_id=task.id, now=at(3))
    with pytest.raises(LeaseConflictError):
        orch.complete_task(**lease_of(old), now=at(4))
    with pytest.raises(LeaseConflictError):
        orch.heartbeat_lease(**lease_of(old), now=at(4))
    new = take(orch, task, worker="w2", now=at(5))
    with pytest.raises(LeaseConflictError):
        orch.complete_task(**lease_of(old), now=at(6))
    orch.complete_task(**lease_of(new, "w2"), now=at(6))
    assert Task.objects.get(pk=task.id).status == "completed"


# -- cascade ----------------------------------------------------------------------------------


def test_cascade_over_a_diamond_resets_each_task_once(orch, run):
    a, b, c, d = diamond(orch, run)
    for step, task in enumerate((a, b, c, d)):
        complete(orch, task, now=at(1 + step))
    assert run_status(orch, run) == "completed"

    orch.retry_task(task_id=a.id, reason="redo", now=at(10))

    statuses = dict(Task.objects.filter(run_id=run.id).values_list("key", "status"))
    assert statuses == {"a": "queued", "b": "queued", "c": "queued", "d": "queued"}
    assert requeued_per_task(run) == {a.id: 1, b.id: 1, c.id: 1, d.id: 1}
    events = Event.objects.filter(run_id=run.id, event_type="task.requeued").order_by("id")
    by_task = {event.task_id: event for event in events}
    assert by_task[a.id].payload["cascade_from"] is None
    for task in (b, c, d):
        assert by_task[task.id].payload["cascade_from"] == str(a.id)
        assert by_task[task.id].payload["reason"] == "redo"
    # Upstream first in the event log.
    order = [event.task_id for event in events]
    assert order.index(a.id) < order.index(b.id) < order.index(d.id)
    assert order.index(c.id) < order.index(d.id)
    for task in (b, c, d):
        stored = Task.objects.get(pk=task.id)
        assert stored.output is None and stored.progress == 0.0 and stored.completed_at is None
    stored_run = Run.objects.get(pk=run.id)
    assert stored_run.status == "active"
    assert (stored_run.tasks_active, stored_run.tasks_completed) == (4, 0)
    changes = [
        e.payload for e in Event.objects.filter(run_id=run.id, event_type="run.status.changed")
    ]
    assert changes[-1] == {"from": "completed", "to": "active"}

    # The graph runs again in dependency order.
    assert not claimable(orch, b, at(11)) and not claimable(orch, d, at(11))
    complete(orch, a, now=at(12))
    complete(orch, b, now=at(13))
    assert not claimable(orch, d, at(14))
    complete(orch, c, now=at(14))
    complete(orch, d, now=at(15))
    assert run_status(orch, run) == "completed"


def test_cascade_from_the_middle_leaves_upstream_alone(orch, run):
    a, b, c, d = diamond(orch, run)
    for step, task in enumerate((a, b, c, d)):
        complete(orch, task, now=at(1 + step))

    orch.retry_task(task_id=b.id, now=at(10))

    statuses = dict(Task.objects.filter(run_id=run.id).values_list("key", "status"))
    assert statuses == {"a": "completed", "b": "queued", "c": "completed", "d": "queued"}
    assert requeued_per_task(run) == {b.id: 1, d.id: 1}
    assert claimable(orch, b, at(11))
    assert not claimable(orch, d, at(11))


def test_cascade_over_a_long_chain(orch, run):
    chain = [enqueue(orch, run, "step0", key="0")]
    for index in range(1, 50):
        chain.append(enqueue(orch, run, f"step{index}", key=str(index), depends_on=[chain[-1].id]))
    for index, task in enumerate(chain):
        complete(orch, task, now=at(1 + index))
    assert run_status(orch, run) == "completed"

    orch.retry_task(task_id=chain[0].id, now=at(100))

    assert set(Task.objects.filter(run_id=run.id).values_list("status", flat=True)) == {"queued"}
    assert requeued_per_task(run) == {task.id: 1 for task in chain}
    assert Run.objects.get(pk=run.id).tasks_active == 50
    pending = orch.list_pending_tasks(run_id=run.id, ready_by=at(101), limit=100)
    assert [task.id for task in pending] == [chain[0].id]
    # And it can run to the end again.
    for index, task in enumerate(chain):
        complete(orch, task, now=at(101 + index))
    assert run_status(orch, run) == "completed"


def test_cascade_skips_non_terminal_dependents_but_goes_past_them(orch, run):
    a = enqueue(orch, run, "a")
    b = enqueue(orch, run, "b", depends_on=[a.id])
    c = enqueue(orch, run, "c", depends_on=[b.id])
    complete(orch, a, now=at(1))
    fail(orch, b, now=at(2))
    assert Task.objects.get(pk=c.id).status == "queued"  # stuck behind b
    assert Run.objects.get(pk=run.id).tasks_stuck == 1
    assert run_status(orch, run) == "failed"

    orch.retry_task(task_id=a.id, now=at(3))

    assert requeued_per_task(run) == {a.id: 1, b.id: 1}
    stored_run = Run.objects.get(pk=run.id)
    assert (stored_run.tasks_stuck, stored_run.tasks_active, stored_run.tasks_failed) == (0, 3, 0)
    assert stored_run.status == "active"
    complete(orch, a, now=at(4))
    complete(orch, b, now=at(5))
    complete(orch, c, now=at(6))
    assert run_status(orch, run) == "completed"


def test_cascade_false_resets_only_the_task(orch, run):
    a, b, c, d = diamond(orch, run)
    for step, task in enumerate((a, b, c, d)):
        complete(orch, task, now=at(1 + step))

    orch.retry_task(task_id=b.id, cascade=False, now=at(10))

    statuses = dict(Task.objects.filter(run_id=run.id).values_list("key", "status"))
    assert statuses == {"a": "completed", "b": "queued", "c": "completed", "d": "completed"}
    assert requeued_per_task(run) == {b.id: 1}
    assert Task.objects.get(pk=d.id).output == {"kind": "d"}
    # d is completed, but its dependency b is not: d waits again.
    assert Task.objects.get(pk=d.id).unmet_dependencies == 1
    assert run_status(orch, run) == "active"

    orch.retry_task(task_id=d.id, cascade=False, now=at(11))
    assert not claimable(orch, d, at(12))
    [blocker] = orch.explain_task(task_id=d.id, now=at(12))
    assert blocker.kind == "dependency_pending"
    assert blocker.task_id == b.id
    complete(orch, b, now=at(13))
    assert claimable(orch, d, at(14))
    complete(orch, d, now=at(15))
    assert run_status(orch, run) == "completed"


def test_cascade_false_of_an_upstream_task_then_completing_it_again(orch, run):
    a = enqueue(orch, run, "a")
    b = enqueue(orch, run, "b", depends_on=[a.id])
    complete(orch, a, now=at(1))
    complete(orch, b, now=at(2))
    orch.retry_task(task_id=a.id, cascade=False, now=at(3))
    assert Task.objects.get(pk=b.id).unmet_dependencies == 1
    complete(orch, a, now=at(4))
    assert Task.objects.get(pk=b.id).unmet_dependencies == 0
    assert Task.objects.get(pk=b.id).status == "completed"
    assert run_status(orch, run) == "completed"


# -- run status and stuck dependents ----------------------------------------------------------


def test_retry_task_moves_a_failed_run_back_to_active(orch, run):
    a = enqueue(orch, run, "a")
    fail(orch, a, now=at(1))
    assert run_status(orch, run) == "failed"

    orch.retry_task(task_id=a.id, now=at(2))

    assert run_status(orch, run) == "active"
    changes = [
        e.payload for e in Event.objects.filter(run_id=run.id, event_type="run.status.changed")
    ]
    assert changes[-1] == {"from": "failed", "to": "active"}
    complete(orch, a, now=at(3))
    assert run_status(orch, run) == "completed"


@pytest.mark.parametrize("cascade", [True, False])
@pytest.mark.parametrize("how", ["failed", "cancelled"])
def test_dependents_stuck_behind_a_task_run_after_it_is_retried(orch, run, how, cascade):
    live_worker("b")
    a = enqueue(orch, run, "a")
    b = enqueue(orch, run, "b", depends_on=[a.id])
    c = enqueue(orch, run, "c", depends_on=[b.id])
    if how == "failed":
        fail(orch, a, now=at(1))
    else:
        orch.cancel_task(task_id=a.id, now=at(1))
    stored = Run.objects.get(pk=run.id)
    assert stored.tasks_stuck == 2
    assert stored.status == "failed"
    assert orch.explain_task(task_id=b.id, now=at(2))[0].kind == "dependency_failed"

    orch.retry_task(task_id=a.id, cascade=cascade, now=at(3))

    stored = Run.objects.get(pk=run.id)
    assert (stored.tasks_stuck, stored.tasks_active) == (0, 3)
    assert stored.status == "active"
    [blocker] = orch.explain_task(task_id=b.id, now=at(4))
    assert blocker.kind == "dependency_pending"
    complete(orch, a, now=at(5))
    assert orch.explain_task(task_id=b.id, now=at(6)) == []
    complete(orch, b, now=at(6))
    complete(orch, c, now=at(7))
    assert run_status(orch, run) == "completed"


def test_retrying_a_cancelled_task_whose_dependency_failed_leaves_it_stuck(orch, run):
    a = enqueue(orch, run, "a")
    b = enqueue(orch, run, "b", depends_on=[a.id])
    keep = enqueue(orch, run, "keep")
    fail(orch, a, now=at(1))
    orch.cancel_task(task_id=b.id, now=at(2))
    assert Run.objects.get(pk=run.id).tasks_stuck == 0

    orch.retry_task(task_id=b.id, cascade=False, now=at(3))

    stored = Run.objects.get(pk=run.id)
    assert Task.objects.get(pk=b.id).status == "queued"
    assert (stored.tasks_stuck, stored.tasks_active, stored.tasks_failed) == (1, 1, 1)
    [blocker] = orch.explain_task(task_id=b.id, now=at(4))
    assert blocker.kind == "dependency_failed" and blocker.task_id == a.id
    complete(orch, keep, now=at(5))
    assert run_status(orch, run) == "failed"


def test_cascade_over_a_diamond_with_failed_branches(orch, run):
    a, b, c, d = diamond(orch, run)
    complete(orch, a, now=at(1))
    fail(orch, b, now=at(2))
    fail(orch, c, now=at(3))
    stored = Run.objects.get(pk=run.id)
    assert (stored.tasks_failed, stored.tasks_stuck, stored.status) == (2, 1, "failed")

    orch.retry_task(task_id=a.id, now=at(4))

    assert requeued_per_task(run) == {a.id: 1, b.id: 1, c.id: 1}  # d was never finished
    stored = Run.objects.get(pk=run.id)
    assert (stored.tasks_active, stored.tasks_stuck, stored.tasks_failed) == (4, 0, 0)
    assert stored.status == "active"
    unmet = dict(Task.objects.filter(run_id=run.id).values_list("key", "unmet_dependencies"))
    assert unmet == {"a": 0, "b": 1, "c": 1, "d": 2}
    for step, task in enumerate((a, b, c, d)):
        complete(orch, task, now=at(5 + step))
    assert run_status(orch, run) == "completed"


def test_retrying_one_failed_branch_of_a_diamond_keeps_the_join_stuck(orch, run):
    a, b, c, d = diamond(orch, run)
    complete(orch, a, now=at(1))
    fail(orch, b, now=at(2))
    fail(orch, c, now=at(3))

    orch.retry_task(task_id=b.id, now=at(4))

    stored = Run.objects.get(pk=run.id)
    assert (stored.tasks_active, stored.tasks_stuck, stored.tasks_failed) == (1, 1, 1)
    blockers = orch.explain_task(task_id=d.id, now=at(5))
    assert {(blocker.kind, blocker.task_id) for blocker in blockers} == {
        ("dependency_pending", b.id),
        ("dependency_failed", c.id),
    }
    complete(orch, b, now=at(6))
    assert run_status(orch, run) == "failed"
    orch.retry_task(task_id=c.id, now=at(7))
    assert Run.objects.get(pk=run.id).tasks_stuck == 0
    complete(orch, c, now=at(8))
    complete(orch, d, now=at(9))
    assert run_status(orch, run) == "completed"


@pytest.mark.parametrize("back", ["release", "fail_with_retry", "lease_expiry"])
def test_a_dependent_leased_while_its_dependency_is_re_executed_and_fails_is_stuck_when_queued(
    orch, run, back
):
    """b was leased while a was completed; a is then re-executed and fails. While b holds its
    lease it still counts as active; once it is back in the queue it can never run, so it and
    its own dependent count as stuck and the run derives failed."""
    a = enqueue(orch, run, "a")
    b = enqueue(orch, run, "b", depends_on=[a.id], max_attempts=3)
    c = enqueue(orch, run, "c", depends_on=[b.id])
    complete(orch, a, now=at(1))
    leased = take(orch, b, now=at(2))
    orch.retry_task(task_id=a.id, cascade=True, now=at(3))  # b is leased: not reset
    fail(orch, a, now=at(4))
    stored = Run.objects.get(pk=run.id)
    assert (stored.tasks_active, stored.tasks_stuck, stored.tasks_failed) == (2, 0, 1)

    if back == "release":
        orch.release_task(**lease_of(leased), now=at(5))
    elif back == "fail_with_retry":
        orch.fail_task(**lease_of(leased), error="boom", retry=True, now=at(5))
    else:
        assert orch.expire_leases(now=at(10_000)).expired_task_ids == [b.id]

    assert Task.objects.get(pk=b.id).status == "queued"
    stored = Run.objects.get(pk=run.id)
    assert (stored.tasks_active, stored.tasks_stuck, stored.tasks_failed) == (0, 2, 1)
    assert stored.status == "failed"
    assert Task.objects.get(pk=c.id).failed_dependencies == 1
    [blocker] = orch.explain_task(task_id=c.id, now=at(10_001))
    assert blocker.kind == "dependency_failed" and blocker.task_id == b.id

    orch.retry_task(task_id=a.id, cascade=False, now=at(10_002))  # a can run again: so can b
    stored = Run.objects.get(pk=run.id)
    assert (stored.tasks_active, stored.tasks_stuck, stored.status) == (3, 0, "active")
    complete(orch, a, now=at(10_003))
    complete(orch, b, now=at(10_004))
    complete(orch, c, now=at(10_005))
    assert run_status(orch, run) == "completed"

"""Lease expiry, retries with backoff, the dead-letter queue and requeueing from it."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from parallel_mcp.exceptions import InvalidTransitionError, RunTerminalError, ValidationError
from parallel_mcp.models import Attempt, ContextSnapshot, Event, Lease, Run, Task
from tests.conftest import at, claim, event_types

pytestmark = pytest.mark.django_db


def row_counts() -> dict[str, int]:
    return {
        m.__name__: m.objects.count() for m in (Run, Task, Attempt, Lease, ContextSnapshot, Event)
    }


def new_events(orch, run_id, before: int) -> list[str]:
    return event_types(orch, run_id)[before:]


def lease_of(c, worker="w1") -> dict:
    return {"task_id": c.task.id, "lease_id": c.lease.id, "worker_id": worker}


def claim_short(orch, now, worker="w1", **kwargs):
    """A claim with a 1 s lease."""
    return orch.claim_next_task(worker_id=worker, lease_ms=1_000, now=now, **kwargs)


def keep_open(orch, run):
    """A task that never becomes ready, so the run stays active whatever else happens."""
    return orch.enqueue_task(run_id=run.id, kind="keeper", not_before=at(10_000), now=at(0))


def dead_task(orch, run, *, kind="k", at_s=2, max_attempts=1, **kwargs):
    """A task dead-lettered by lease expiry at ``at(at_s + 2)``."""
    task = orch.enqueue_task(
        run_id=run.id, kind=kind, max_attempts=max_attempts, now=at(0), **kwargs
    )
    for attempt in range(max_attempts):
        c = claim_short(orch, at(at_s), kinds=[kind])
        assert c.task.id == task.id, attempt
        orch.expire_leases(now=at(at_s + 2))
    stored = orch.get_task(task_id=task.id)
    assert stored.dead is True
    return stored


# -- expire_leases ----------------------------------------------------------------------------


def test_expire_leases_is_strict_at_the_boundary(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    claim_short(orch, at(1))  # expires at at(2)

    at_expiry = orch.expire_leases(now=at(2))
    assert at_expiry.count == 0
    assert at_expiry.expired_task_ids == []
    assert orch.get_task(task_id=task.id).status == "leased"

    after = orch.expire_leases(now=at(2, ms=1))
    assert after.count == 1
    assert after.expired_task_ids == [task.id]
    assert orch.get_task(task_id=task.id).status == "queued"


def test_expire_leases_with_nothing_to_expire_writes_nothing(orch, run):
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    claim(orch, now=at(1))
    before = row_counts()

    result = orch.expire_leases(now=at(5))

    assert (result.count, result.expired_task_ids) == (0, [])
    assert row_counts() == before


def test_expire_leases_only_touches_expired_tasks_across_runs(orch, run):
    other = orch.create_run(now=at(0))
    short_a = orch.enqueue_task(run_id=run.id, kind="short", now=at(0))
    short_b = orch.enqueue_task(run_id=other.id, kind="short", now=at(0))
    long = orch.enqueue_task(run_id=run.id, kind="long", now=at(0))
    queued = orch.enqueue_task(run_id=other.id, kind="idle", now=at(0))
    claim_short(orch, at(1), kinds=["short"])
    claim_short(orch, at(1), kinds=["short"])
    orch.claim_next_task(worker_id="w1", lease_ms=60_000, kinds=["long"], now=at(1))

    result = orch.expire_leases(now=at(10))

    assert result.count == 2
    assert set(result.expired_task_ids) == {short_a.id, short_b.id}
    assert orch.get_task(task_id=long.id).status == "leased"
    assert orch.get_task(task_id=queued.id).attempt_count == 0


@pytest.mark.parametrize("running", [False, True])
def test_expiry_with_attempts_left_requeues(orch, run, running):
    task = orch.enqueue_task(run_id=run.id, kind="k", max_attempts=2, now=at(0))
    c = claim_short(orch, at(1))
    if running:
        orch.mark_task_running(**lease_of(c), now=at(1))
    before = len(event_types(orch, run.id))

    orch.expire_leases(now=at(5))

    stored = orch.get_task(task_id=task.id)
    assert stored.status == "queued"
    assert stored.attempt_count == 1
    assert stored.dead is False
    assert (stored.lease_id, stored.leased_by, stored.lease_expires_at) == (None, None, None)
    assert stored.not_before in (None, at(5))
    events = orch.list_run_events(run_id=run.id)[before:]
    assert [e.event_type for e in events] == ["task.lease_expired", "task.retry_scheduled"]
    assert all(e.task_id == task.id and e.attempt_id == c.attempt.id for e in events)
    assert orch.get_run(run_id=run.id).status == "active"
    again = claim(orch, "w2", now=at(5))
    assert again.task.id == task.id
    assert again.task.attempt_count == 2


@pytest.mark.parametrize("status", ["blocked", "waiting_input"])
def test_a_paused_task_never_expires(orch, run, status):
    task = orch.enqueue_task(run_id=run.id, kind="k", max_attempts=1, now=at(0))
    c = claim_short(orch, at(1))
    orch.pause_task(**lease_of(c), status=status, now=at(1))

    assert orch.expire_leases(now=at(1_000)).count == 0
    assert orch.get_task(task_id=task.id).status == status


def test_expiry_without_max_attempts_always_requeues(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    for i in range(5):
        claim_short(orch, at(10 * i + 1))
        orch.expire_leases(now=at(10 * i + 5))

    stored = orch.get_task(task_id=task.id)
    assert stored.status == "queued"
    assert stored.attempt_count == 5
    assert stored.dead is False


def test_expiry_of_the_last_attempt_dead_letters(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", max_attempts=2, now=at(0))
    claim_short(orch, at(1))
    orch.expire_leases(now=at(3))
    c = claim_short(orch, at(4))
    before = len(event_types(orch, run.id))

    result = orch.expire_leases(now=at(6))

    assert result.expired_task_ids == [task.id]
    stored = orch.get_task(task_id=task.id)
    assert stored.status == "failed"
    assert stored.error == "max_attempts_exceeded"
    assert stored.dead is True
    assert stored.attempt_count == 2
    assert stored.completed_at == at(6)
    assert (stored.lease_id, stored.leased_by, stored.lease_expires_at) == (None, None, None)
    events = orch.list_run_events(run_id=run.id)[before:]
    assert [e.event_type for e in events] == [
        "task.lease_expired",
        "task.failed",
        "task.dead_lettered",
        "run.status.changed",
    ]
    assert events[2].task_id == task.id
    assert events[3].payload == {"from": "active", "to": "failed"}
    assert Attempt.objects.get(pk=c.attempt.id).status == "expired"
    assert orch.get_run(run_id=run.id).status == "failed"
    assert [t.id for t in orch.list_dead_tasks()] == [task.id]
    assert claim(orch, now=at(100)) is None


def test_retry_delay_gates_the_next_claim(orch, run):
    task = orch.enqueue_task(
        run_id=run.id, kind="k", max_attempts=5, retry={"delay_ms": 1_000}, now=at(0)
    )
    claim_short(orch, at(0))
    orch.expire_leases(now=at(1, ms=50))

    assert orch.get_task(task_id=task.id).not_before == at(2, ms=50)
    assert claim(orch, now=at(2, ms=49)) is None
    assert claim(orch, now=at(2, ms=50)).task.id == task.id


BACKOFF_CASES = [
    pytest.param({"delay_ms": 1_000, "backoff": "fixed"}, [1_000, 1_000, 1_000, 1_000], id="fixed"),
    pytest.param({"delay_ms": 500}, [500, 500, 500, 500], id="default-is-fixed"),
    pytest.param(
        {"delay_ms": 1_000, "backoff": "exponential"}, [1_000, 2_000, 4_000, 8_000], id="exp"
    ),
    pytest.param(
        {"delay_ms": 1_000, "backoff": "exponential", "max_delay_ms": 3_000},
        [1_000, 2_000, 3_000, 3_000],
        id="exp-capped",
    ),
    pytest.param(
        {"delay_ms": 1_000, "backoff": "exponential", "max_delay_ms": 0},
        [1_000, 2_000, 4_000, 8_000],
        id="exp-cap-0-means-none",
    ),
    pytest.param(
        {"delay_ms": 5_000, "backoff": "fixed", "max_delay_ms": 2_000},
        [2_000, 2_000, 2_000, 2_000],
        id="fixed-capped",
    ),
    pytest.param(
        {"delay_ms": 250, "backoff": "exponential", "max_delay_ms": 250},
        [250, 250, 250, 250],
        id="cap-equals-delay",
    ),
]


@pytest.mark.parametrize("path", ["expire", "fail_retry"])
@pytest.mark.parametrize(("retry", "delays_ms"), BACKOFF_CASES)
def test_backoff_arithmetic(orch, run, path, retry, delays_ms):
    task = orch.enqueue_task(run_id=run.id, kind="k", max_attempts=10, retry=retry, now=at(0))
    observed = []
    start = 0
    for attempt in range(1, len(delays_ms) + 1):
        c = claim_short(orch, at(start))
        assert c is not None and c.task.attempt_count == attempt
        if path == "expire":
            failed_at = at(start + 2)
            orch.expire_leases(now=failed_at)
        else:
            failed_at = at(start, ms=300)
            orch.fail_task(**lease_of(c), error="flaky", retry=True, now=failed_at)
        stored = orch.get_task(task_id=task.id)
        assert stored.status == "queued"
        observed.append((stored.not_before - failed_at) // timedelta(milliseconds=1))
        start += 20
    assert observed == delays_ms
    scheduled = [
        e.payload["delay_ms"]
        for e in orch.list_run_events(run_id=run.id)
        if e.event_type == "task.retry_scheduled"
    ]
    assert scheduled == delays_ms


# -- fail_task(retry=True) --------------------------------------------------------------------


def test_fail_with_retry_while_attempts_remain_requeues(orch, run):
    task = orch.enqueue_task(
        run_id=run.id, kind="k", max_attempts=2, retry={"delay_ms": 100}, now=at(0)
    )
    c = claim(orch, now=at(1))
    before = len(event_types(orch, run.id))

    orch.fail_task(**lease_of(c), error="flaky", metadata={"try": 1}, retry=True, now=at(2))

    stored = orch.get_task(task_id=task.id)
    assert stored.status == "queued"
    assert stored.dead is False
    assert stored.not_before == at(2, ms=100)
    assert stored.completed_at is None
    events = orch.list_run_events(run_id=run.id)[before:]
    assert [e.event_type for e in events] == ["task.retry_scheduled"]
    assert events[0].payload["error"] == "flaky"
    attempt = Attempt.objects.get(pk=c.attempt.id)
    assert (attempt.status, attempt.error, attempt.metadata) == ("failed", "flaky", {"try": 1})


def test_fail_with_retry_on_the_last_attempt_dead_letters(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", max_attempts=2, now=at(0))
    c1 = claim(orch, now=at(1))
    orch.fail_task(**lease_of(c1), error="flaky", retry=True, now=at(2))
    c2 = claim(orch, now=at(3))
    before = len(event_types(orch, run.id))

    result = orch.fail_task(**lease_of(c2), error="still flaky", retry=True, now=at(4))

    assert result.status == "failed"
    stored = orch.get_task(task_id=task.id)
    assert stored.status == "failed"
    assert stored.dead is True
    assert stored.error == "still flaky"
    assert stored.attempt_count == 2
    assert stored.completed_at == at(4)
    events = orch.list_run_events(run_id=run.id)[before:]
    assert [e.event_type for e in events] == [
        "task.failed",
        "task.dead_lettered",
        "run.status.changed",
    ]
    assert events[2].payload == {"from": "active", "to": "failed"}
    assert orch.get_run(run_id=run.id).status == "failed"
    assert [t.id for t in orch.list_dead_tasks()] == [task.id]


def test_fail_with_retry_and_max_attempts_one_dead_letters_at_once(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", max_attempts=1, now=at(0))
    c = claim(orch, now=at(1))

    orch.fail_task(**lease_of(c), error="boom", retry=True, now=at(2))

    assert orch.get_task(task_id=task.id).dead is True


def test_fail_with_retry_without_max_attempts_keeps_requeueing(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    for i in range(4):
        c = claim(orch, now=at(i))
        orch.fail_task(**lease_of(c), error="again", retry=True, now=at(i))

    stored = orch.get_task(task_id=task.id)
    assert (stored.status, stored.dead, stored.attempt_count) == ("queued", False, 4)
    assert orch.list_dead_tasks() == []


def test_fail_without_retry_is_not_dead_lettered_even_with_attempts_left(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", max_attempts=3, now=at(0))
    c = claim(orch, now=at(1))

    orch.fail_task(**lease_of(c), error="fatal", now=at(2))

    stored = orch.get_task(task_id=task.id)
    assert (stored.status, stored.dead) == ("failed", False)
    assert orch.list_dead_tasks() == []
    assert "task.dead_lettered" not in event_types(orch, run.id)


# -- list_dead_tasks --------------------------------------------------------------------------


def test_list_dead_tasks_filters_by_run_and_kinds(orch, run):
    other = orch.create_run(now=at(0))
    keep_open(orch, run)
    a = dead_task(orch, run, kind="a", at_s=2)
    b = dead_task(orch, run, kind="b", at_s=10)
    other_a = dead_task(orch, other, kind="a", at_s=20)
    fatal = orch.enqueue_task(run_id=run.id, kind="a", now=at(0))
    c = claim(orch, now=at(30), kinds=["a"])
    orch.fail_task(**lease_of(c), error="fatal", now=at(30))
    assert c.task.id == fatal.id

    assert {t.id for t in orch.list_dead_tasks()} == {a.id, b.id, other_a.id}
    assert {t.id for t in orch.list_dead_tasks(run_id=run.id)} == {a.id, b.id}
    assert {t.id for t in orch.list_dead_tasks(kinds=["a"])} == {a.id, other_a.id}
    assert [t.id for t in orch.list_dead_tasks(run_id=other.id, kinds=["a"])] == [other_a.id]
    assert orch.list_dead_tasks(run_id=other.id, kinds=["b"]) == []
    assert orch.list_dead_tasks(run_id=uuid.uuid4()) == []


def test_list_dead_tasks_limit_and_offset_page_through_a_stable_order(orch, run):
    keep_open(orch, run)
    dead = [dead_task(orch, run, kind=f"k{i}", at_s=2 + 10 * i) for i in range(5)]
    everything = [t.id for t in orch.list_dead_tasks()]
    assert set(everything) == {t.id for t in dead}

    pages = [[t.id for t in orch.list_dead_tasks(limit=2, offset=offset)] for offset in (0, 2, 4)]

    assert pages == [everything[0:2], everything[2:4], everything[4:]]
    assert orch.list_dead_tasks(offset=5) == []


@pytest.mark.parametrize("kwargs", [{"limit": 0}, {"offset": -1}, {"kinds": []}])
def test_list_dead_tasks_refuses_bad_arguments(orch, run, kwargs):
    with pytest.raises(ValidationError):
        orch.list_dead_tasks(**kwargs)


# -- requeue_dead_task ------------------------------------------------------------------------


def test_requeue_dead_task_resets_attempts_by_default(orch, run):
    task = dead_task(orch, run, max_attempts=2)
    before = len(event_types(orch, run.id))
    assert orch.get_run(run_id=run.id).status == "failed"

    result = orch.requeue_dead_task(task_id=task.id, reason="fixed upstream", now=at(50))

    assert result.status == "queued"
    stored = orch.get_task(task_id=task.id)
    assert stored.status == "queued"
    assert stored.dead is False
    assert stored.error is None
    assert stored.completed_at is None
    assert stored.attempt_count == 0
    assert stored.not_before is None
    events = orch.list_run_events(run_id=run.id)[before:]
    assert [e.event_type for e in events] == ["task.requeued_from_dlq", "run.status.changed"]
    assert events[0].payload["reason"] == "fixed upstream"
    assert events[1].payload == {"from": "failed", "to": "active"}
    assert orch.get_run(run_id=run.id).status == "active"
    assert orch.list_dead_tasks() == []


def test_a_requeued_task_with_reset_attempts_gets_all_its_attempts_again(orch, run):
    task = dead_task(orch, run, max_attempts=2)
    orch.requeue_dead_task(task_id=task.id, now=at(50))

    c = claim_short(orch, at(51))
    assert c.task.attempt_count == 1
    orch.expire_leases(now=at(53))

    stored = orch.get_task(task_id=task.id)
    assert (stored.status, stored.dead) == ("queued", False)


def test_requeue_dead_task_without_reset_keeps_the_attempt_count(orch, run):
    task = dead_task(orch, run, max_attempts=2)

    orch.requeue_dead_task(task_id=task.id, reset_attempts=False, now=at(50))

    assert orch.get_task(task_id=task.id).attempt_count == 2
    c = claim_short(orch, at(51))
    assert c.task.id == task.id
    assert c.task.attempt_count == 3
    orch.expire_leases(now=at(53))
    stored = orch.get_task(task_id=task.id)
    assert (stored.status, stored.dead, stored.error) == ("failed", True, "max_attempts_exceeded")


def test_requeue_dead_task_with_not_before(orch, run):
    task = dead_task(orch, run)

    orch.requeue_dead_task(task_id=task.id, not_before=at(100), now=at(50))

    assert orch.get_task(task_id=task.id).not_before == at(100)
    assert claim(orch, now=at(99, ms=999)) is None
    assert claim(orch, now=at(100)).task.id == task.id


def test_requeue_dead_task_of_a_task_dead_by_fail_retry(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", max_attempts=1, now=at(0))
    c = claim(orch, now=at(1))
    orch.fail_task(**lease_of(c), error="boom", retry=True, now=at(2))

    orch.requeue_dead_task(task_id=task.id, now=at(3))

    assert claim(orch, now=at(4)).task.id == task.id


def test_requeue_dead_task_makes_blocked_dependents_runnable_again(orch, run):
    upstream = orch.enqueue_task(run_id=run.id, kind="up", max_attempts=1, now=at(0))
    downstream = orch.enqueue_task(run_id=run.id, kind="down", depends_on=[upstream.id], now=at(0))
    claim_short(orch, at(1))
    orch.expire_leases(now=at(3))
    assert orch.get_run(run_id=run.id).status == "failed"

    orch.requeue_dead_task(task_id=upstream.id, now=at(10))
    c = claim(orch, now=at(11))
    orch.complete_task(**lease_of(c), now=at(12))

    assert claim(orch, now=at(13)).task.id == downstream.id


def _failed_not_dead(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", max_attempts=3, now=at(0))
    c = claim(orch, now=at(1))
    orch.fail_task(**lease_of(c), error="fatal", now=at(2))
    return task


def _queued(orch, run):
    return orch.enqueue_task(run_id=run.id, kind="k", now=at(0))


def _leased(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    claim(orch, now=at(1))
    return task


def _completed(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    c = claim(orch, now=at(1))
    orch.complete_task(**lease_of(c), now=at(2))
    return task


def _requeued(orch, run):
    task = dead_task(orch, run)
    orch.requeue_dead_task(task_id=task.id, now=at(40))
    return task


@pytest.mark.parametrize("make", [_failed_not_dead, _queued, _leased, _completed, _requeued])
def test_requeue_dead_task_refuses_a_task_that_is_not_dead(orch, run, make):
    task = make(orch, run)
    before_rows = row_counts()
    before = Task.objects.filter(pk=task.id).values().get()

    with pytest.raises(InvalidTransitionError):
        orch.requeue_dead_task(task_id=task.id, now=at(60))

    assert row_counts() == before_rows
    assert Task.objects.filter(pk=task.id).values().get() == before


def test_requeue_dead_task_in_a_cancelled_run_is_refused(orch, run):
    keep_open(orch, run)
    task = dead_task(orch, run)
    orch.cancel_run(run_id=run.id, now=at(11))
    before = row_counts()

    with pytest.raises(RunTerminalError):
        orch.requeue_dead_task(task_id=task.id, now=at(12))

    assert row_counts() == before
    assert orch.get_task(task_id=task.id).dead is True


def test_requeue_in_a_still_active_run_only_records_the_requeue(orch, run):
    keep_open(orch, run)
    task = dead_task(orch, run)
    assert orch.get_run(run_id=run.id).status == "active"
    before = len(event_types(orch, run.id))

    orch.requeue_dead_task(task_id=task.id, now=at(11))

    assert new_events(orch, run.id, before) == ["task.requeued_from_dlq"]


def test_the_full_event_story_of_a_retried_then_dead_then_requeued_task(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", max_attempts=2, now=at(0))
    c1 = claim_short(orch, at(1))
    orch.mark_task_running(**lease_of(c1), now=at(1))
    orch.expire_leases(now=at(3))
    c2 = claim_short(orch, at(4))
    orch.fail_task(**lease_of(c2), error="boom", retry=True, now=at(4))
    orch.requeue_dead_task(task_id=task.id, now=at(5))
    c3 = claim_short(orch, at(6))
    orch.complete_task(**lease_of(c3), now=at(6))

    assert event_types(orch, run.id) == [
        "run.created",
        "task.enqueued",
        "run.status.changed",
        "task.claimed",
        "task.running",
        "task.lease_expired",
        "task.retry_scheduled",
        "task.claimed",
        "task.failed",
        "task.dead_lettered",
        "run.status.changed",
        "task.requeued_from_dlq",
        "run.status.changed",
        "task.claimed",
        "task.completed",
        "run.status.changed",
    ]
    changes = [
        (e.payload["from"], e.payload["to"])
        for e in orch.list_run_events(run_id=run.id)
        if e.event_type == "run.status.changed"
    ]
    assert changes == [
        ("pending", "active"),
        ("active", "failed"),
        ("failed", "active"),
        ("active", "completed"),
    ]

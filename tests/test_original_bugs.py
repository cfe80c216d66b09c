"""One test (or more) per bug of the TypeScript original listed in CONTRACT.md; each fails on
the original's behaviour. Bug 7 (event cursor under concurrent writers) lives in
test_concurrency.py, where it needs real concurrency."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from parallel_mcp import Orchestrator
from parallel_mcp.exceptions import ValidationError
from parallel_mcp.models import Event, Run, Task
from parallel_mcp.signals import event_recorded
from tests.conftest import at, claim
from tests.subprocesses import start


@pytest.fixture
def received():
    calls: list = []

    def receiver(sender, event, **kwargs):
        calls.append(event)

    event_recorded.connect(receiver)
    yield calls
    event_recorded.disconnect(receiver)


# -- 1. listeners fire only after commit, never for rolled-back writes ------------------------


@pytest.mark.django_db(transaction=True)
def test_1_listeners_fire_after_commit_only(received):
    orch = Orchestrator()
    with orch.transaction():
        run = orch.create_run()
        orch.enqueue_task(run_id=run.id, kind="k")
        assert received == []  # still inside the transaction
    assert [event.event_type for event in received] == [
        "run.created",
        "task.enqueued",
        "run.status.changed",
    ]
    assert all(event.pk is not None for event in received)


@pytest.mark.django_db(transaction=True)
def test_1_listeners_never_hear_of_rolled_back_writes(received):
    orch = Orchestrator()
    with pytest.raises(RuntimeError), orch.transaction():
        orch.create_run()
        raise RuntimeError("abort")
    assert received == []
    assert Run.objects.count() == 0
    assert Event.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_1_a_failing_listener_is_logged_and_does_not_break_the_write(caplog):
    def broken(sender, event, **kwargs):
        raise ValueError("listener bug")

    event_recorded.connect(broken)
    try:
        run = Orchestrator().create_run()
    finally:
        event_recorded.disconnect(broken)
    assert Run.objects.filter(pk=run.pk).exists()
    assert "listener bug" in caplog.text


# -- 2. a queued task never becomes unclaimable ----------------------------------------------


def test_2_released_task_after_its_last_attempt_is_claimable(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", max_attempts=1, now=at(0))
    first = claim(orch, now=at(1))
    orch.release_task(task_id=task.id, lease_id=first.lease.id, worker_id="w1", now=at(2))
    assert orch.get_task(task_id=task.id).attempt_count == 0
    again = claim(orch, now=at(3))
    assert again is not None and again.task.id == task.id


def test_2_resumed_task_after_its_last_attempt_is_claimable(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", max_attempts=1, now=at(0))
    first = claim(orch, now=at(1))
    orch.pause_task(
        task_id=task.id, lease_id=first.lease.id, worker_id="w1", status="waiting_input", now=at(2)
    )
    orch.resume_task(task_id=task.id, now=at(3))
    again = claim(orch, now=at(4))
    assert again is not None and again.task.id == task.id


# -- 3. dependents of a failed task do not keep the run active -------------------------------


def test_3_run_with_only_doomed_work_derives_failed(orch, run):
    a = orch.enqueue_task(run_id=run.id, kind="a", max_attempts=1, now=at(0))
    b = orch.enqueue_task(run_id=run.id, kind="b", depends_on=[a.id], now=at(0))
    orch.enqueue_task(run_id=run.id, kind="c", depends_on=[b.id], now=at(0))
    c1 = claim(orch, now=at(1))
    orch.fail_task(
        task_id=a.id, lease_id=c1.lease.id, worker_id="w1", error="boom", retry=True, now=at(2)
    )
    run.refresh_from_db()
    assert run.status == "failed"
    assert (run.tasks_failed, run.tasks_stuck, run.tasks_active) == (1, 2, 0)
    assert claim(orch, now=at(3)) is None


def test_3_requeueing_the_failed_dependency_makes_dependents_runnable_again(orch, run):
    a = orch.enqueue_task(run_id=run.id, kind="a", max_attempts=1, now=at(0))
    b = orch.enqueue_task(run_id=run.id, kind="b", depends_on=[a.id], now=at(0))
    c = orch.enqueue_task(run_id=run.id, kind="c", depends_on=[b.id], now=at(0))
    c1 = claim(orch, now=at(1))
    orch.fail_task(
        task_id=a.id, lease_id=c1.lease.id, worker_id="w1", error="boom", retry=True, now=at(2)
    )
    orch.requeue_dead_task(task_id=a.id, now=at(3))
    run.refresh_from_db()
    assert run.status == "active"
    assert (run.tasks_active, run.tasks_stuck, run.tasks_failed) == (3, 0, 0)
    for expected in (a, b, c):
        step = claim(orch, now=at(4))
        assert step.task.id == expected.id
        orch.complete_task(task_id=step.task.id, lease_id=step.lease.id, worker_id="w1", now=at(5))
    run.refresh_from_db()
    assert run.status == "completed"


def test_3_a_task_enqueued_after_its_dependency_failed_is_stuck_at_birth(orch, run):
    a = orch.enqueue_task(run_id=run.id, kind="a", now=at(0))
    other = orch.enqueue_task(run_id=run.id, kind="other", priority=-1, now=at(0))
    c1 = claim(orch, now=at(1))
    orch.fail_task(task_id=a.id, lease_id=c1.lease.id, worker_id="w1", error="boom", now=at(2))
    late = orch.enqueue_task(run_id=run.id, kind="late", depends_on=[a.id], now=at(3))
    assert late.failed_dependencies == 1
    run.refresh_from_db()
    assert run.status == "active"  # `other` can still run
    c2 = claim(orch, now=at(4))
    assert c2.task.id == other.id
    orch.complete_task(task_id=other.id, lease_id=c2.lease.id, worker_id="w1", now=at(5))
    run.refresh_from_db()
    assert run.status == "failed"


# -- 4. prune never deletes non-terminal runs ------------------------------------------------


@pytest.mark.parametrize("status", ["pending", "active", "waiting"])
def test_4_prune_refuses_non_terminal_statuses(orch, status):
    live = orch.create_run(now=at(0))
    orch.enqueue_task(run_id=live.id, kind="k", now=at(0))
    with pytest.raises(ValidationError):
        orch.prune_runs(older_than=at(10_000), statuses=[status])
    assert Run.objects.filter(pk=live.pk).exists()


def test_4_prune_leaves_live_runs_even_when_old(orch):
    live = orch.create_run(now=at(0))
    orch.enqueue_task(run_id=live.id, kind="k", now=at(0))
    result = orch.prune_runs(older_than=at(10_000))
    assert result.count == 0
    assert Task.objects.filter(run_id=live.pk).count() == 1


# -- 5. heartbeats extend by the worker's lease, not the default -----------------------------


def test_5_heartbeat_extends_by_the_lease_the_caller_gives(orch, run):
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    c = orch.claim_next_task(worker_id="w1", lease_ms=120_000, now=at(1))
    lease = orch.heartbeat_lease(
        task_id=c.task.id, lease_id=c.lease.id, worker_id="w1", lease_ms=120_000, now=at(60)
    )
    assert lease.expires_at == at(180)
    assert orch.get_task(task_id=c.task.id).lease_expires_at == at(180)
    assert orch.expire_leases(now=at(100)).count == 0


def test_5_heartbeat_without_lease_uses_the_orchestrators_default(db):
    orch = Orchestrator(default_lease_ms=7_000)
    run = orch.create_run(now=at(0))
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    c = orch.claim_next_task(worker_id="w1", now=at(1))
    assert c.lease.expires_at == at(8)
    lease = orch.heartbeat_lease(task_id=c.task.id, lease_id=c.lease.id, worker_id="w1", now=at(5))
    assert lease.expires_at == at(12)


# -- 6. cancellation reaches workers in other processes --------------------------------------


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_6_cancel_run_reaches_a_worker_in_another_process():
    orch = Orchestrator()
    run = orch.create_run()
    orch.enqueue_task(run_id=run.id, kind="long")
    worker = start("hold", "remote-worker", "50")
    assert worker.stdout.readline().strip() == "claimed"
    started = time.monotonic()
    orch.cancel_run(run_id=run.id, reason="operator")
    out, err = worker.communicate(timeout=20)
    assert worker.returncode == 0, err
    assert out.strip() == "refused lease_conflict"
    assert time.monotonic() - started < 5


# -- 8. per-operation cost does not grow with the run ----------------------------------------


def _complete_one_queries(orch, run) -> int:
    c = claim(orch, now=at(1))
    with CaptureQueriesContext(connection) as captured:
        orch.complete_task(task_id=c.task.id, lease_id=c.lease.id, worker_id="w1", now=at(2))
    return len(captured.captured_queries)


def test_8_completing_a_task_costs_the_same_in_small_and_large_runs(orch):
    small = orch.create_run(now=at(0))
    orch.enqueue_task(run_id=small.id, kind="k", priority=10, now=at(0))
    small_cost = _complete_one_queries(orch, small)

    large = orch.create_run(now=at(0))
    orch.enqueue_task(run_id=large.id, kind="k", priority=10, now=at(0))
    Task.objects.bulk_create(
        Task(run_id=large.id, kind="k", created_at=at(0), updated_at=at(0)) for _ in range(2000)
    )
    large_cost = _complete_one_queries(orch, large)
    assert small_cost == large_cost


def test_8_no_write_reads_every_task_of_the_run(orch, run):
    for _ in range(30):
        orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    c = claim(orch, now=at(1))
    with CaptureQueriesContext(connection) as captured:
        orch.complete_task(task_id=c.task.id, lease_id=c.lease.id, worker_id="w1", now=at(2))
    reads_of_run_tasks = [
        q["sql"]
        for q in captured.captured_queries
        if q["sql"].startswith("SELECT") and '"pmcp_task"."run_id" =' in q["sql"]
    ]
    assert reads_of_run_tasks == []


# -- 9. input validation -------------------------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"kind": ""},
        {"kind": "   "},
        {"kind": "k", "max_attempts": 0},
        {"kind": "k", "max_attempts": -1},
        {"kind": "k", "timeout_ms": 0},
        {"kind": "k", "retry": {"delay_ms": -5}},
        {"kind": "k", "retry": {"backoff": "linear"}},
        {"kind": "k", "priority": "high"},
        {"kind": "k", "input": {"not": {1, 2}}},
    ],
)
def test_9_bad_enqueue_arguments_are_refused_and_nothing_is_written(orch, run, kwargs):
    events_before = Event.objects.count()
    with pytest.raises(ValidationError):
        orch.enqueue_task(run_id=run.id, **kwargs)
    assert Task.objects.count() == 0
    assert Event.objects.count() == events_before


@pytest.mark.parametrize("lease_ms", [0, -1, 1.5, "10"])
def test_9_bad_lease_lengths_are_refused(orch, run, lease_ms):
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    with pytest.raises(ValidationError):
        orch.claim_next_task(worker_id="w1", lease_ms=lease_ms, now=at(1))
    assert orch.get_task(task_id=orch.list_run_tasks(run_id=run.id)[0].id).status == "queued"


def test_9_bad_kinds_filter_and_worker_are_refused(orch, run):
    with pytest.raises(ValidationError):
        orch.claim_next_task(worker_id="w1", kinds=[""], now=at(1))
    with pytest.raises(ValidationError):
        orch.claim_next_task(worker_id="", now=at(1))


def test_9_orchestrator_refuses_a_bad_default_lease(db):
    with pytest.raises(ValidationError):
        Orchestrator(default_lease_ms=0)
    with pytest.raises(ValidationError):
        Orchestrator(using="nope")


def test_9_expired_boundary_uses_the_given_clock(orch, run):
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    c = orch.claim_next_task(worker_id="w1", lease_ms=1_000, now=at(1))
    assert orch.expire_leases(now=at(2)).count == 0  # expires exactly now: still valid
    assert orch.expire_leases(now=at(2) + timedelta(microseconds=1)).expired_task_ids == [c.task.id]

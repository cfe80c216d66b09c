"""Tasks: enqueue, claim, running, heartbeat, pause/resume, release, fail, complete, reads."""

from __future__ import annotations

import uuid
from datetime import datetime

import pytest

from parallel_mcp import Orchestrator
from parallel_mcp.exceptions import (
    DuplicateTaskKeyError,
    InvalidDependencyError,
    InvalidTransitionError,
    LeaseExpiredError,
    RecordNotFoundError,
    RunTerminalError,
    ValidationError,
)
from parallel_mcp.models import (
    Attempt,
    ContextSnapshot,
    Event,
    Lease,
    Run,
    Task,
    TaskDependency,
)
from tests.conftest import at, claim, event_types

pytestmark = pytest.mark.django_db


def row_counts() -> dict[str, int]:
    models = (Run, Task, TaskDependency, Attempt, Lease, ContextSnapshot, Event)
    return {model.__name__: model.objects.count() for model in models}


def run_row(run_id) -> tuple:
    run = Run.objects.get(pk=run_id)
    return (run.status, run.updated_at, run.tasks_total, run.tasks_active)


def new_events(orch, run_id, before: int) -> list[str]:
    return event_types(orch, run_id)[before:]


def enqueue(orch, run, kind="k", **kwargs):
    kwargs.setdefault("now", at(0))
    return orch.enqueue_task(run_id=run.id, kind=kind, **kwargs)


def lease_of(c, worker="w1") -> dict:
    return {"task_id": c.task.id, "lease_id": c.lease.id, "worker_id": worker}


# -- enqueue_task -----------------------------------------------------------------------------


def test_enqueue_task_stores_every_argument(orch, run):
    wanted = uuid.uuid4()
    orch.enqueue_task(
        run_id=run.id,
        kind="fetch",
        key="fetch-1",
        priority=7,
        max_attempts=3,
        retry={"delay_ms": 250, "backoff": "exponential", "max_delay_ms": 4_000},
        timeout_ms=2_500,
        input={"url": "https://example.test", "n": [1, 2]},
        metadata={"team": "crawl"},
        not_before=at(60),
        id=str(wanted),
        now=at(2),
    )

    task = orch.get_task(task_id=wanted)
    assert task.id == wanted
    assert task.run_id == run.id
    assert task.kind == "fetch"
    assert task.key == "fetch-1"
    assert task.priority == 7
    assert task.max_attempts == 3
    assert task.retry_delay_ms == 250
    assert task.retry_backoff == "exponential"
    assert task.retry_max_delay_ms == 4_000
    assert task.timeout_ms == 2_500
    assert task.input == {"url": "https://example.test", "n": [1, 2]}
    assert task.metadata == {"team": "crawl"}
    assert task.not_before == at(60)
    assert task.created_at == at(2)
    assert task.updated_at == at(2)


def test_enqueue_task_defaults(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", now=at(1))

    stored = orch.get_task(task_id=task.id)
    assert stored.status == "queued"
    assert stored.key is None
    assert stored.priority == 0
    assert stored.max_attempts is None
    assert stored.attempt_count == 0
    assert (stored.retry_delay_ms, stored.retry_backoff, stored.retry_max_delay_ms) == (
        None,
        None,
        None,
    )
    assert stored.timeout_ms is None
    assert stored.not_before is None
    assert (stored.input, stored.output, stored.metadata, stored.error) == (None, None, None, None)
    assert (stored.lease_id, stored.leased_by, stored.lease_expires_at) == (None, None, None)
    assert stored.dead is False
    assert stored.started_at is None
    assert stored.completed_at is None
    assert stored.depends_on_task_ids == []


def test_enqueue_task_records_an_event_and_activates_the_run(orch, run):
    task = enqueue(orch, run, kind="parse", key="p1", priority=4)

    events = orch.list_run_events(run_id=run.id)
    assert [e.event_type for e in events] == ["run.created", "task.enqueued", "run.status.changed"]
    enqueued = events[1]
    assert enqueued.task_id == task.id
    assert enqueued.payload["kind"] == "parse"
    assert enqueued.payload["key"] == "p1"
    assert enqueued.payload["priority"] == 4
    assert events[2].payload == {"from": "pending", "to": "active"}
    assert orch.get_run(run_id=run.id).status == "active"


@pytest.mark.parametrize(
    "retry",
    [
        "fixed",
        [100],
        {"delay_ms": -1},
        {"delay_ms": "100"},
        {"delay_ms": 1.5},
        {"delay_ms": True},
        {"delay_ms": 100, "backoff": "linear"},
        {"max_delay_ms": -5},
        {"delay_ms": 100, "jitter": True},
    ],
)
def test_enqueue_task_refuses_a_bad_retry_policy(orch, run, retry):
    before = row_counts()
    with pytest.raises(ValidationError):
        enqueue(orch, run, retry=retry)
    assert row_counts() == before


@pytest.mark.parametrize(
    "retry",
    [
        {"delay_ms": 0},
        {"delay_ms": 100},
        {"delay_ms": 100, "backoff": "fixed"},
        {"delay_ms": 100, "backoff": "exponential", "max_delay_ms": 1_000},
        {},
    ],
)
def test_enqueue_task_accepts_a_valid_retry_policy(orch, run, retry):
    task = enqueue(orch, run, retry=retry)
    stored = orch.get_task(task_id=task.id)
    assert stored.retry_delay_ms == retry.get("delay_ms")
    assert stored.retry_backoff == retry.get("backoff")
    assert stored.retry_max_delay_ms == retry.get("max_delay_ms")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_attempts": 0},
        {"max_attempts": -1},
        {"max_attempts": "3"},
        {"kind": ""},
        {"kind": "   "},
        {"kind": None},
        {"kind": 7},
        {"priority": 1_000_001},
        {"priority": -1_000_001},
        {"priority": "high"},
        {"timeout_ms": 0},
        {"timeout_ms": -10},
        {"input": {"x": object()}},
        {"input": {1, 2}},
        {"input": float("inf")},
        {"metadata": {"x": object()}},
        {"not_before": datetime(2026, 1, 1)},
        {"not_before": "2026-01-01T00:00:00Z"},
        {"id": "not-a-uuid"},
        {"key": ""},
        {"now": datetime(2026, 1, 1)},
    ],
)
def test_enqueue_task_refuses_bad_arguments_and_writes_nothing(orch, run, kwargs):
    kwargs = {"kind": "k", "now": at(1), **kwargs}
    before = row_counts()
    run_before = run_row(run.id)

    with pytest.raises(ValidationError):
        orch.enqueue_task(run_id=run.id, **kwargs)

    assert row_counts() == before
    assert run_row(run.id) == run_before


@pytest.mark.parametrize("priority", [1_000_000, -1_000_000])
def test_enqueue_task_accepts_the_priority_bounds(orch, run, priority):
    assert enqueue(orch, run, priority=priority).priority == priority


def test_enqueue_task_refuses_an_unknown_context_snapshot(orch, run):
    before = row_counts()
    with pytest.raises(ValidationError):
        enqueue(orch, run, context_snapshot_id=uuid.uuid4())
    assert row_counts() == before


def test_enqueue_task_refuses_a_context_snapshot_of_another_run(orch, run):
    other = orch.create_run(context={"other": True}, now=at(0))
    before = row_counts()
    with pytest.raises(ValidationError):
        enqueue(orch, run, context_snapshot_id=other.current_context_snapshot_id)
    assert row_counts() == before


def test_enqueue_task_defaults_to_the_runs_current_context_snapshot(orch):
    run = orch.create_run(context={"v": 1}, now=at(0))
    first = enqueue(orch, run)
    assert first.context_snapshot_id == run.current_context_snapshot_id

    newer = orch.append_context_snapshot(run_id=run.id, payload={"v": 2}, now=at(1))
    second = enqueue(orch, run, now=at(2))

    assert orch.get_task(task_id=second.id).context_snapshot_id == newer.id
    assert orch.get_task(task_id=first.id).context_snapshot_id == run.current_context_snapshot_id


def test_enqueue_task_without_any_context_has_no_snapshot(orch, run):
    assert enqueue(orch, run).context_snapshot_id is None


def test_enqueue_task_with_an_explicit_older_snapshot(orch):
    run = orch.create_run(context={"v": 1}, now=at(0))
    orch.append_context_snapshot(run_id=run.id, payload={"v": 2}, now=at(1))

    task = enqueue(orch, run, context_snapshot_id=run.current_context_snapshot_id, now=at(2))

    assert orch.get_task(task_id=task.id).context_snapshot_id == run.current_context_snapshot_id


def test_enqueue_task_with_a_duplicate_key_in_the_same_run(orch, run):
    enqueue(orch, run, key="same")
    before = row_counts()
    run_before = run_row(run.id)

    with pytest.raises(DuplicateTaskKeyError):
        enqueue(orch, run, key="same", now=at(1))

    assert row_counts() == before
    assert run_row(run.id) == run_before


def test_the_same_key_in_another_run_is_fine(orch, run):
    enqueue(orch, run, key="same")
    other = orch.create_run(now=at(0))
    assert enqueue(orch, other, key="same").key == "same"


def test_enqueue_task_with_a_duplicate_task_id(orch, run):
    existing = enqueue(orch, run)
    before = row_counts()
    with pytest.raises(ValidationError):
        enqueue(orch, run, id=existing.id, now=at(1))
    assert row_counts() == before


def test_enqueue_task_with_an_unknown_dependency(orch, run):
    before = row_counts()
    with pytest.raises(InvalidDependencyError):
        enqueue(orch, run, depends_on=[uuid.uuid4()])
    assert row_counts() == before


def test_enqueue_task_with_a_dependency_in_another_run(orch, run):
    other = orch.create_run(now=at(0))
    foreign = enqueue(orch, other)
    before = row_counts()
    run_before = run_row(run.id)

    with pytest.raises(InvalidDependencyError):
        enqueue(orch, run, depends_on=[foreign.id])

    assert row_counts() == before
    assert run_row(run.id) == run_before


def test_enqueue_task_with_a_duplicate_dependency(orch, run):
    upstream = enqueue(orch, run)
    before = row_counts()
    with pytest.raises(InvalidDependencyError):
        enqueue(orch, run, depends_on=[upstream.id, str(upstream.id)])
    assert row_counts() == before


def test_enqueue_task_with_a_dependency_that_is_not_an_id(orch, run):
    before = row_counts()
    with pytest.raises(InvalidDependencyError):
        enqueue(orch, run, depends_on=["not-a-uuid"])
    assert row_counts() == before


def test_enqueue_task_in_an_unknown_run_writes_nothing(orch, run):
    before = row_counts()
    with pytest.raises(RecordNotFoundError):
        orch.enqueue_task(run_id=uuid.uuid4(), kind="k", now=at(1))
    assert row_counts() == before


def _complete_only_task(orch, run):
    task = enqueue(orch, run)
    c = claim(orch)
    orch.complete_task(task_id=task.id, lease_id=c.lease.id, worker_id="w1", now=at(2))


def _fail_only_task(orch, run):
    task = enqueue(orch, run)
    c = claim(orch)
    orch.fail_task(task_id=task.id, lease_id=c.lease.id, worker_id="w1", error="x", now=at(2))


def _cancel(orch, run):
    enqueue(orch, run)
    orch.cancel_run(run_id=run.id, now=at(2))


@pytest.mark.parametrize(
    ("make_terminal", "status"),
    [(_complete_only_task, "completed"), (_fail_only_task, "failed"), (_cancel, "cancelled")],
)
def test_enqueue_task_into_a_terminal_run_is_refused(orch, run, make_terminal, status):
    make_terminal(orch, run)
    assert orch.get_run(run_id=run.id).status == status
    before = row_counts()
    run_before = run_row(run.id)

    with pytest.raises(RunTerminalError):
        enqueue(orch, run, now=at(3))

    assert row_counts() == before
    assert run_row(run.id) == run_before


def test_depends_on_task_ids_lists_dependencies_in_declared_order(orch, run):
    a = enqueue(orch, run, kind="a")
    b = enqueue(orch, run, kind="b")
    c = enqueue(orch, run, kind="c", depends_on=[b.id, str(a.id)])

    assert c.depends_on_task_ids == [b.id, a.id]
    assert orch.get_task(task_id=c.id).depends_on_task_ids == [b.id, a.id]
    assert orch.get_task(task_id=a.id).depends_on_task_ids == []
    enqueued = [e for e in orch.list_run_events(run_id=run.id) if e.task_id == c.id]
    assert enqueued[0].payload["depends_on"] == [str(b.id), str(a.id)]


# -- claim_next_task --------------------------------------------------------------------------


def test_claim_returns_run_task_attempt_and_lease(orch, run):
    task = enqueue(orch, run, kind="parse")

    c = orch.claim_next_task(worker_id="w1", lease_ms=10_000, now=at(1))

    assert c.run.id == run.id
    assert c.task.id == task.id
    assert c.task.status == "leased"
    assert c.task.attempt_count == 1
    assert c.task.lease_id == c.lease.id
    assert c.task.leased_by == "w1"
    assert c.task.lease_expires_at == at(11)
    assert c.attempt.task_id == task.id
    assert c.attempt.worker_id == "w1"
    assert c.attempt.status == "leased"
    assert c.attempt.leased_at == at(1)
    assert c.attempt.lease_expires_at == at(11)
    assert c.lease.task_id == task.id
    assert c.lease.attempt_id == c.attempt.id
    assert c.lease.worker_id == "w1"
    assert c.lease.status == "active"
    assert c.lease.acquired_at == at(1)
    assert c.lease.expires_at == at(11)
    assert event_types(orch, run.id)[-1] == "task.claimed"


def test_claim_without_lease_ms_uses_the_orchestrators_default(db):
    orch = Orchestrator(default_lease_ms=7_000)
    run = orch.create_run(now=at(0))
    enqueue(orch, run)

    c = orch.claim_next_task(worker_id="w1", now=at(1))

    assert c.lease.expires_at == at(8)
    assert orch.get_task(task_id=c.task.id).lease_expires_at == at(8)


def test_claim_with_nothing_queued_returns_none_and_writes_nothing(orch, run):
    before = row_counts()
    assert claim(orch) is None
    assert row_counts() == before


@pytest.mark.parametrize(
    "kwargs",
    [{"lease_ms": 0}, {"lease_ms": -5}, {"worker_id": ""}, {"kinds": []}, {"kinds": [""]}],
)
def test_claim_refuses_bad_arguments(orch, run, kwargs):
    enqueue(orch, run)
    before = row_counts()
    kwargs = {"worker_id": "w1", "now": at(1), **kwargs}
    with pytest.raises(ValidationError):
        orch.claim_next_task(**kwargs)
    assert row_counts() == before


def test_claim_takes_the_highest_priority_first(orch, run):
    low = enqueue(orch, run, priority=0, now=at(0))
    high = enqueue(orch, run, priority=10, now=at(5))
    mid = enqueue(orch, run, priority=5, now=at(3))
    negative = enqueue(orch, run, priority=-3, now=at(0))

    order = [claim(orch, now=at(10)).task.id for _ in range(4)]

    assert order == [high.id, mid.id, low.id, negative.id]


def test_claim_takes_the_oldest_first_within_a_priority(orch, run):
    newest = enqueue(orch, run, now=at(3))
    oldest = enqueue(orch, run, now=at(1))
    middle = enqueue(orch, run, now=at(2))

    order = [claim(orch, now=at(10)).task.id for _ in range(3)]

    assert order == [oldest.id, middle.id, newest.id]


def test_claim_takes_insertion_order_when_created_at_is_equal(orch, run):
    tasks = [enqueue(orch, run, key=f"t{i}", now=at(0)) for i in range(6)]

    order = [claim(orch, now=at(1)).task.id for _ in range(6)]

    assert order == [t.id for t in tasks]


def test_claim_orders_across_runs(orch, run):
    other = orch.create_run(now=at(0))
    first = enqueue(orch, other, now=at(1))
    second = enqueue(orch, run, now=at(2))
    urgent = enqueue(orch, run, priority=1, now=at(3))

    order = [claim(orch, now=at(5)).task.id for _ in range(3)]

    assert order == [urgent.id, first.id, second.id]


def test_claim_with_kinds_only_takes_those_kinds(orch, run):
    enqueue(orch, run, kind="a", priority=5)
    b = enqueue(orch, run, kind="b")
    c = enqueue(orch, run, kind="c")

    assert claim(orch, kinds=["b"]).task.id == b.id
    assert claim(orch, kinds=["b"]) is None
    assert claim(orch, kinds=["c", "zzz"]).task.id == c.id
    assert claim(orch, kinds="a").task.kind == "a"


def test_claim_respects_not_before(orch, run):
    task = enqueue(orch, run, not_before=at(10))

    assert claim(orch, now=at(9, ms=999)) is None
    c = claim(orch, now=at(10))

    assert c.task.id == task.id
    assert c.task.not_before is None


def test_a_not_before_task_does_not_hold_back_ready_ones(orch, run):
    enqueue(orch, run, priority=9, not_before=at(100))
    ready = enqueue(orch, run, priority=0)

    assert claim(orch, now=at(1)).task.id == ready.id


def test_dependencies_gate_readiness(orch, run):
    parse = enqueue(orch, run, kind="parse")
    fetch = enqueue(orch, run, kind="fetch", priority=100, depends_on=[parse.id])

    c1 = claim(orch, now=at(1))
    assert c1.task.id == parse.id
    assert claim(orch, "w2", now=at(2)) is None
    orch.complete_task(**lease_of(c1), now=at(3))
    c2 = claim(orch, "w2", now=at(4))

    assert c2.task.id == fetch.id


def test_a_task_waits_for_all_its_dependencies(orch, run):
    a = enqueue(orch, run, kind="a")
    b = enqueue(orch, run, kind="b")
    joined = enqueue(orch, run, kind="join", depends_on=[a.id, b.id])
    ca = claim(orch, kinds=["a"])
    cb = claim(orch, kinds=["b"])

    orch.complete_task(**lease_of(ca), now=at(2))
    assert claim(orch, kinds=["join"], now=at(3)) is None
    orch.complete_task(**lease_of(cb), now=at(4))

    assert claim(orch, kinds=["join"], now=at(5)).task.id == joined.id


def test_a_dependency_completed_before_enqueue_does_not_gate(orch, run):
    upstream = enqueue(orch, run, kind="up")
    enqueue(orch, run, kind="keeps-the-run-open", not_before=at(1_000))
    c = claim(orch)
    orch.complete_task(**lease_of(c), now=at(2))

    downstream = enqueue(orch, run, kind="down", depends_on=[upstream.id], now=at(3))

    assert claim(orch, now=at(4)).task.id == downstream.id


def test_a_failed_dependency_keeps_its_dependent_unclaimable(orch, run):
    upstream = enqueue(orch, run, kind="up")
    enqueue(orch, run, kind="down", depends_on=[upstream.id])
    c = claim(orch)
    orch.fail_task(**lease_of(c), error="boom", now=at(2))

    assert claim(orch, now=at(3)) is None
    assert orch.get_run(run_id=run.id).status == "failed"


# -- list_pending_tasks -----------------------------------------------------------------------


def test_list_pending_tasks_lists_queued_tasks_in_claim_order(orch, run):
    low = enqueue(orch, run, priority=0, now=at(0))
    high = enqueue(orch, run, priority=3, now=at(1))
    later = enqueue(orch, run, priority=0, not_before=at(50), now=at(2))
    blocked = enqueue(orch, run, priority=0, depends_on=[low.id], now=at(3))

    assert [t.id for t in orch.list_pending_tasks()] == [high.id, low.id, later.id, blocked.id]


def test_list_pending_tasks_excludes_leased_and_finished_tasks(orch, run):
    done = enqueue(orch, run, priority=2)
    leased = enqueue(orch, run, priority=1)
    waiting = enqueue(orch, run)
    c = claim(orch)
    orch.complete_task(**lease_of(c), now=at(2))
    assert claim(orch, now=at(3)).task.id == leased.id

    assert [t.id for t in orch.list_pending_tasks()] == [waiting.id]
    assert orch.get_task(task_id=done.id).status == "completed"


def test_list_pending_tasks_filters_by_run_and_kinds(orch, run):
    other = orch.create_run(now=at(0))
    a = enqueue(orch, run, kind="a")
    b = enqueue(orch, run, kind="b")
    other_a = enqueue(orch, other, kind="a")

    assert {t.id for t in orch.list_pending_tasks(run_id=run.id)} == {a.id, b.id}
    assert {t.id for t in orch.list_pending_tasks(kinds=["a"])} == {a.id, other_a.id}
    assert [t.id for t in orch.list_pending_tasks(run_id=other.id, kinds=["b"])] == []


def test_list_pending_tasks_ready_by_keeps_only_tasks_a_claim_could_take(orch, run):
    now_ready = enqueue(orch, run, kind="a")
    at_boundary = enqueue(orch, run, kind="b", not_before=at(10))
    too_late = enqueue(orch, run, kind="c", not_before=at(10, ms=1))
    gated = enqueue(orch, run, kind="d", depends_on=[now_ready.id])

    ready = {t.id for t in orch.list_pending_tasks(ready_by=at(10))}

    assert ready == {now_ready.id, at_boundary.id}
    assert too_late.id not in ready
    assert gated.id not in ready
    assert {t.id for t in orch.list_pending_tasks(ready_by=at(0))} == {now_ready.id}


def test_list_pending_tasks_limit(orch, run):
    tasks = [enqueue(orch, run, priority=5 - i) for i in range(5)]
    assert [t.id for t in orch.list_pending_tasks(limit=2)] == [tasks[0].id, tasks[1].id]


# -- mark_task_running ------------------------------------------------------------------------


def test_mark_task_running(orch, run):
    task = enqueue(orch, run)
    c = claim(orch, now=at(1))
    before = len(event_types(orch, run.id))

    result = orch.mark_task_running(**lease_of(c), now=at(2))

    assert result.status == "running"
    stored = orch.get_task(task_id=task.id)
    assert stored.status == "running"
    assert stored.started_at == at(2)
    assert stored.lease_id == c.lease.id
    assert stored.leased_by == "w1"
    assert stored.lease_expires_at == c.lease.expires_at
    attempt = Attempt.objects.get(pk=c.attempt.id)
    assert attempt.status == "running"
    assert attempt.started_at == at(2)
    assert new_events(orch, run.id, before) == ["task.running"]


# -- heartbeat_lease --------------------------------------------------------------------------


def test_heartbeat_extends_the_lease_to_now_plus_the_given_lease_ms(orch, run):
    task = enqueue(orch, run)
    c = orch.claim_next_task(worker_id="w1", lease_ms=5_000, now=at(1))
    before = len(event_types(orch, run.id))

    lease = orch.heartbeat_lease(**lease_of(c), lease_ms=120_000, now=at(4))

    assert lease.id == c.lease.id
    assert lease.expires_at == at(124)
    assert lease.heartbeat_at == at(4)
    assert lease.status == "active"
    assert orch.get_task(task_id=task.id).lease_expires_at == at(124)
    assert Attempt.objects.get(pk=c.attempt.id).lease_expires_at == at(124)
    assert new_events(orch, run.id, before) == ["task.lease_heartbeat"]


def test_heartbeat_without_lease_ms_uses_the_orchestrators_default(db):
    orch = Orchestrator(default_lease_ms=5_000)
    run = orch.create_run(now=at(0))
    enqueue(orch, run)
    c = orch.claim_next_task(worker_id="w1", lease_ms=60_000, now=at(1))

    lease = orch.heartbeat_lease(**lease_of(c), now=at(10))

    assert lease.expires_at == at(15)


def test_heartbeat_can_shorten_the_lease(orch, run):
    enqueue(orch, run)
    c = orch.claim_next_task(worker_id="w1", lease_ms=60_000, now=at(1))

    lease = orch.heartbeat_lease(**lease_of(c), lease_ms=1_000, now=at(2))

    assert lease.expires_at == at(3)


def test_a_heartbeat_keeps_the_task_from_expiring(orch, run):
    task = enqueue(orch, run)
    c = orch.claim_next_task(worker_id="w1", lease_ms=10_000, now=at(1))
    orch.heartbeat_lease(**lease_of(c), lease_ms=10_000, now=at(9))

    assert orch.expire_leases(now=at(15)).count == 0
    assert orch.get_task(task_id=task.id).status == "leased"
    assert orch.expire_leases(now=at(19, ms=1)).expired_task_ids == [task.id]


@pytest.mark.parametrize("lease_ms", [0, -1, "100"])
def test_heartbeat_refuses_a_bad_lease_ms(orch, run, lease_ms):
    enqueue(orch, run)
    c = claim(orch)
    with pytest.raises(ValidationError):
        orch.heartbeat_lease(**lease_of(c), lease_ms=lease_ms, now=at(2))
    assert Lease.objects.get(pk=c.lease.id).expires_at == c.lease.expires_at


def test_heartbeat_after_expiry_is_refused(orch, run):
    enqueue(orch, run)
    c = orch.claim_next_task(worker_id="w1", lease_ms=1_000, now=at(1))
    with pytest.raises(LeaseExpiredError):
        orch.heartbeat_lease(**lease_of(c), now=at(2, ms=1))
    assert Lease.objects.get(pk=c.lease.id).expires_at == at(2)


# -- pause_task / resume_task ----------------------------------------------------------------


@pytest.mark.parametrize("status", ["blocked", "waiting_input"])
@pytest.mark.parametrize("running", [False, True])
def test_pause_task(orch, run, status, running):
    task = enqueue(orch, run)
    c = claim(orch, now=at(1))
    if running:
        orch.mark_task_running(**lease_of(c), now=at(2))
    before = len(event_types(orch, run.id))

    result = orch.pause_task(**lease_of(c), status=status, reason="needs a human", now=at(3))

    assert result.status == status
    stored = orch.get_task(task_id=task.id)
    assert stored.status == status
    assert (stored.lease_id, stored.leased_by, stored.lease_expires_at) == (None, None, None)
    assert Attempt.objects.get(pk=c.attempt.id).status == "released"
    assert Lease.objects.get(pk=c.lease.id).status == "released"
    events = orch.list_run_events(run_id=run.id)[before:]
    assert [e.event_type for e in events] == [f"task.{status}", "run.status.changed"]
    assert events[0].payload["reason"] == "needs a human"
    assert events[1].payload == {"from": "active", "to": "waiting"}
    assert orch.get_run(run_id=run.id).status == "waiting"


def test_a_paused_task_is_not_claimable(orch, run):
    enqueue(orch, run)
    c = claim(orch)
    orch.pause_task(**lease_of(c), status="blocked", now=at(2))

    assert claim(orch, now=at(3)) is None
    assert orch.list_pending_tasks() == []


@pytest.mark.parametrize("status", ["queued", "running", "paused", "cancelled", "", None])
def test_pause_task_refuses_a_status_other_than_blocked_or_waiting_input(orch, run, status):
    task = enqueue(orch, run)
    c = claim(orch)
    before = row_counts()

    with pytest.raises(ValidationError):
        orch.pause_task(**lease_of(c), status=status, now=at(2))

    assert row_counts() == before
    assert orch.get_task(task_id=task.id).status == "leased"


@pytest.mark.parametrize("status", ["blocked", "waiting_input"])
def test_resume_task_requeues_a_paused_task(orch, run, status):
    task = enqueue(orch, run)
    c = claim(orch)
    orch.pause_task(**lease_of(c), status=status, now=at(2))
    before = len(event_types(orch, run.id))

    result = orch.resume_task(task_id=task.id, now=at(3))

    assert result.status == "queued"
    assert orch.get_task(task_id=task.id).status == "queued"
    events = orch.list_run_events(run_id=run.id)[before:]
    assert [e.event_type for e in events] == ["task.resumed", "run.status.changed"]
    assert events[1].payload == {"from": "waiting", "to": "active"}
    again = claim(orch, "w2", now=at(4))
    assert again.task.id == task.id
    assert again.task.attempt_count == 2


def test_a_task_resumed_after_its_last_attempt_is_still_claimable(orch, run):
    task = enqueue(orch, run, max_attempts=1)
    c = claim(orch)
    orch.pause_task(**lease_of(c), status="waiting_input", now=at(2))
    orch.resume_task(task_id=task.id, now=at(3))

    again = claim(orch, "w2", now=at(4))

    assert again is not None
    assert again.task.id == task.id


def _leased(orch, run):
    task = enqueue(orch, run)
    claim(orch)
    return task


def _running(orch, run):
    task = enqueue(orch, run)
    c = claim(orch)
    orch.mark_task_running(**lease_of(c), now=at(2))
    return task


def _queued(orch, run):
    return enqueue(orch, run)


def _completed(orch, run):
    task = enqueue(orch, run)
    c = claim(orch)
    orch.complete_task(**lease_of(c), now=at(2))
    return task


@pytest.mark.parametrize(
    ("make", "status"),
    [(_queued, "queued"), (_leased, "leased"), (_running, "running"), (_completed, "completed")],
)
def test_resume_task_refuses_a_task_that_is_not_paused(orch, run, make, status):
    task = make(orch, run)
    before = row_counts()

    with pytest.raises(InvalidTransitionError):
        orch.resume_task(task_id=task.id, now=at(5))

    assert row_counts() == before
    assert orch.get_task(task_id=task.id).status == status


# -- release_task -----------------------------------------------------------------------------


def test_release_task_puts_it_back_without_consuming_an_attempt(orch, run):
    task = enqueue(orch, run, max_attempts=2)
    c = claim(orch, now=at(1))
    assert c.task.attempt_count == 1
    before = len(event_types(orch, run.id))

    result = orch.release_task(**lease_of(c), reason="shutting down", now=at(2))

    assert result.status == "queued"
    stored = orch.get_task(task_id=task.id)
    assert stored.status == "queued"
    assert stored.attempt_count == 0
    assert (stored.lease_id, stored.leased_by, stored.lease_expires_at) == (None, None, None)
    assert Attempt.objects.get(pk=c.attempt.id).status == "released"
    assert Lease.objects.get(pk=c.lease.id).status == "released"
    events = orch.list_run_events(run_id=run.id)[before:]
    assert [e.event_type for e in events] == ["task.released"]
    assert events[0].payload["reason"] == "shutting down"
    assert orch.get_run(run_id=run.id).status == "active"


def test_a_released_task_is_claimable_at_once_with_the_same_attempt_number(orch, run):
    task = enqueue(orch, run, max_attempts=1)
    c = claim(orch, now=at(1))
    orch.release_task(**lease_of(c), now=at(2))

    again = claim(orch, "w2", now=at(2))

    assert again.task.id == task.id
    assert again.task.attempt_count == 1


def test_after_a_release_the_task_still_has_all_its_attempts(orch, run):
    task = enqueue(orch, run, max_attempts=2)
    c = orch.claim_next_task(worker_id="w1", lease_ms=1_000, now=at(1))
    orch.release_task(**lease_of(c), now=at(1))
    orch.claim_next_task(worker_id="w1", lease_ms=1_000, now=at(2))

    orch.expire_leases(now=at(10))

    stored = orch.get_task(task_id=task.id)
    assert stored.status == "queued"
    assert stored.dead is False


# -- fail_task --------------------------------------------------------------------------------


def test_fail_task_without_retry_is_terminal(orch, run):
    task = enqueue(orch, run, max_attempts=5)
    c = claim(orch, now=at(1))
    before = len(event_types(orch, run.id))

    result = orch.fail_task(**lease_of(c), error="bad input", metadata={"line": 3}, now=at(2))

    assert result.status == "failed"
    stored = orch.get_task(task_id=task.id)
    assert stored.status == "failed"
    assert stored.error == "bad input"
    assert stored.metadata == {"line": 3}
    assert stored.dead is False
    assert stored.completed_at == at(2)
    assert (stored.lease_id, stored.leased_by, stored.lease_expires_at) == (None, None, None)
    attempt = Attempt.objects.get(pk=c.attempt.id)
    assert attempt.status == "failed"
    assert attempt.error == "bad input"
    assert attempt.ended_at == at(2)
    assert Lease.objects.get(pk=c.lease.id).status == "released"
    events = orch.list_run_events(run_id=run.id)[before:]
    assert [e.event_type for e in events] == ["task.failed", "run.status.changed"]
    assert events[0].payload["error"] == "bad input"
    assert events[1].payload == {"from": "active", "to": "failed"}
    assert orch.get_run(run_id=run.id).status == "failed"
    assert orch.list_dead_tasks() == []


def test_fail_task_with_retry_requeues_with_the_backoff(orch, run):
    task = enqueue(orch, run, max_attempts=3, retry={"delay_ms": 2_000})
    c = claim(orch, now=at(1))
    before = len(event_types(orch, run.id))

    result = orch.fail_task(**lease_of(c), error="timeout", retry=True, now=at(5))

    assert result.status == "queued"
    stored = orch.get_task(task_id=task.id)
    assert stored.status == "queued"
    assert stored.not_before == at(7)
    assert stored.attempt_count == 1
    assert stored.dead is False
    assert (stored.lease_id, stored.leased_by, stored.lease_expires_at) == (None, None, None)
    assert Attempt.objects.get(pk=c.attempt.id).status == "failed"
    assert new_events(orch, run.id, before) == ["task.retry_scheduled"]
    assert orch.get_run(run_id=run.id).status == "active"
    assert claim(orch, now=at(6, ms=999)) is None
    assert claim(orch, now=at(7)).task.attempt_count == 2


@pytest.mark.parametrize("error", ["", None, 42])
def test_fail_task_needs_an_error(orch, run, error):
    task = enqueue(orch, run)
    c = claim(orch)
    before = row_counts()
    with pytest.raises(ValidationError):
        orch.fail_task(**lease_of(c), error=error, now=at(2))
    assert row_counts() == before
    assert orch.get_task(task_id=task.id).status == "leased"


# -- complete_task ----------------------------------------------------------------------------


def test_complete_task_stores_output_and_metadata(orch, run):
    task = enqueue(orch, run)
    c = claim(orch, now=at(1))
    orch.mark_task_running(**lease_of(c), now=at(2))
    before = len(event_types(orch, run.id))

    result = orch.complete_task(
        **lease_of(c), output={"rows": 10}, metadata={"duration_ms": 5}, now=at(3)
    )

    assert result.status == "completed"
    stored = orch.get_task(task_id=task.id)
    assert stored.status == "completed"
    assert stored.output == {"rows": 10}
    assert stored.metadata == {"duration_ms": 5}
    assert stored.error is None
    assert stored.progress == 1.0
    assert stored.started_at == at(2)
    assert stored.completed_at == at(3)
    assert (stored.lease_id, stored.leased_by, stored.lease_expires_at) == (None, None, None)
    attempt = Attempt.objects.get(pk=c.attempt.id)
    assert attempt.status == "completed"
    assert attempt.output == {"rows": 10}
    assert attempt.ended_at == at(3)
    assert Lease.objects.get(pk=c.lease.id).status == "released"
    assert new_events(orch, run.id, before) == ["task.completed", "run.status.changed"]
    assert orch.get_run(run_id=run.id).status == "completed"


def test_complete_task_with_next_context_appends_a_current_run_snapshot(orch):
    run = orch.create_run(context={"v": 0}, now=at(0))
    initial = run.current_context_snapshot_id
    task = enqueue(orch, run, kind="plan")
    c = claim(orch, now=at(1))
    before = len(event_types(orch, run.id))

    orch.complete_task(
        **lease_of(c), next_context={"v": 1}, next_context_label="plan.done", now=at(2)
    )

    current = orch.get_current_context_snapshot(run_id=run.id)
    assert current.id != initial
    assert current.payload == {"v": 1}
    assert current.label == "plan.done"
    assert current.scope == "run"
    assert current.task_id == task.id
    assert current.parent_snapshot_id == initial
    assert current.created_at == at(2)
    assert orch.get_run(run_id=run.id).current_context_snapshot_id == current.id
    # As in the original: the new context is recorded before the completion.
    assert new_events(orch, run.id, before) == [
        "context.snapshot.created",
        "task.completed",
        "run.status.changed",
    ]


def test_tasks_enqueued_after_a_completion_see_its_next_context(orch, run):
    enqueue(orch, run, kind="plan")
    enqueue(orch, run, kind="keeps-the-run-open", not_before=at(1_000))
    c = claim(orch)
    orch.complete_task(**lease_of(c), next_context={"plan": [1, 2]}, now=at(2))

    follow_up = enqueue(orch, run, kind="do", now=at(3))

    snapshot = ContextSnapshot.objects.get(pk=follow_up.context_snapshot_id)
    assert snapshot.payload == {"plan": [1, 2]}


def test_complete_task_next_context_label_defaults_to_kind_completed(orch, run):
    enqueue(orch, run, kind="plan")
    c = claim(orch)
    orch.complete_task(**lease_of(c), next_context={"v": 1}, now=at(2))

    assert orch.get_current_context_snapshot(run_id=run.id).label == "plan.completed"


def test_complete_task_that_fails_writes_no_snapshot(orch):
    run = orch.create_run(context={"v": 0}, now=at(0))
    task = enqueue(orch, run)
    c = orch.claim_next_task(worker_id="w1", lease_ms=1_000, now=at(1))
    before = row_counts()

    with pytest.raises(LeaseExpiredError):
        orch.complete_task(**lease_of(c), next_context={"v": 1}, now=at(5))

    assert row_counts() == before
    assert orch.get_current_context_snapshot(run_id=run.id).payload == {"v": 0}
    assert orch.get_task(task_id=task.id).status == "leased"


def test_complete_task_refuses_a_non_json_next_context(orch, run):
    task = enqueue(orch, run)
    c = claim(orch)
    before = row_counts()

    with pytest.raises(ValidationError):
        orch.complete_task(**lease_of(c), next_context={"x": object()}, now=at(2))

    assert row_counts() == before
    assert orch.get_task(task_id=task.id).status == "leased"


# -- reads ------------------------------------------------------------------------------------


@pytest.mark.parametrize("task_id", [uuid.uuid4(), str(uuid.uuid4()), "nope", ""])
def test_get_task_of_an_unknown_or_malformed_id_is_none(orch, run, task_id):
    enqueue(orch, run)
    assert orch.get_task(task_id=task_id) is None


def test_calls_on_an_unknown_task_raise_record_not_found(orch, run):
    missing = uuid.uuid4()
    lease = {"task_id": missing, "lease_id": uuid.uuid4(), "worker_id": "w1", "now": at(1)}
    calls = [
        lambda: orch.mark_task_running(**lease),
        lambda: orch.heartbeat_lease(**lease),
        lambda: orch.pause_task(status="blocked", **lease),
        lambda: orch.complete_task(**lease),
        lambda: orch.fail_task(error="x", **lease),
        lambda: orch.release_task(**lease),
        lambda: orch.resume_task(task_id=missing, now=at(1)),
        lambda: orch.requeue_dead_task(task_id=missing, now=at(1)),
    ]
    before = row_counts()
    for call in calls:
        with pytest.raises(RecordNotFoundError):
            call()
    assert row_counts() == before


def test_get_task_accepts_uuid_or_string(orch, run):
    task = enqueue(orch, run)
    assert orch.get_task(task_id=task.id).id == task.id
    assert orch.get_task(task_id=str(task.id)).id == task.id


def test_list_run_tasks_lists_every_task_of_the_run_only(orch, run):
    other = orch.create_run(now=at(0))
    a = enqueue(orch, run, kind="a")
    b = enqueue(orch, run, kind="b", depends_on=[a.id])
    enqueue(orch, other, kind="a")
    c = claim(orch, kinds=["a"])
    orch.complete_task(**lease_of(c), now=at(2))

    tasks = orch.list_run_tasks(run_id=run.id)

    assert {t.id for t in tasks} == {a.id, b.id}
    assert {t.id: t.status for t in tasks} == {a.id: "completed", b.id: "queued"}
    assert orch.list_run_tasks(run_id=uuid.uuid4()) == []


def test_timestamps_follow_the_now_argument(orch, run):
    task = enqueue(orch, run, now=at(1))
    c = claim(orch, now=at(2))
    orch.mark_task_running(**lease_of(c), now=at(3))
    orch.complete_task(**lease_of(c), now=at(4))

    stored = orch.get_task(task_id=task.id)
    assert (stored.created_at, stored.started_at, stored.completed_at, stored.updated_at) == (
        at(1),
        at(3),
        at(4),
        at(4),
    )
    assert [e.created_at for e in orch.list_run_events(run_id=run.id)][-3:] == [at(3), at(4), at(4)]
    assert orch.get_run(run_id=run.id).updated_at == at(4)


def test_a_task_scope_snapshot_derives_from_the_runs_current_one(orch):
    """As in the original: without parent_snapshot_id, a snapshot of either scope takes the
    run's current snapshot as its parent."""
    run = orch.create_run(context={"v": 0}, now=at(0))
    initial = run.current_context_snapshot_id
    task = enqueue(orch, run, kind="k")
    note = orch.append_context_snapshot(
        run_id=run.id, payload={"note": 1}, scope="task", task_id=task.id, now=at(1)
    )
    assert note.parent_snapshot_id == initial
    assert orch.get_run(run_id=run.id).current_context_snapshot_id == initial  # unchanged
    explicit = orch.append_context_snapshot(
        run_id=run.id, payload=2, scope="task", task_id=task.id, parent_snapshot_id=note.id
    )
    assert explicit.parent_snapshot_id == note.id
    bare = orch.create_run(now=at(0))
    other = enqueue(orch, bare, kind="k")
    orphan = orch.append_context_snapshot(run_id=bare.id, payload=3, scope="task", task_id=other.id)
    assert orphan.parent_snapshot_id is None  # a run without context has nothing to derive from

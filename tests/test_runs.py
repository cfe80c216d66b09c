"""Runs: create_run, get_run, cancel_run, list_runs, prune_runs."""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta, timezone

import pytest
from django.db import connection

from parallel_mcp.exceptions import (
    LeaseConflictError,
    RecordNotFoundError,
    RunTerminalError,
    ValidationError,
)
from parallel_mcp.models import (
    Attempt,
    ClientTokenRecord,
    ContextSnapshot,
    Event,
    Lease,
    Run,
    Task,
    TaskDependency,
)
from tests.conftest import at, claim, event_types

pytestmark = pytest.mark.django_db

RUN_SCOPED_MODELS = (
    Task,
    TaskDependency,
    Attempt,
    Lease,
    ContextSnapshot,
    Event,
    ClientTokenRecord,
)


def row_counts() -> dict[str, int]:
    models = (Run, *RUN_SCOPED_MODELS)
    return {model.__name__: model.objects.count() for model in models}


def rows_of_run(run_id) -> dict[str, int]:
    return {
        model.__name__: model.objects.filter(run_id=run_id).count() for model in RUN_SCOPED_MODELS
    }


def completed_run(orch, *, at_s: float, tag: str, namespace: str = "tests"):
    """A run with one task, completed at ``at(at_s)`` (so its updated_at is that time)."""
    run = orch.create_run(namespace=namespace, now=at(at_s - 1))
    task = orch.enqueue_task(run_id=run.id, kind=tag, now=at(at_s - 1))
    c = orch.claim_next_task(worker_id="w", kinds=[tag], now=at(at_s - 1))
    assert c.task.id == task.id
    orch.complete_task(task_id=task.id, lease_id=c.lease.id, worker_id="w", now=at(at_s))
    run = orch.get_run(run_id=run.id)
    assert run.status == "completed"
    assert run.updated_at == at(at_s)
    return run


def failed_run(orch, *, at_s: float, tag: str):
    run = orch.create_run(now=at(at_s - 1))
    task = orch.enqueue_task(run_id=run.id, kind=tag, now=at(at_s - 1))
    c = orch.claim_next_task(worker_id="w", kinds=[tag], now=at(at_s - 1))
    orch.fail_task(task_id=task.id, lease_id=c.lease.id, worker_id="w", error="x", now=at(at_s))
    run = orch.get_run(run_id=run.id)
    assert run.status == "failed"
    return run


def cancelled_run(orch, *, at_s: float):
    run = orch.create_run(now=at(at_s - 1))
    run = orch.cancel_run(run_id=run.id, now=at(at_s))
    assert run.status == "cancelled"
    return run


# -- create_run -------------------------------------------------------------------------------


def test_create_run_defaults(orch):
    run = orch.create_run(now=at(0))

    assert isinstance(run.id, uuid.UUID)
    assert run.namespace == "default"
    assert run.external_id is None
    assert run.metadata is None
    assert run.status == "pending"
    assert run.current_context_snapshot_id is None
    assert run.created_at == at(0)
    assert run.updated_at == at(0)
    assert orch.get_current_context_snapshot(run_id=run.id) is None
    assert event_types(orch, run.id) == ["run.created"]


def test_create_run_stores_namespace_external_id_and_metadata(orch):
    run = orch.create_run(
        namespace="billing",
        external_id="order-42",
        metadata={"owner": "ops", "n": [1, 2]},
        now=at(0),
    )

    stored = orch.get_run(run_id=run.id)
    assert stored.namespace == "billing"
    assert stored.external_id == "order-42"
    assert stored.metadata == {"owner": "ops", "n": [1, 2]}


def test_create_run_with_context_makes_an_initial_snapshot_current(orch):
    run = orch.create_run(context={"repo": "acme"}, now=at(0))

    snapshot = orch.get_current_context_snapshot(run_id=run.id)
    assert snapshot is not None
    assert run.current_context_snapshot_id == snapshot.id
    assert orch.get_run(run_id=run.id).current_context_snapshot_id == snapshot.id
    assert snapshot.label == "run.initial"
    assert snapshot.scope == "run"
    assert snapshot.payload == {"repo": "acme"}
    assert snapshot.task_id is None
    assert snapshot.parent_snapshot_id is None
    assert snapshot.created_at == at(0)
    assert event_types(orch, run.id) == ["run.created", "context.snapshot.created"]


@pytest.mark.parametrize("as_string", [False, True])
def test_create_run_with_explicit_id(orch, as_string):
    wanted = uuid.uuid4()
    run = orch.create_run(id=str(wanted) if as_string else wanted, now=at(0))

    assert run.id == wanted
    assert orch.get_run(run_id=wanted).id == wanted


def test_create_run_with_duplicate_id_is_refused_and_writes_nothing(orch):
    first = orch.create_run(namespace="first", now=at(0))
    before = row_counts()

    with pytest.raises(ValidationError):
        orch.create_run(id=first.id, namespace="second", context={"a": 1}, now=at(1))

    assert row_counts() == before
    assert orch.get_run(run_id=first.id).namespace == "first"


@pytest.mark.parametrize("namespace", ["", "   ", None, 42])
def test_create_run_refuses_a_bad_namespace(orch, namespace):
    before = row_counts()
    with pytest.raises(ValidationError):
        orch.create_run(namespace=namespace, now=at(0))
    assert row_counts() == before


@pytest.mark.parametrize("argument", ["metadata", "context"])
@pytest.mark.parametrize("value", [{"x": object()}, {"x": {1, 2}}, float("nan")])
def test_create_run_refuses_non_json_values(orch, argument, value):
    before = row_counts()
    with pytest.raises(ValidationError):
        orch.create_run(now=at(0), **{argument: value})
    assert row_counts() == before


def test_create_run_refuses_a_naive_now(orch):
    with pytest.raises(ValidationError):
        orch.create_run(now=datetime(2026, 1, 1, 12, 0, 0))
    assert Run.objects.count() == 0


def test_create_run_stores_an_aware_now_of_any_zone_as_the_same_instant(orch):
    plus_two = timezone(timedelta(hours=2))
    run = orch.create_run(now=at(0).astimezone(plus_two))

    stored = orch.get_run(run_id=run.id)
    assert stored.created_at == at(0)
    assert stored.updated_at == at(0)


def test_create_run_refuses_a_malformed_id(orch):
    with pytest.raises(ValidationError):
        orch.create_run(id="not-a-uuid", now=at(0))
    assert Run.objects.count() == 0


# -- get_run ----------------------------------------------------------------------------------


def test_get_run_accepts_uuid_or_string(orch, run):
    assert orch.get_run(run_id=run.id).id == run.id
    assert orch.get_run(run_id=str(run.id)).id == run.id


@pytest.mark.parametrize("run_id", [uuid.uuid4(), str(uuid.uuid4()), "not-a-uuid", "", 12345])
def test_get_run_of_an_unknown_or_malformed_id_is_none(orch, run, run_id):
    assert orch.get_run(run_id=run_id) is None


# -- cancel_run -------------------------------------------------------------------------------


def _run_with_tasks_in_every_live_state(orch, run):
    """queued, leased, running and blocked tasks in ``run`` (claims take priority order)."""
    leased = orch.enqueue_task(run_id=run.id, kind="k", priority=3, now=at(0))
    running = orch.enqueue_task(run_id=run.id, kind="k", priority=2, now=at(0))
    blocked = orch.enqueue_task(run_id=run.id, kind="k", priority=1, now=at(0))
    queued = orch.enqueue_task(run_id=run.id, kind="k", priority=0, now=at(0))
    c_leased = claim(orch, "w-leased", now=at(1))
    c_running = claim(orch, "w-running", now=at(1))
    c_blocked = claim(orch, "w-blocked", now=at(1))
    assert (c_leased.task.id, c_running.task.id, c_blocked.task.id) == (
        leased.id,
        running.id,
        blocked.id,
    )
    orch.mark_task_running(
        task_id=running.id, lease_id=c_running.lease.id, worker_id="w-running", now=at(2)
    )
    orch.pause_task(
        task_id=blocked.id,
        lease_id=c_blocked.lease.id,
        worker_id="w-blocked",
        status="blocked",
        now=at(2),
    )
    return {
        "queued": (queued, None),
        "leased": (leased, c_leased),
        "running": (running, c_running),
        "blocked": (blocked, c_blocked),
    }


def test_cancel_run_cancels_every_non_terminal_task(orch, run):
    tasks = _run_with_tasks_in_every_live_state(orch, run)

    result = orch.cancel_run(run_id=run.id, reason="operator stop", now=at(10))

    assert result.status == "cancelled"
    assert result.updated_at == at(10)
    for task, _ in tasks.values():
        stored = orch.get_task(task_id=task.id)
        assert stored.status == "cancelled"
        assert stored.completed_at == at(10)
        assert (stored.lease_id, stored.leased_by, stored.lease_expires_at) == (None, None, None)
    assert orch.get_run(run_id=run.id).status == "cancelled"


def test_cancel_run_events_one_task_cancelled_per_task_then_run_cancelled(orch, run):
    tasks = _run_with_tasks_in_every_live_state(orch, run)
    before = len(orch.list_run_events(run_id=run.id))

    orch.cancel_run(run_id=run.id, reason="operator stop", now=at(10))

    new_events = orch.list_run_events(run_id=run.id)[before:]
    assert [e.event_type for e in new_events] == [
        "task.cancelled",
        "task.cancelled",
        "task.cancelled",
        "task.cancelled",
        "run.cancelled",
        "run.status.changed",
    ]
    assert {e.task_id for e in new_events[:4]} == {task.id for task, _ in tasks.values()}
    assert new_events[4].payload["reason"] == "operator stop"
    assert new_events[5].payload == {"from": "active", "to": "cancelled"}


def test_cancel_run_closes_the_attempts_and_leases_of_leased_and_running_tasks(orch, run):
    tasks = _run_with_tasks_in_every_live_state(orch, run)

    orch.cancel_run(run_id=run.id, now=at(10))

    for state in ("leased", "running"):
        lease_id = tasks[state][1].lease.id
        attempt = Attempt.objects.get(pk=lease_id)
        lease = Lease.objects.get(pk=lease_id)
        assert attempt.status == "cancelled"
        assert attempt.ended_at == at(10)
        assert lease.status == "cancelled"
        assert lease.released_at == at(10)
    # The paused task's attempt had already ended when it paused.
    paused_attempt = Attempt.objects.get(pk=tasks["blocked"][1].lease.id)
    assert paused_attempt.status == "released"
    assert paused_attempt.ended_at == at(2)


def test_cancel_run_leaves_terminal_tasks_alone(orch, run):
    done = orch.enqueue_task(run_id=run.id, kind="k", priority=1, now=at(0))
    pending = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    c = claim(orch)
    orch.complete_task(task_id=done.id, lease_id=c.lease.id, worker_id="w1", now=at(2))

    orch.cancel_run(run_id=run.id, now=at(10))

    stored_done = orch.get_task(task_id=done.id)
    assert stored_done.status == "completed"
    assert stored_done.completed_at == at(2)
    assert orch.get_task(task_id=pending.id).status == "cancelled"
    cancelled_ids = [
        e.task_id for e in orch.list_run_events(run_id=run.id) if e.event_type == "task.cancelled"
    ]
    assert cancelled_ids == [pending.id]


def test_cancel_run_of_a_run_without_tasks(orch, run):
    result = orch.cancel_run(run_id=run.id, now=at(5))

    assert result.status == "cancelled"
    assert event_types(orch, run.id) == ["run.created", "run.cancelled", "run.status.changed"]


@pytest.mark.parametrize("call", ["heartbeat", "complete", "fail", "mark_running", "release"])
def test_a_worker_holding_a_lease_on_a_cancelled_run_gets_a_lease_conflict(orch, run, call):
    task = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    c = claim(orch)
    orch.cancel_run(run_id=run.id, now=at(2))
    events_before = Event.objects.count()

    lease = {"task_id": task.id, "lease_id": c.lease.id, "worker_id": "w1", "now": at(3)}
    with pytest.raises(LeaseConflictError):
        if call == "heartbeat":
            orch.heartbeat_lease(**lease)
        elif call == "complete":
            orch.complete_task(output={"late": True}, **lease)
        elif call == "fail":
            orch.fail_task(error="late", **lease)
        elif call == "mark_running":
            orch.mark_task_running(**lease)
        else:
            orch.release_task(**lease)

    stored = orch.get_task(task_id=task.id)
    assert stored.status == "cancelled"
    assert stored.output is None
    assert Event.objects.count() == events_before


def test_cancel_run_also_cancels_tasks_that_could_never_run(orch, run):
    upstream = orch.enqueue_task(run_id=run.id, kind="up", now=at(0))
    stuck = orch.enqueue_task(run_id=run.id, kind="down", depends_on=[upstream.id], now=at(0))
    other = orch.enqueue_task(run_id=run.id, kind="other", now=at(0))
    c = claim(orch, kinds=["up"])
    orch.fail_task(
        task_id=upstream.id, lease_id=c.lease.id, worker_id="w1", error="boom", now=at(2)
    )
    assert orch.get_run(run_id=run.id).status == "active"

    orch.cancel_run(run_id=run.id, now=at(3))

    statuses = {t.id: t.status for t in orch.list_run_tasks(run_id=run.id)}
    assert statuses == {upstream.id: "failed", stuck.id: "cancelled", other.id: "cancelled"}
    assert orch.get_run(run_id=run.id).status == "cancelled"


def test_cancel_run_of_an_unknown_run(orch, run):
    before = row_counts()
    with pytest.raises(RecordNotFoundError):
        orch.cancel_run(run_id=uuid.uuid4(), now=at(1))
    with pytest.raises(ValidationError):
        orch.cancel_run(run_id="not-a-uuid", now=at(1))
    assert row_counts() == before


def test_cancel_run_of_a_terminal_run_returns_it_unchanged(orch):
    done = completed_run(orch, at_s=5, tag="k")
    events_before = event_types(orch, done.id)

    result = orch.cancel_run(run_id=done.id, reason="too late", now=at(50))

    assert result.id == done.id
    assert result.status == "completed"
    assert result.updated_at == at(5)
    assert orch.get_run(run_id=done.id).status == "completed"
    assert orch.get_run(run_id=done.id).updated_at == at(5)
    assert event_types(orch, done.id) == events_before


def test_cancel_run_twice_is_a_no_op_the_second_time(orch, run):
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    orch.cancel_run(run_id=run.id, now=at(5))
    events_before = event_types(orch, run.id)

    result = orch.cancel_run(run_id=run.id, now=at(9))

    assert result.status == "cancelled"
    assert result.updated_at == at(5)
    assert event_types(orch, run.id) == events_before


def test_no_task_can_be_added_to_a_cancelled_run(orch, run):
    orch.cancel_run(run_id=run.id, now=at(5))
    with pytest.raises(RunTerminalError):
        orch.enqueue_task(run_id=run.id, kind="k", now=at(6))


# -- list_runs --------------------------------------------------------------------------------


@pytest.fixture
def three_runs(orch):
    """r1: alpha/x-1, created 10, cancelled at 50; r2: alpha/x-2, created 20, active at 25;
    r3: beta/x-1, created 30, pending at 30."""
    r1 = orch.create_run(namespace="alpha", external_id="x-1", now=at(10))
    r2 = orch.create_run(namespace="alpha", external_id="x-2", now=at(20))
    r3 = orch.create_run(namespace="beta", external_id="x-1", now=at(30))
    orch.enqueue_task(run_id=r2.id, kind="k", now=at(25))
    orch.cancel_run(run_id=r1.id, now=at(50))
    return r1.id, r2.id, r3.id


def ids(runs) -> list:
    return [r.id for r in runs]


def test_list_runs_default_order_is_most_recently_updated_first(orch, three_runs):
    r1, r2, r3 = three_runs
    assert ids(orch.list_runs()) == [r1, r3, r2]


def test_list_runs_filters_by_namespace(orch, three_runs):
    r1, r2, _ = three_runs
    assert set(ids(orch.list_runs(namespace="alpha"))) == {r1, r2}
    assert orch.list_runs(namespace="nope") == []


def test_list_runs_filters_by_statuses(orch, three_runs):
    r1, r2, r3 = three_runs
    assert set(ids(orch.list_runs(statuses=["active", "pending"]))) == {r2, r3}
    assert ids(orch.list_runs(statuses=["cancelled"])) == [r1]
    assert orch.list_runs(statuses=["completed"]) == []


def test_list_runs_filters_by_external_id(orch, three_runs):
    r1, _, r3 = three_runs
    assert set(ids(orch.list_runs(external_id="x-1"))) == {r1, r3}


def test_list_runs_updated_after_is_inclusive(orch, three_runs):
    r1, _, r3 = three_runs
    assert set(ids(orch.list_runs(updated_after=at(30)))) == {r1, r3}


def test_list_runs_updated_before_is_exclusive(orch, three_runs):
    _, r2, _ = three_runs
    assert ids(orch.list_runs(updated_before=at(30))) == [r2]


def test_list_runs_combines_filters(orch, three_runs):
    _, r2, r3 = three_runs
    window = orch.list_runs(updated_after=at(25), updated_before=at(50))
    assert set(ids(window)) == {r2, r3}
    assert ids(orch.list_runs(namespace="alpha", updated_after=at(25), updated_before=at(50))) == [
        r2
    ]


@pytest.mark.parametrize(
    ("order_by", "order_dir", "expected"),
    [
        ("updated_at", "desc", ["r1", "r3", "r2"]),
        ("updated_at", "asc", ["r2", "r3", "r1"]),
        ("created_at", "desc", ["r3", "r2", "r1"]),
        ("created_at", "asc", ["r1", "r2", "r3"]),
    ],
)
def test_list_runs_order_by_and_direction(orch, three_runs, order_by, order_dir, expected):
    by_name = dict(zip(["r1", "r2", "r3"], three_runs, strict=True))
    result = orch.list_runs(order_by=order_by, order_dir=order_dir)
    assert ids(result) == [by_name[name] for name in expected]


def test_list_runs_limit_and_offset_page_through_the_order(orch, three_runs):
    r1, r2, r3 = three_runs
    assert ids(orch.list_runs(limit=2)) == [r1, r3]
    assert ids(orch.list_runs(limit=2, offset=2)) == [r2]
    assert ids(orch.list_runs(limit=1, offset=1)) == [r3]
    assert orch.list_runs(offset=3) == []


def test_list_runs_returns_at_most_100_runs_by_default(orch):
    for i in range(101):
        orch.create_run(now=at(i))

    runs = orch.list_runs()

    assert len(runs) == 100
    assert runs[0].updated_at == at(100)
    assert len(orch.list_runs(limit=101)) == 101


def _claimed(orch, run, task):
    return orch.claim_next_task(worker_id="w", kinds=["k"], lease_ms=1_000, now=at(10))


def _running(orch, run, task):
    c = orch.claim_next_task(worker_id="w", kinds=["k"], lease_ms=60_000, now=at(5))
    orch.mark_task_running(task_id=task.id, lease_id=c.lease.id, worker_id="w", now=at(10))


def _released(orch, run, task):
    c = orch.claim_next_task(worker_id="w", kinds=["k"], lease_ms=60_000, now=at(5))
    orch.release_task(task_id=task.id, lease_id=c.lease.id, worker_id="w", now=at(10))


def _failed_with_retry(orch, run, task):
    c = orch.claim_next_task(worker_id="w", kinds=["k"], lease_ms=60_000, now=at(5))
    orch.fail_task(
        task_id=task.id, lease_id=c.lease.id, worker_id="w", error="e", retry=True, now=at(10)
    )


def _expired(orch, run, task):
    orch.claim_next_task(worker_id="w", kinds=["k"], lease_ms=1_000, now=at(5))
    orch.expire_leases(now=at(10))


@pytest.mark.parametrize("activity", [_released, _failed_with_retry, _expired])
def test_task_moves_under_the_run_lock_bump_the_runs_updated_at(orch, run, activity):
    task = orch.enqueue_task(run_id=run.id, kind="k", max_attempts=5, now=at(1))
    orch.enqueue_task(run_id=run.id, kind="later", not_before=at(10_000), now=at(1))

    activity(orch, run, task)

    assert orch.get_run(run_id=run.id).updated_at == at(10)
    assert ids(orch.list_runs(updated_after=at(10))) == [run.id]


@pytest.mark.parametrize("activity", [_claimed, _running])
def test_claims_and_running_do_not_write_the_run_row(orch, run, activity):
    """Claims stay off the run row so workers of one run never queue on its lock
    (docs/lifecycle.md: what moves Run.updated_at)."""
    task = orch.enqueue_task(run_id=run.id, kind="k", max_attempts=5, now=at(1))

    activity(orch, run, task)

    assert orch.get_run(run_id=run.id).updated_at == at(1)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"order_by": "status"},
        {"order_by": "id; drop table pmcp_run"},
        {"order_dir": "up"},
        {"statuses": ["running"]},
        {"limit": 0},
        {"offset": -1},
    ],
)
def test_list_runs_refuses_bad_arguments(orch, three_runs, kwargs):
    with pytest.raises(ValidationError):
        orch.list_runs(**kwargs)


# -- prune_runs -------------------------------------------------------------------------------


def _rich_run(orch, tag: str, start: float):
    """A run completed at ``at(start + 6)`` with a row in every run-scoped table."""
    run = orch.create_run(namespace=tag, context={"v": 0}, now=at(start))
    first = orch.enqueue_task(run_id=run.id, kind=f"{tag}-a", key="a", now=at(start))
    second = orch.enqueue_task(
        run_id=run.id, kind=f"{tag}-b", depends_on=[first.id], max_attempts=3, now=at(start)
    )
    c1 = orch.claim_next_task(
        worker_id="w", kinds=[f"{tag}-a"], client_token=f"{tag}-claim", now=at(start + 1)
    )
    orch.mark_task_running(task_id=first.id, lease_id=c1.lease.id, worker_id="w", now=at(start + 1))
    orch.heartbeat_lease(task_id=first.id, lease_id=c1.lease.id, worker_id="w", now=at(start + 1))
    orch.complete_task(
        task_id=first.id,
        lease_id=c1.lease.id,
        worker_id="w",
        next_context={"v": 1},
        client_token=f"{tag}-complete",
        now=at(start + 2),
    )
    orch.append_context_snapshot(
        run_id=run.id, payload={"note": 1}, scope="task", task_id=second.id, now=at(start + 2)
    )
    c2 = orch.claim_next_task(worker_id="w", kinds=[f"{tag}-b"], now=at(start + 3))
    orch.fail_task(
        task_id=second.id,
        lease_id=c2.lease.id,
        worker_id="w",
        error="flaky",
        retry=True,
        client_token=f"{tag}-fail",
        now=at(start + 4),
    )
    c3 = orch.claim_next_task(worker_id="w", kinds=[f"{tag}-b"], now=at(start + 5))
    orch.complete_task(task_id=second.id, lease_id=c3.lease.id, worker_id="w", now=at(start + 6))
    run = orch.get_run(run_id=run.id)
    assert run.status == "completed"
    assert all(count > 0 for count in rows_of_run(run.id).values()), rows_of_run(run.id)
    return run


def test_prune_runs_deletes_every_row_of_a_pruned_run_and_nothing_else(orch):
    old = _rich_run(orch, "old", start=0)
    recent = _rich_run(orch, "recent", start=100)
    old_active = orch.create_run(namespace="live", now=at(0))
    orch.enqueue_task(run_id=old_active.id, kind="live", now=at(0))
    kept_before = {run_id: rows_of_run(run_id) for run_id in (recent.id, old_active.id)}
    old_task_ids = list(Task.objects.filter(run_id=old.id).values_list("id", flat=True))

    result = orch.prune_runs(older_than=at(50), now=at(200))
    connection.check_constraints()  # no row left pointing at a deleted one

    assert result.pruned_run_ids == [old.id]
    assert result.count == 1
    assert orch.get_run(run_id=old.id) is None
    assert rows_of_run(old.id) == dict.fromkeys(rows_of_run(old.id), 0)
    assert not Task.objects.filter(id__in=old_task_ids).exists()
    assert not Event.objects.filter(task_id__in=old_task_ids).exists()
    assert not TaskDependency.objects.filter(depends_on_id__in=old_task_ids).exists()
    for run_id, counts in kept_before.items():
        assert orch.get_run(run_id=run_id) is not None
        assert rows_of_run(run_id) == counts


def test_prune_runs_never_deletes_non_terminal_runs(orch):
    pending = orch.create_run(now=at(0))
    active = orch.create_run(now=at(0))
    orch.enqueue_task(run_id=active.id, kind="a", now=at(0))
    waiting = orch.create_run(now=at(0))
    paused = orch.enqueue_task(run_id=waiting.id, kind="w", now=at(0))
    c = orch.claim_next_task(worker_id="w", kinds=["w"], now=at(0))
    orch.pause_task(
        task_id=paused.id, lease_id=c.lease.id, worker_id="w", status="waiting_input", now=at(0)
    )
    assert orch.get_run(run_id=waiting.id).status == "waiting"

    result = orch.prune_runs(older_than=at(100), now=at(100))

    assert result.count == 0
    assert result.pruned_run_ids == []
    assert set(Run.objects.values_list("id", flat=True)) == {pending.id, active.id, waiting.id}


@pytest.mark.parametrize(
    "statuses", [["active"], ["pending"], ["waiting"], ["completed", "active"], "active"]
)
def test_prune_runs_asking_for_a_non_terminal_status_raises_and_deletes_nothing(orch, statuses):
    completed_run(orch, at_s=5, tag="k")
    active = orch.create_run(now=at(0))
    orch.enqueue_task(run_id=active.id, kind="a", now=at(0))
    before = row_counts()

    with pytest.raises(ValidationError):
        orch.prune_runs(older_than=at(100), statuses=statuses, now=at(100))

    assert row_counts() == before


def test_prune_runs_statuses_selects_which_terminal_runs(orch):
    done = completed_run(orch, at_s=5, tag="c")
    failed = failed_run(orch, at_s=5, tag="f")
    cancelled = cancelled_run(orch, at_s=5)

    result = orch.prune_runs(older_than=at(100), statuses=["failed"], now=at(100))

    assert result.pruned_run_ids == [failed.id]
    assert orch.get_run(run_id=done.id) is not None
    assert orch.get_run(run_id=cancelled.id) is not None


def test_prune_runs_by_default_prunes_completed_failed_and_cancelled(orch):
    runs = [
        completed_run(orch, at_s=5, tag="c"),
        failed_run(orch, at_s=6, tag="f"),
        cancelled_run(orch, at_s=7),
    ]

    result = orch.prune_runs(older_than=at(100), now=at(100))

    assert set(result.pruned_run_ids) == {run.id for run in runs}
    assert result.count == 3
    assert Run.objects.count() == 0


def test_prune_runs_limit_takes_the_oldest_first(orch):
    r1 = completed_run(orch, at_s=3, tag="a")
    r2 = completed_run(orch, at_s=1, tag="b")
    r3 = completed_run(orch, at_s=2, tag="c")

    result = orch.prune_runs(older_than=at(100), limit=2, now=at(100))

    assert result.pruned_run_ids == [r2.id, r3.id]
    assert result.count == 2
    assert ids(orch.list_runs()) == [r1.id]


def test_prune_runs_with_a_timedelta_counts_back_from_now_strictly(orch):
    older = completed_run(orch, at_s=49, tag="a")
    boundary = completed_run(orch, at_s=50, tag="b")

    result = orch.prune_runs(older_than=timedelta(seconds=50), now=at(100))

    assert result.pruned_run_ids == [older.id]
    assert orch.get_run(run_id=boundary.id) is not None


def test_prune_runs_with_a_datetime_cutoff_is_strict(orch):
    older = completed_run(orch, at_s=49, tag="a")
    boundary = completed_run(orch, at_s=50, tag="b")

    result = orch.prune_runs(older_than=at(50), now=at(100))

    assert result.pruned_run_ids == [older.id]
    assert orch.get_run(run_id=boundary.id) is not None


@pytest.mark.parametrize(
    "older_than", [None, "yesterday", timedelta(seconds=-1), datetime(2026, 1, 1)]
)
def test_prune_runs_refuses_a_bad_cutoff(orch, older_than):
    completed_run(orch, at_s=5, tag="k")
    before = row_counts()
    with pytest.raises(ValidationError):
        orch.prune_runs(older_than=older_than, now=at(100))
    assert row_counts() == before

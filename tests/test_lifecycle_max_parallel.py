"""Lifecycle extensions: create_run(max_parallel=N)."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter

import pytest
from django.conf import settings
from django.db import connections

from parallel_mcp.exceptions import ValidationError
from parallel_mcp.models import Event, Run, Task
from tests.conftest import assert_reads_the_claim_index_in_order, at, claim_query_plan, live_worker
from tests.subprocesses import start, wait_all

pytestmark = pytest.mark.django_db

IN_FLIGHT = ("leased", "running")
IS_POSTGRES = settings.DATABASES["default"]["ENGINE"].endswith("postgresql")


def lease_of(c, worker="w") -> dict:
    return {"task_id": c.task.id, "lease_id": c.lease.id, "worker_id": worker}


def in_flight(run) -> int:
    return Task.objects.filter(run_id=run.id, status__in=IN_FLIGHT).count()


def claim_all(orch, now, worker="w", **kwargs) -> list:
    kwargs.setdefault("lease_ms", 600_000)
    claims = []
    while (c := orch.claim_next_task(worker_id=worker, now=now, **kwargs)) is not None:
        claims.append(c)
        assert len(claims) < 1000
    return claims


@pytest.fixture
def limited(orch):
    return orch.create_run(namespace="limited", max_parallel=2, now=at(0))


def fill(orch, run, count, **kwargs):
    return orch.enqueue_tasks(
        run_id=run.id,
        tasks=[{"kind": "k", "key": f"t{index}", **kwargs} for index in range(count)],
        now=at(0),
    )


# -- validation -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [0, -1, "2", True, 2.0, [2]])
def test_create_run_refuses_a_bad_max_parallel(orch, bad):
    before = Run.objects.count()
    with pytest.raises(ValidationError) as info:
        orch.create_run(max_parallel=bad, now=at(0))
    assert info.value.details.get("field") == "max_parallel"
    assert Run.objects.count() == before


@pytest.mark.parametrize("good", [None, 1, 50])
def test_create_run_accepts_max_parallel(orch, good):
    run = orch.create_run(max_parallel=good, now=at(0))
    assert Run.objects.get(pk=run.id).max_parallel == good
    [created] = Event.objects.filter(run_id=run.id, event_type="run.created")
    assert created.payload["max_parallel"] == good


# -- the limit --------------------------------------------------------------------------------


def test_at_most_n_tasks_leased_or_running(orch, limited):
    fill(orch, limited, 6)
    claims = claim_all(orch, at(1))
    assert len(claims) == 2
    assert in_flight(limited) == 2
    orch.mark_task_running(**lease_of(claims[0]), now=at(2))
    assert orch.claim_next_task(worker_id="w", now=at(2)) is None
    assert orch.get_run(run_id=limited.id).status == "active"

    orch.complete_task(**lease_of(claims[0]), now=at(3))
    [third] = claim_all(orch, at(4))
    assert in_flight(limited) == 2
    orch.fail_task(**lease_of(claims[1]), error="x", now=at(5))
    [fourth] = claim_all(orch, at(6))
    assert {third.task.key, fourth.task.key} == {"t2", "t3"}
    assert in_flight(limited) == 2


def test_other_runs_claim_past_a_run_at_its_limit(orch, limited):
    fill(orch, limited, 20, priority=10)
    other = orch.create_run(namespace="free", now=at(0))
    others = [orch.enqueue_task(run_id=other.id, kind="k", priority=0, now=at(5)) for _ in range(3)]
    claims = claim_all(orch, at(6))
    assert Counter(c.run.id for c in claims) == {limited.id: 2, other.id: 3}
    assert {c.task.id for c in claims if c.run.id == other.id} == {t.id for t in others}


@pytest.mark.slow
def test_claim_query_uses_the_claim_index_with_a_big_limited_backlog(orch):
    busy = orch.create_run(max_parallel=2, now=at(0))
    orch.enqueue_tasks(
        run_id=busy.id,
        tasks=[{"kind": "k", "priority": 5} for _ in range(2000)],
        now=at(0),
    )
    other = orch.create_run(now=at(0))
    mine = orch.enqueue_task(run_id=other.id, kind="k", priority=0, now=at(1))
    claim_all(orch, at(2), kinds=["k"])  # takes the two slots of busy, then mine
    assert in_flight(busy) == 2
    orch.enqueue_task(run_id=other.id, kind="k", priority=0, now=at(3))
    plan = claim_query_plan(at(4))

    assert_reads_the_claim_index_in_order(plan)
    assert Task.objects.get(pk=mine.id).status == "leased"
    c = orch.claim_next_task(worker_id="w", now=at(4))
    assert c is not None and c.run.id == other.id


def hand_out_plan(run, *, generic: bool = False) -> str:
    """The database's plan for the slot hand-out of ``run`` (services.write.hand_out_sql);
    ``generic``: PostgreSQL's generic plan, as the write path runs it (dialect.py)."""
    from django.db import connection, transaction

    from parallel_mcp.services.dialect import dialect_for
    from parallel_mcp.services.write import hand_out_sql

    sql, params = hand_out_sql(dialect_for("default"), run.id, run.max_parallel, at(10))
    explain = "EXPLAIN QUERY PLAN " if connection.vendor == "sqlite" else "EXPLAIN "
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("ANALYZE pmcp_task")
            # The test database's tables carry the dead rows of earlier tests, which make a
            # sequential scan look as cheap as any: the point is which index can serve.
            cursor.execute("SET LOCAL enable_seqscan = off")
            if generic:
                numbered = sql.split("%s")
                sql = "".join(f"{part}${n}" for n, part in enumerate(numbered[:-1], 1))
                cursor.execute(f"PREPARE hand_out AS {sql}{numbered[-1]}")
                cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
                cursor.execute(
                    f"EXPLAIN EXECUTE hand_out({', '.join(['%s'] * len(params))})", params
                )
                plan = [row[0] for row in cursor.fetchall()]
                cursor.execute("DEALLOCATE hand_out")
                return "\n".join(plan)
        cursor.execute(explain + sql, params)
        return "\n".join(" ".join(str(part) for part in row) for row in cursor.fetchall())


@pytest.mark.slow
def test_the_slot_hand_out_reads_the_runs_slots_not_its_backlog(orch):
    """The hand-out under the run lock reads the slot holders and the best waiting tasks as
    two ranges of pmcp_task_run_ready_idx (run, claimable, claim order) and the tasks in
    flight by pmcp_task_run_status_idx (SQLite): nothing in it grows with the run's ready
    backlog, or with the ready backlog of other runs (the claim index)."""
    busy = orch.create_run(max_parallel=2, now=at(0))
    orch.enqueue_tasks(run_id=busy.id, tasks=[{"kind": "k"} for _ in range(500)], now=at(0))
    other = orch.create_run(now=at(0))
    orch.enqueue_tasks(run_id=other.id, tasks=[{"kind": "k"} for _ in range(3000)], now=at(1))
    orch.claim_next_task(worker_id="w", now=at(1))  # one of busy's two slots in flight
    plan = hand_out_plan(busy)

    assert "Seq Scan" not in plan and "SCAN pmcp_task" not in plan, plan
    if IS_POSTGRES:
        # PostgreSQL picks between the run's indexes by its guesses (claimable and run_id
        # look independent to it, so it may read the run's queued tasks for the holders);
        # never the other runs' claimable backlog.
        assert "pmcp_task_claim_idx" not in plan, plan
        assert "(run_id = " in plan and "(claimable = false))" in plan, plan
    else:
        assert plan.count("pmcp_task_run_ready_idx (run_id=? AND claimable=?)") == 2, plan
    assert Task.objects.filter(run_id=busy.id, claimable=True, status="queued").count() == 1


def test_the_slot_hand_out_counts_the_tasks_in_flight_without_reading_finished_ones(orch):
    """The tasks in flight are counted as one (run, status) range per status of
    pmcp_task_run_status_idx: the run's finished tasks (all that ever ran) are never read.
    With ``status IN (…)`` PostgreSQL's generic plan (the write path's) read every task of
    the run by ``run_id`` alone."""
    run = orch.create_run(max_parallel=2, now=at(0))
    orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": "k"} for _ in range(300)], now=at(0))
    plan = hand_out_plan(run, generic=True)

    for status in ("leased", "running"):
        if IS_POSTGRES:
            assert any(
                "Index Cond: ((run_id = $" in line and f"'{status}'" in line
                for line in plan.splitlines()
            ), plan
        else:
            assert plan.count("pmcp_task_run_status_idx (run_id=? AND status=?)") == 2, plan


def test_freed_slots_go_to_the_best_task_priority_then_age(orch):
    run = orch.create_run(max_parallel=1, now=at(0))
    orch.enqueue_tasks(
        run_id=run.id,
        tasks=[
            {"kind": "k", "key": "low-1"},
            {"kind": "k", "key": "mid-1", "priority": 5},
            {"kind": "k", "key": "low-2"},
            {"kind": "k", "key": "mid-2", "priority": 5},
        ],
        now=at(0),
    )
    orch.enqueue_task(run_id=run.id, kind="k", key="low-0", now=at(-1))  # the oldest
    order = []
    for step in range(5):
        [c] = claim_all(orch, at(10 + step))
        order.append(c.task.key)
        if step == 0:
            # A better task arrives while the slot is taken: it gets the freed slot.
            orch.enqueue_task(run_id=run.id, kind="k", key="urgent", priority=9, now=at(10))
        orch.complete_task(**lease_of(c), now=at(10 + step))
    [c] = claim_all(orch, at(20))
    order.append(c.task.key)
    assert order == ["mid-1", "urgent", "mid-2", "low-0", "low-1", "low-2"]


@pytest.mark.parametrize("better", ["higher_priority", "older"])
def test_a_better_task_arriving_later_is_claimed_first(orch, better):
    live_worker("k")
    run = orch.create_run(max_parallel=1, now=at(0))
    plain = orch.enqueue_task(run_id=run.id, kind="k", key="plain", now=at(5))
    if better == "higher_priority":
        orch.enqueue_task(run_id=run.id, kind="k", key="best", priority=9, now=at(6))
    else:
        orch.enqueue_task(run_id=run.id, kind="k", key="best", now=at(1))
    [blocker] = orch.explain_task(task_id=plain.id, now=at(7))
    assert blocker.kind == "run_limit"
    c = orch.claim_next_task(worker_id="w", now=at(7))
    assert c.task.key == "best"
    assert orch.claim_next_task(worker_id="w", now=at(7)) is None
    orch.complete_task(**lease_of(c), now=at(8))
    c = orch.claim_next_task(worker_id="w", now=at(9))
    assert c.task.key == "plain"


def test_a_ready_dependent_waits_for_a_slot(orch):
    run = orch.create_run(max_parallel=1, now=at(0))
    a = orch.enqueue_task(run_id=run.id, kind="a", now=at(0))
    orch.enqueue_task(run_id=run.id, kind="b", depends_on=[a.id], priority=9, now=at(0))
    orch.enqueue_task(run_id=run.id, kind="c", now=at(1))
    [ca] = claim_all(orch, at(2))
    assert ca.task.id == a.id
    orch.complete_task(**lease_of(ca), now=at(3))
    # b became ready and outranks c for the freed slot.
    [cb] = claim_all(orch, at(4))
    assert cb.task.kind == "b"


@pytest.mark.parametrize("how", ["release", "expire", "fail_retry", "pause_resume", "cancel"])
def test_exits_keep_the_limit(orch, how):
    run = orch.create_run(max_parallel=2, now=at(0))
    fill(orch, run, 5, max_attempts=5)
    first, _ = claim_all(orch, at(1), lease_ms=30_000 if how == "expire" else 600_000)
    if how == "release":
        orch.release_task(**lease_of(first), now=at(2))
    elif how == "expire":
        assert orch.expire_leases(now=at(40)).count == 2
    elif how == "fail_retry":
        orch.fail_task(**lease_of(first), error="flaky", retry=True, now=at(2))
    elif how == "pause_resume":
        orch.pause_task(**lease_of(first), status="blocked", now=at(2))
    else:
        orch.cancel_task(task_id=first.task.id, now=at(2))
    assert in_flight(run) <= 2

    more = claim_all(orch, at(41))
    assert in_flight(run) == 2
    assert len(more) == (2 if how == "expire" else 1)
    if how == "pause_resume":
        orch.resume_task(task_id=first.task.id, now=at(42))
        assert claim_all(orch, at(43)) == []
        assert in_flight(run) == 2
    # Drain: the limit holds all the way.
    while in_flight(run):
        for task in Task.objects.filter(run_id=run.id, status__in=IN_FLIGHT):
            c = {"task_id": task.id, "lease_id": task.lease_id, "worker_id": task.leased_by}
            orch.complete_task(**c, now=at(50))
        claim_all(orch, at(50))
        assert in_flight(run) <= 2
    expected = "completed"
    assert orch.get_run(run_id=run.id).status == expected


def test_cancelling_a_queued_slot_holder_passes_the_slot_on(orch):
    live_worker("k")
    run = orch.create_run(max_parallel=1, now=at(0))
    first, second = fill(orch, run, 2)
    [blocker] = orch.explain_task(task_id=second.id, now=at(1))
    assert blocker.kind == "run_limit"
    orch.cancel_task(task_id=first.id, now=at(1))
    assert orch.explain_task(task_id=second.id, now=at(2)) == []
    [c] = claim_all(orch, at(2))
    assert c.task.id == second.id


def test_blocked_by_release_keeps_the_limit(orch):
    run = orch.create_run(max_parallel=1, now=at(0))
    waiter = orch.enqueue_task(run_id=run.id, kind="k", key="waiter", priority=9, now=at(0))
    x = orch.enqueue_task(run_id=run.id, kind="k", key="x", priority=5, now=at(0))
    orch.enqueue_task(run_id=run.id, kind="k", key="other", now=at(0))
    [c] = claim_all(orch, at(1))
    assert c.task.id == waiter.id
    orch.pause_task(**lease_of(c), status="blocked", blocked_by=[x.id], now=at(2))
    [cx] = claim_all(orch, at(3))
    assert cx.task.id == x.id
    orch.complete_task(**lease_of(cx), now=at(4))
    assert Task.objects.get(pk=waiter.id).status == "queued"
    [c] = claim_all(orch, at(5))
    assert c.task.id == waiter.id
    assert in_flight(run) == 1


def test_requeue_dead_task_keeps_the_limit(orch):
    run = orch.create_run(max_parallel=1, now=at(0))
    dead, _ = fill(orch, run, 2, max_attempts=1)
    [c] = claim_all(orch, at(1))
    assert c.task.id == dead.id
    orch.fail_task(**lease_of(c), error="x", retry=True, now=at(2))
    [c] = claim_all(orch, at(3))
    orch.requeue_dead_task(task_id=dead.id, now=at(4))
    assert claim_all(orch, at(5)) == []
    assert in_flight(run) == 1
    orch.complete_task(**lease_of(c), now=at(6))
    [c] = claim_all(orch, at(7))
    assert c.task.id == dead.id


def test_retry_task_cascade_keeps_the_limit(orch):
    run = orch.create_run(max_parallel=1, now=at(0))
    tasks = fill(orch, run, 3)
    for step in range(3):
        [c] = claim_all(orch, at(1 + step))
        orch.complete_task(**lease_of(c), now=at(1 + step))
    assert orch.get_run(run_id=run.id).status == "completed"
    for task in tasks:
        orch.retry_task(task_id=task.id, now=at(10))
    assert orch.get_run(run_id=run.id).status == "active"
    for step in range(3):
        claims = claim_all(orch, at(11 + step))
        assert len(claims) == 1
        orch.complete_task(**lease_of(claims[0]), now=at(11 + step))
    assert orch.get_run(run_id=run.id).status == "completed"


def test_a_copied_run_keeps_the_limit(orch, limited):
    fill(orch, limited, 4)
    copy = orch.copy_run(run_id=limited.id, now=at(1))
    orch.cancel_run(run_id=limited.id, now=at(1))
    assert len(claim_all(orch, at(2))) == 2
    assert in_flight(copy) == 2


def test_a_delayed_task_does_not_hold_a_slot(orch):
    run = orch.create_run(max_parallel=1, now=at(0))
    orch.enqueue_task(run_id=run.id, kind="k", key="later", not_before=at(3600), now=at(0))
    ready = orch.enqueue_task(run_id=run.id, kind="k", key="now", now=at(1))
    assert in_flight(run) == 0
    c = orch.claim_next_task(worker_id="w", now=at(2))
    assert c is not None and c.task.id == ready.id


def test_a_task_in_retry_backoff_does_not_hold_a_slot(orch):
    run = orch.create_run(max_parallel=1, now=at(0))
    flaky = orch.enqueue_task(
        run_id=run.id, kind="k", max_attempts=3, retry={"delay_ms": 60_000}, now=at(0)
    )
    other = orch.enqueue_task(run_id=run.id, kind="k", now=at(1))
    c = orch.claim_next_task(worker_id="w", now=at(2))
    assert c.task.id == flaky.id
    orch.fail_task(**lease_of(c), error="flaky", retry=True, now=at(3))
    assert in_flight(run) == 0
    c = orch.claim_next_task(worker_id="w", now=at(4))
    assert c is not None and c.task.id == other.id


def test_a_delayed_task_takes_the_free_slot_at_the_expiry_pass_once_due(orch):
    run = orch.create_run(max_parallel=1, now=at(0))
    later = orch.enqueue_task(run_id=run.id, kind="k", not_before=at(100), now=at(0))
    assert orch.claim_next_task(worker_id="w", now=at(101)) is None  # due, holds no slot yet
    orch.expire_leases(now=at(101))
    c = orch.claim_next_task(worker_id="w", now=at(102))
    assert c is not None and c.task.id == later.id


def test_expiry_passes_take_turns_when_more_capped_runs_wait_than_one_pass_refreshes(
    orch, monkeypatch
):
    """A pass refreshes at most SLOT_REFRESH_RUNS runs, the least recently updated first:
    every run's due task gets its slot within a few passes, none is left behind."""
    from parallel_mcp.services import leases

    monkeypatch.setattr(leases, "SLOT_REFRESH_RUNS", 2)
    runs = [orch.create_run(max_parallel=1, now=at(0)) for _ in range(5)]
    for run in runs:
        orch.enqueue_task(run_id=run.id, kind="k", not_before=at(100), now=at(0))
    given = []
    for second in (101, 102, 103):
        orch.expire_leases(now=at(second))
        given.append(Task.objects.filter(claimable=True, status="queued").count())
    assert given == [2, 4, 5]


def test_the_expiry_pass_asks_each_capped_run_for_one_due_delayed_task_by_index(orch):
    """Finding the runs to refresh reads the due delayed tasks waiting for a slot from
    pmcp_task_slot_delayed_idx: neither the ready backlog nor a capped run's tasks waiting for
    a slot without a delay are read."""
    from parallel_mcp.services.leases import runs_with_due_waiting_tasks

    backlog = orch.create_run(now=at(0))
    orch.enqueue_tasks(run_id=backlog.id, tasks=[{"kind": "k"} for _ in range(3000)], now=at(0))
    for _ in range(60):  # active runs without a limit, which the pass has no business with
        orch.enqueue_task(run_id=orch.create_run(now=at(0)).id, kind="k", now=at(0))
    run = orch.create_run(max_parallel=1, now=at(0))
    orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": "k"} for _ in range(2000)], now=at(0))
    orch.enqueue_task(run_id=run.id, kind="k", not_before=at(100), now=at(0))
    with connections["default"].cursor() as cursor:
        cursor.execute("ANALYZE")
    plan = runs_with_due_waiting_tasks("default", at(101)).explain()
    print("PLAN", plan)
    assert "pmcp_task_slot_delayed_idx" in plan, plan
    assert "SCAN u0" not in plan and "Seq Scan on pmcp_task" not in plan, plan
    assert list(runs_with_due_waiting_tasks("default", at(101))) == [run.id]
    assert list(runs_with_due_waiting_tasks("default", at(99))) == []


# -- several OS processes ---------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_max_parallel_holds_under_concurrent_claims_from_several_processes():
    from parallel_mcp import Orchestrator

    orch = Orchestrator()
    limit = 3
    run = orch.create_run(namespace="maxpar", max_parallel=limit)
    orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": "mp", "key": f"t{i}"} for i in range(40)])

    workers = [start("maxpar", f"proc-{n}", str(run.id), "15") for n in range(5)]
    reports = [json.loads(out.strip().splitlines()[-1]) for out in wait_all(workers)]

    observed = [seen for report in reports for seen in report["seen"]]
    assert len(observed) == 40
    assert max(observed) <= limit, observed
    assert max(observed) >= 2, f"no concurrency happened: {observed}"
    assert sum(report["done"] for report in reports) == 40
    completed = Counter(
        Event.objects.filter(run_id=run.id, event_type="task.completed").values_list(
            "task_id", flat=True
        )
    )
    assert len(completed) == 40 and set(completed.values()) == {1}
    stored = Run.objects.get(pk=run.id)
    assert stored.status == "completed"
    assert set(Task.objects.filter(run_id=run.id).values_list("attempt_count", flat=True)) == {1}


def _slot_samples(run_ids, stop: threading.Event, samples: list) -> None:
    """Until ``stop``: per run, (tasks in flight, in flight + ready tasks holding a slot), each
    sample one statement, so one consistent snapshot of the database."""
    from django.db import connection
    from django.db.models import Count, Q

    from parallel_mcp.models.tasks import CLAIM_READY

    try:
        while not stop.wait(0.002):
            rows = (
                Task.objects.filter(run_id__in=run_ids)
                .values("run_id")
                .annotate(
                    flight=Count("id", filter=Q(status__in=IN_FLIGHT)),
                    held=Count("id", filter=Q(status__in=IN_FLIGHT) | CLAIM_READY),
                )
            )
            samples.extend((row["flight"], row["held"]) for row in rows)
    finally:
        connection.close()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_max_parallel_holds_under_worker_processes_completing_and_claiming_in_one_write():
    """Two ``pmcp_worker`` processes of 8 slots (a cycle completes and claims in one write; on
    PostgreSQL a completion whose run row is held hands the freed slots out in its fold after
    the commit) on three runs of ``max_parallel=3``: no snapshot of the database ever shows a
    run with more than 3 tasks in flight, or with more slots held (in flight + claimable) than
    3; every task runs once, the counters end exact."""
    from parallel_mcp import Orchestrator
    from parallel_mcp.models import RunDelta
    from tests.workers import start_worker, wait_until

    orch = Orchestrator()
    limit, per_run = 3, 60
    runs = [orch.create_run(namespace="maxpar", max_parallel=limit) for _ in range(3)]
    for turn in range(0, per_run, 10):  # interleaved, so that every run stays busy
        for run in runs:
            orch.enqueue_tasks(
                run_id=run.id,
                tasks=[{"kind": "test.echo", "key": f"t{i}"} for i in range(turn, turn + 10)],
            )
    samples: list = []
    stop = threading.Event()
    sampler = threading.Thread(
        target=_slot_samples, args=([run.id for run in runs], stop, samples), daemon=True
    )
    sampler.start()
    try:
        workers = [
            start_worker("--burst", "--concurrency", "8", "--worker-id", f"w{n}") for n in (1, 2)
        ]
        for worker in workers:
            assert worker.finish() == 0, worker.describe()
        # A burst worker stops when it finds nothing claimable: the last may leave the run's
        # final tasks to the other; both are gone, so everything must be done.
        wait_until(
            lambda: all(orch.get_run(run_id=run.id).status == "completed" for run in runs),
            timeout=5,
            message="tasks left behind",
        )
    finally:
        stop.set()
        sampler.join(10)
    assert samples, "the sampler saw nothing"
    assert max(flight for flight, _ in samples) <= limit, Counter(samples)
    assert max(held for _, held in samples) <= limit, Counter(samples)
    assert max(flight for flight, _ in samples) >= 2, f"no concurrency: {Counter(samples)}"
    completed = Counter(
        Event.objects.filter(run__namespace="maxpar", event_type="task.completed").values_list(
            "task_id", flat=True
        )
    )
    assert len(completed) == 3 * per_run and set(completed.values()) == {1}
    for run in runs:
        stored = Run.objects.get(pk=run.id)
        assert (stored.tasks_completed, stored.tasks_active) == (per_run, 0)
    assert not RunDelta.objects.exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_claim_racing_an_enqueue_that_takes_its_slot_back(monkeypatch):
    """The claim is paused (by wrapping an internal step) between leasing the task row and
    committing, which is the window a concurrent writer can fall into."""
    from parallel_mcp import Orchestrator
    from parallel_mcp.services import claim as claims

    orch = Orchestrator()
    run = orch.create_run(max_parallel=1)
    held = orch.enqueue_task(run_id=run.id, kind="k", key="held")
    paused, proceed = threading.Event(), threading.Event()
    original = claims._record

    def slow_record(*args, **kwargs):
        recorded = original(*args, **kwargs)
        if threading.current_thread().name == "claimer":
            paused.set()
            proceed.wait(timeout=20)
        return recorded

    monkeypatch.setattr(claims, "_record", slow_record)
    results: dict = {}

    def call(name, fn):
        try:
            results[name] = fn()
        except Exception as exc:  # noqa: BLE001 - reported by the assertions below
            results[name] = exc
        finally:
            connections.close_all()

    claimer = threading.Thread(
        name="claimer",
        target=call,
        args=("claim", lambda: Orchestrator().claim_next_task(worker_id="w")),
    )
    enqueuer = threading.Thread(
        name="enqueuer",
        target=call,
        args=(
            "enqueue",
            lambda: Orchestrator().enqueue_task(run_id=run.id, kind="k", key="best", priority=9),
        ),
    )
    claimer.start()
    assert paused.wait(timeout=20)
    enqueuer.start()
    time.sleep(0.5)  # let the enqueue reach its hand-out
    proceed.set()
    claimer.join(timeout=60)
    enqueuer.join(timeout=60)

    assert not isinstance(results.get("claim"), Exception), results.get("claim")
    assert not isinstance(results.get("enqueue"), Exception), results.get("enqueue")
    assert results["claim"].task.id == held.id
    assert in_flight(run) == 1
    assert orch.claim_next_task(worker_id="w2") is None

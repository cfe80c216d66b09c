"""Run counters apart from the run row (issue 15): on PostgreSQL a completion never waits for
its run's row lock; when another transaction holds it, it leaves a delta row that it folds into
the run right after its commit (services/write.py). Real concurrency (threads and OS
processes), a fold that never ran (an exception, a SIGKILL), and the lock the hot transaction
no longer waits for."""

from __future__ import annotations

import json
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from unittest import mock

import pytest
from django.db import OperationalError, connection, connections, transaction
from django.utils import timezone

from parallel_mcp import Orchestrator
from parallel_mcp.exceptions import InvalidTransitionError
from parallel_mcp.models import ClientTokenRecord, Event, Run, RunDelta, Task
from parallel_mcp.services import complete_and_claim, complete_tasks
from parallel_mcp.services import fold as fold_module
from parallel_mcp.services.write import Folds, fold_runs
from tests.run_lock_support import (
    held,
    row_free,
    run_row_held,
    wait_for_a_lock_wait,
    writer_lock_held,
)
from tests.subprocesses import start, wait_all
from tests.thread_support import race
from tests.workers import (
    kill_leftover_processes,  # noqa: F401 - autouse fixture
    start_worker,
    wait_until,
)
from tests.workload import context_cycles

pytestmark = [pytest.mark.django_db(transaction=True)]

postgres_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="SQLite counts in the write itself"
)

COUNTERS = ("total", "active", "waiting", "stuck", "completed", "failed", "cancelled")


def counters(run_id) -> dict[str, int]:
    run = Run.objects.get(pk=run_id)
    return {name: getattr(run, f"tasks_{name}") for name in COUNTERS}


def done(total: int) -> dict[str, int]:
    return {**dict.fromkeys(COUNTERS, 0), "total": total, "completed": total}


def status_moves(run_id) -> list[tuple[str, str]]:
    events = Event.objects.filter(run_id=run_id, event_type="run.status.changed").order_by("id")
    return [(event.payload["from"], event.payload["to"]) for event in events]


def claim_and_complete(orch: Orchestrator, worker: str, **complete) -> Task:
    claim = orch.claim_next_task(worker_id=worker)
    assert claim is not None
    return orch.complete_task(
        task_id=claim.task.id, lease_id=claim.lease.id, worker_id=worker, **complete
    )


# -- the common path ---------------------------------------------------------------------------


def test_a_completion_returns_with_its_run_counted_and_no_delta_row_left():
    orch = Orchestrator()
    run = orch.create_run()
    for _ in range(2):
        orch.enqueue_task(run_id=run.id, kind="k")

    claim_and_complete(orch, "w")
    assert counters(run.id) == {**done(2), "active": 1, "completed": 1}
    assert orch.get_run(run_id=run.id).status == "active"
    claim_and_complete(orch, "w")

    assert counters(run.id) == done(2)
    assert orch.get_run(run_id=run.id).status == "completed"
    assert status_moves(run.id) == [("pending", "active"), ("active", "completed")]
    assert not RunDelta.objects.exists()


@postgres_only
def test_a_completion_whose_run_row_is_held_leaves_a_delta_row_and_folds_it_after_commit():
    orch = Orchestrator()
    run = orch.create_run()
    orch.enqueue_task(run_id=run.id, kind="k")
    seen: list = []
    real_fold = fold_module.fold_runs

    def watching_fold(**kwargs):
        # Called after the completion's commit, before the call returns.
        seen.append(
            (
                Task.objects.get(run_id=run.id).status,
                list(RunDelta.objects.values_list("run_id", "active", "completed")),
                Run.objects.get(pk=run.id).status,
            )
        )
        real_fold(**kwargs)

    committed = Task.objects.filter(run_id=run.id, status="completed").exists
    with mock.patch("parallel_mcp.services.write.fold_runs", watching_fold):
        with run_row_held(run.id, until=committed):
            claim_and_complete(orch, "w")

    assert seen == [("completed", [(run.id, -1, 1)], "active")]
    assert orch.get_run(run_id=run.id).status == "completed"
    assert not RunDelta.objects.exists()


@postgres_only
def test_a_completion_whose_run_row_is_free_counts_in_place_without_a_fold():
    orch = Orchestrator()
    run = orch.create_run()
    orch.enqueue_task(run_id=run.id, kind="k")
    with mock.patch("parallel_mcp.services.write.fold_runs") as fold:
        claim_and_complete(orch, "w")
    fold.assert_not_called()
    assert counters(run.id) == done(1)
    assert not RunDelta.objects.exists()


def _cycle(orch: Orchestrator, previous, *, folds: Folds) -> Any:
    """A worker's cycle (``complete_and_claim``) that completes ``previous`` (a claim, or None)
    and claims one task, leaving its folds to the caller; returns the new claim."""
    from parallel_mcp.services import complete_and_claim

    items = []
    if previous is not None:
        ids = {"task_id": previous.task.id, "lease_id": previous.lease.id, "worker_id": "w"}
        items = [{**ids, "client_token": f"{previous.lease.id}:completed"}]
    results, claims = complete_and_claim(
        using=orch.using, worker_id="w", items=items, limit=1, lease_ms=60_000, folds=folds
    )
    assert not [result for result in results if isinstance(result, Exception)]
    return claims[0] if claims else None


@postgres_only
def test_a_cycle_leaves_its_fold_to_the_caller_and_its_next_write_in_place_absorbs_it():
    """``complete_and_claim(folds=…)`` (the worker's cycle): a completion counted by delta row
    adds its run to ``folds`` instead of folding after its commit; the caller's next write that
    gets the row counts it in place, delta rows included, and takes the run out again."""
    orch = Orchestrator()
    run = orch.create_run()
    for _ in range(3):
        orch.enqueue_task(run_id=run.id, kind="k")
    folds = Folds()
    with mock.patch("parallel_mcp.services.write.fold_runs") as fold:
        first = _cycle(orch, None, folds=folds)
        with run_row_held(run.id):
            second = _cycle(orch, first, folds=folds)
            assert folds == {run.id}
            assert RunDelta.objects.filter(run_id=run.id).count() == 1
            assert counters(run.id)["completed"] == 0  # not folded: left to the caller
        third = _cycle(orch, second, folds=folds)  # the row is free: counted in place
        assert third is not None and folds == set()
        _cycle(orch, third, folds=folds)
    fold.assert_not_called()
    assert counters(run.id) == done(3)
    assert Run.objects.get(pk=run.id).status == "completed"
    assert status_moves(run.id) == [("pending", "active"), ("active", "completed")]
    assert not RunDelta.objects.exists()


@postgres_only
def test_a_cycle_leaves_a_capped_runs_fold_to_the_caller_as_due_at_once():
    """A capped run's freed slots are handed out by its fold: ``complete_and_claim(folds=…)``
    leaves it to the caller like any fold, but marks it due at once (``Folds.due``; the worker
    folds it right after handing out the cycle's claims), an uncapped run's not."""
    orch = Orchestrator()
    capped = orch.create_run(max_parallel=1)
    plain = orch.create_run()
    first = orch.enqueue_task(run_id=capped.id, kind="k", priority=1)
    second = orch.enqueue_task(run_id=capped.id, kind="k")
    orch.enqueue_task(run_id=plain.id, kind="k")
    claims = [_cycle(orch, None, folds=Folds()) for _ in range(2)]
    assert {claim.task.id for claim in claims} & {first.id, second.id} == {first.id}
    items = [
        {
            "task_id": claim.task.id,
            "lease_id": claim.lease.id,
            "worker_id": "w",
            "client_token": f"{claim.lease.id}:completed",
        }
        for claim in claims
    ]
    only_plain = Folds()
    with run_row_held(plain.id):
        _cycle(orch, claims[1], folds=only_plain)
    assert only_plain == {plain.id} and not only_plain.due  # may wait for a write in place
    folds = Folds()
    with run_row_held(capped.id):
        complete_and_claim(
            using=orch.using, worker_id="w", items=items[:1], limit=0, lease_ms=60_000, folds=folds
        )
        assert not Task.objects.get(pk=second.id).claimable  # the slot waits for the fold
    assert folds == {capped.id} and folds.due
    fold_runs(using=orch.using, run_ids=sorted(folds), now=timezone.now())
    folds.clear()
    assert not folds.due
    assert Task.objects.get(pk=second.id).claimable
    assert counters(capped.id) == {**done(2), "active": 1, "completed": 1}
    assert RunDelta.objects.filter(run_id=plain.id).count() == 1
    assert not RunDelta.objects.filter(run_id=capped.id).exists()


def test_sqlite_counts_in_the_write_itself_and_never_folds():
    if connection.vendor != "sqlite":
        pytest.skip("the SQLite path")
    orch = Orchestrator()
    run = orch.create_run()
    orch.enqueue_task(run_id=run.id, kind="k")
    with mock.patch("parallel_mcp.services.write.fold_runs") as fold:
        claim_and_complete(orch, "w")
    fold.assert_not_called()
    assert counters(run.id) == done(1)


# -- concurrency -------------------------------------------------------------------------------


def _burn_down_in_threads(total: int, moves=lambda name, count: {}) -> tuple[Any, list[int]]:
    """A run of ``total`` tasks, claimed and completed by 6 racing threads until none is left
    (each completion with ``moves(name, count)``); returns the run and, per thread that made
    no failed call, how many it completed."""
    orch = Orchestrator()
    run = orch.create_run()
    for _ in range(total):
        orch.enqueue_task(run_id=run.id, kind="k")
    finished: list[int] = []

    def worker(name: str) -> None:
        mine = Orchestrator()
        count = 0
        while (claim := mine.claim_next_task(worker_id=name)) is not None:
            mine.complete_task(
                task_id=claim.task.id,
                lease_id=claim.lease.id,
                worker_id=name,
                **moves(name, count),
            )
            count += 1
        finished.append(count)  # only when no call failed

    race(6, worker)
    return run, finished


def test_threads_completing_tasks_of_one_run_leave_exact_counters():
    total = 60
    run, finished = _burn_down_in_threads(total)

    assert len(finished) == 6
    assert sum(finished) == total
    assert counters(run.id) == done(total)
    assert Run.objects.get(pk=run.id).status == "completed"
    assert status_moves(run.id).count(("active", "completed")) == 1
    assert status_moves(run.id)[-1] == ("active", "completed")
    assert not RunDelta.objects.exists()


def test_threads_mixing_context_moves_and_plain_completions_keep_one_chain_of_snapshots():
    """Half the completions move the run's context: the counters end exact, and the run-scope
    snapshots form one chain (each the parent of the next; none forked off an older one),
    whose last is the run's current snapshot."""
    from parallel_mcp.models import ContextSnapshot

    total = 48
    run, finished = _burn_down_in_threads(
        total, lambda name, count: {"next_context": {"by": name, "n": count}} if count % 2 else {}
    )

    assert len(finished) == 6 and sum(finished) == total
    assert counters(run.id) == done(total)
    assert Run.objects.get(pk=run.id).status == "completed"
    snapshots = list(ContextSnapshot.objects.filter(run_id=run.id, scope="run"))
    assert len(snapshots) == sum(count // 2 for count in finished)
    parents = [s.parent_snapshot_id for s in snapshots]
    assert parents.count(None) == 1 and len(set(parents)) == len(parents)  # one chain
    tails = {s.pk for s in snapshots} - set(parents)
    assert tails == {Run.objects.get(pk=run.id).current_context_snapshot_id}
    assert not RunDelta.objects.exists()


def _context_race(per_run: int) -> tuple[list[Run], Callable[[], None]]:
    """Two runs of ``per_run`` tasks each, and a canceller that cancels every fifth task of
    both (whatever its state) while worker cycles burn them down."""
    orch = Orchestrator()
    runs = [orch.create_run() for _ in range(2)]
    targets = [
        orch.enqueue_task(run_id=run.id, kind="k").id for _ in range(per_run) for run in runs
    ][::5]

    def cancel() -> None:
        for task_id in targets:
            try:
                orch.cancel_task(task_id=task_id)
            except InvalidTransitionError:
                pass  # completed already
            time.sleep(0.001)

    return runs, cancel


def _assert_exact_after_context_race(runs: list[Run], results: list[dict[str, int]]) -> None:
    """Every run's counters equal its tasks' states, every completion a cycle reported is
    one, and each run's snapshots form one chain ending in its current snapshot."""
    from parallel_mcp.models import ContextSnapshot

    completed = 0
    for run in runs:
        states = Counter(Task.objects.filter(run_id=run.id).values_list("status", flat=True))
        assert set(states) <= {"completed", "cancelled"}, states
        total = states.total()
        assert counters(run.id) == {
            **done(total),
            "completed": states["completed"],
            "cancelled": states["cancelled"],
        }
        assert Run.objects.get(pk=run.id).status in ("completed", "failed", "cancelled")
        completed += states["completed"]
        snapshots = list(ContextSnapshot.objects.filter(run_id=run.id, scope="run"))
        parents = [s.parent_snapshot_id for s in snapshots]
        assert parents.count(None) == 1 and len(set(parents)) == len(parents)  # one chain
        tails = {s.pk for s in snapshots} - set(parents)
        assert tails == {Run.objects.get(pk=run.id).current_context_snapshot_id}
    assert sum(result["completed"] for result in results) == completed
    assert not RunDelta.objects.exists()


def test_cycles_moving_contexts_race_claims_cancels_and_completions_without_deadlock():
    """Four threads run worker cycles (completions of both runs in one write, every other one
    with ``next_context``, and claims) while a fifth cancels tasks: on PostgreSQL context
    moves wait for their run rows late, in id order, holding task locks (services/write.py).
    A deadlock would fail a thread (PostgreSQL aborts one side) or leave it stuck."""
    runs, cancel = _context_race(100)
    results: list[dict[str, int]] = []

    def body(name: str) -> None:
        if name == "t0":
            cancel()
        else:
            results.append(context_cycles(name))  # only when no call failed

    race(5, body)
    assert len(results) == 4
    _assert_exact_after_context_race(runs, results)


@pytest.mark.slow
def test_worker_processes_moving_contexts_race_cancels_without_deadlock(tmp_path):
    """The same with three worker processes (``tests.workload context_cycles``)."""
    runs, cancel = _context_race(120)
    workers = [start("context_cycles", f"proc-{n}", str(tmp_path), "3") for n in range(3)]
    cancel()
    results = [json.loads(out) for out in wait_all(workers)]
    _assert_exact_after_context_race(runs, results)


@pytest.mark.slow
def test_worker_processes_completing_tasks_of_one_run_leave_exact_counters(tmp_path):
    orch = Orchestrator()
    run = orch.create_run()
    total = 120
    for _ in range(total):
        orch.enqueue_task(run_id=run.id, kind="k")

    workers = [start("drain", f"proc-{n}", str(run.id), str(tmp_path), "4") for n in range(4)]
    finished = [int(out.strip()) for out in wait_all(workers)]

    assert sum(finished) == total
    assert counters(run.id) == done(total)
    assert Run.objects.get(pk=run.id).status == "completed"
    assert status_moves(run.id) == [("pending", "active"), ("active", "completed")]
    assert not RunDelta.objects.exists()


# -- the lock the hot transaction no longer waits for ------------------------------------------


def _in_thread(call: Callable[[], Any]) -> threading.Thread:
    def body() -> None:
        try:
            call()
        finally:
            connections.close_all()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def _complete_in_thread(orch: Orchestrator, claim, **complete) -> threading.Thread:
    return _in_thread(
        lambda: Orchestrator().complete_task(
            task_id=claim.task.id, lease_id=claim.lease.id, worker_id="w", **complete
        )
    )


@postgres_only
def test_a_completion_commits_while_another_transaction_holds_its_run_locked():
    orch = Orchestrator()
    run = orch.create_run()
    task = orch.enqueue_task(run_id=run.id, kind="k")
    claim = orch.claim_next_task(worker_id="w")
    with run_row_held(run.id):
        completing = _complete_in_thread(orch, claim)
        # The completion's own transaction commits without the run's lock ...
        wait_until(
            lambda: Task.objects.filter(pk=task.id, status="completed").exists(),
            message="the completion did not commit while the run was locked",
        )
        # ... and only its fold waits for the lock, with the counters not yet moved.
        assert completing.is_alive()
        assert counters(run.id)["completed"] == 0
        assert RunDelta.objects.filter(run_id=run.id).count() == 1
    completing.join(10)
    assert counters(run.id) == done(1)
    assert Run.objects.get(pk=run.id).status == "completed"
    assert not RunDelta.objects.exists()


@postgres_only
def test_a_capped_completion_commits_while_its_run_is_locked_and_its_fold_hands_out_the_slot():
    orch = Orchestrator()
    run = orch.create_run(max_parallel=1)
    first = orch.enqueue_task(run_id=run.id, kind="k")
    second = orch.enqueue_task(run_id=run.id, kind="k")
    claim = orch.claim_next_task(worker_id="w")
    assert claim is not None and claim.task.id == first.id
    assert orch.claim_next_task(worker_id="w2") is None  # the one slot is taken
    with run_row_held(run.id):
        completing = _complete_in_thread(orch, claim)
        wait_until(
            lambda: Task.objects.filter(pk=first.id, status="completed").exists(),
            message="the capped completion did not commit while the run was locked",
        )
        # Committed by delta row; the slot it freed is handed out by its fold, which waits.
        assert completing.is_alive()
        assert RunDelta.objects.filter(run_id=run.id).count() == 1
        assert not Task.objects.get(pk=second.id).claimable
    completing.join(10)
    assert Task.objects.get(pk=second.id).claimable
    assert counters(run.id) == {**done(2), "active": 1, "completed": 1}
    assert not RunDelta.objects.exists()
    claim = orch.claim_next_task(worker_id="w2")
    assert claim is not None and claim.task.id == second.id


@postgres_only
def test_a_completion_that_moves_the_run_context_still_waits_for_the_run_lock():
    orch = Orchestrator()
    run = orch.create_run()
    task = orch.enqueue_task(run_id=run.id, kind="k")
    claim = orch.claim_next_task(worker_id="w")
    with run_row_held(run.id):
        completing = _complete_in_thread(orch, claim, next_context={"n": 1})
        completing.join(0.5)
        assert completing.is_alive()
        assert Task.objects.get(pk=task.id).status != "completed"
    completing.join(10)
    assert counters(run.id) == done(1)
    assert not RunDelta.objects.exists()


@postgres_only
def test_a_completion_takes_its_run_row_only_after_its_task():
    """Its run row comes after its guarded update: a holder of a run row never waits for a
    task (the lock order that lets a context move wait for its row late, services/write.py)."""
    orch = Orchestrator()
    run = orch.create_run()
    task = orch.enqueue_task(run_id=run.id, kind="k")
    claim = orch.claim_next_task(worker_id="w")
    with run_row_held(task.id, model=Task):
        completing = _complete_in_thread(orch, claim)
        wait_for_a_lock_wait()  # its guarded update waits for the task
        assert row_free(Run, run.id)
    completing.join(10)
    assert counters(run.id) == done(1)


@postgres_only
@pytest.mark.parametrize("token", [None, "done"])
def test_a_completion_takes_its_task_and_its_token_only_once_it_holds_its_runs_writer_lock(
    token,
):
    """The writer locks come first in the guard's statement (a one-time filter of its token
    insert and of its task update, services/write.py ``send_guard``): while it waits for one,
    it holds neither its task nor its token."""
    orch = Orchestrator()
    run = orch.create_run()
    task = orch.enqueue_task(run_id=run.id, kind="k")
    claim = orch.claim_next_task(worker_id="w")
    with writer_lock_held(run.id):
        completing = _complete_in_thread(orch, claim, client_token=token)
        wait_for_a_lock_wait()  # its guard's statement waits for the writer lock
        assert row_free(Task, task.id)
        assert token_free("done", task)
    completing.join(10)
    assert Task.objects.get(pk=task.id).status == "completed"
    assert ClientTokenRecord.objects.filter(token="done").exists() == (token is not None)
    assert counters(run.id) == done(1)


@postgres_only
def test_a_completion_takes_its_run_row_only_after_its_token():
    """A completion waiting for its client token (a twin's insert, not yet committed) holds no
    run row: the rows come after the whole guard, tokens included."""
    orch = Orchestrator()
    run = orch.create_run()
    task = orch.enqueue_task(run_id=run.id, kind="k")
    claim = orch.claim_next_task(worker_id="w")
    with held(lambda: record_token("done", task)):
        completing = _complete_in_thread(orch, claim, client_token="done")
        wait_for_a_lock_wait()  # its token's insert waits for the twin's
        assert row_free(Run, run.id)
    completing.join(10)  # the twin rolled back: the token is this completion's
    assert Task.objects.get(pk=task.id).status == "completed"
    assert counters(run.id) == done(1)


@postgres_only
@pytest.mark.parametrize("token", [None, "done"])
def test_the_guards_plan_holds_each_step_back_until_the_one_before_it_is_done(token):
    """A completion's one statement (services/write.py ``send_guard``) in the audited order
    whatever the planner joins first: in its generic plan (as the write prelude forces it),
    the token insert and the task update each start with a one-time filter over the writer
    locks' CTE, and the run rows' select with one over the guard's rows."""
    import psycopg

    orch = Orchestrator()
    run = orch.create_run()
    task = orch.enqueue_task(run_id=run.id, kind="k")
    claim = orch.claim_next_task(worker_id="w")
    sent: list[tuple[str, Any]] = []

    def keep(execute, sql, params, many, context):
        sent.append((sql, params))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(keep):
        orch.complete_task(
            task_id=task.id, lease_id=claim.lease.id, worker_id="w", client_token=token
        )
    (sql, params), *_ = [(sql, params) for sql, params in sent if "gates AS" in sql]
    # Bound on the server, as the write path sends it (Django's cursor binds on the client).
    with transaction.atomic(), psycopg.Cursor(connection.connection) as cursor:
        cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        cursor.execute("EXPLAIN (COSTS off) " + sql, params)
        plan = [row[0] for row in cursor.fetchall()]
    ctes: dict[str, list[str]] = {}
    for line in plan:
        if line.startswith("  CTE "):
            ctes[line.split()[1]] = current = []
        elif line.startswith("   ") and ctes:
            current.append(line.strip())
    steps = {"u": "gates", "runs": "guarded", **({"recorded": "gates"} if token else {})}
    for cte, before in steps.items():
        body = ctes[cte]
        # An InitPlan reading the CTE before it gates the first node under the statement.
        assert any(
            line == f"->  CTE Scan on {before}" or line.startswith(f"->  CTE Scan on {before} ")
            for line in body
        ), (cte, plan)
        gate = next(n for n, line in enumerate(body) if line.startswith("One-Time Filter"))
        scans = [n for n, line in enumerate(body) if "Scan " in line and " on pmcp_" in line]
        assert gate < min(scans), (cte, plan)


@postgres_only
@pytest.mark.parametrize("token", [None, "cycle"])
def test_a_cycle_claims_nothing_before_it_holds_its_completions_writer_locks(token):
    """A cycle claims after its completions' steps (services/cycle.py): while the completion
    waits for its run's writer lock, the cycle has claimed no task and holds none (a claim
    sent in the completions' statement without waiting for them would break this,
    bench/FINDINGS.md "Issue 15: the claim in the guard's round trip")."""
    orch = Orchestrator()
    run = orch.create_run()
    first = orch.enqueue_task(run_id=run.id, kind="k", priority=1)
    second = orch.enqueue_task(run_id=run.id, kind="k")
    claim = orch.claim_next_task(worker_id="w")
    assert claim is not None and claim.task.id == first.id
    item = {"task_id": first.id, "lease_id": claim.lease.id, "worker_id": "w"}
    cycled: list[Any] = []
    with writer_lock_held(run.id):
        cycling = _in_thread(
            lambda: cycled.append(
                complete_and_claim(
                    using="default",
                    worker_id="w",
                    items=[item],
                    limit=1,
                    lease_ms=60_000,
                    client_token=token,
                )
            )
        )
        wait_for_a_lock_wait()  # the completions' statement waits for the writer lock
        assert row_free(Task, second.id)
        assert Task.objects.get(pk=second.id).status == "queued"
    cycling.join(10)
    ((results, claims),) = cycled
    assert results == [None] and [c.task.id for c in claims] == [second.id]
    assert counters(run.id) == {**done(2), "active": 1, "completed": 1}


@postgres_only
def test_a_cycle_outside_a_transaction_parts_its_statements_rows_between_its_steps():
    """Outside a transaction the completions' statement returns the run rows and the guard's
    rows in one result (services/write.py ``send_guard``): each item still gets its own
    outcome (completed, refused, replayed), the claims theirs, and a retried cycle replays
    both."""
    orch = Orchestrator()
    run = orch.create_run()
    for _ in range(5):
        orch.enqueue_task(run_id=run.id, kind="k")
    a, b, c = orch.claim_next_tasks(worker_id="w", limit=3)
    orch.complete_task(task_id=c.task.id, lease_id=c.lease.id, worker_id="w", client_token="c")
    items = [
        {"task_id": a.task.id, "lease_id": a.lease.id, "client_token": "a"},
        {"task_id": b.task.id, "lease_id": a.lease.id},  # another task's lease
        {"task_id": c.task.id, "lease_id": c.lease.id, "client_token": "c"},  # a replay
    ]

    def cycle() -> tuple[list[Any], list[Any]]:
        return complete_and_claim(
            using="default", worker_id="w", items=items, limit=2, lease_ms=60_000, client_token="n"
        )

    results, claims = cycle()
    assert results[0] is None and results[2] is None
    assert type(results[1]).__name__ == "LeaseConflictError"
    assert len(claims) == 2 and {claim.run.id for claim in claims} == {run.id}
    assert all(claim.task.status == "leased" for claim in claims)
    again, replayed = cycle()
    assert again[0] is None and again[2] is None
    assert [claim.lease.id for claim in replayed] == [claim.lease.id for claim in claims]
    assert counters(run.id) == {**done(5), "active": 3, "completed": 2}
    assert Task.objects.get(pk=b.task.id).status == "leased"


@postgres_only
def test_a_capped_runs_cycle_claims_the_slot_it_frees_in_its_next_cycle():
    """A cycle's claim takes the slots handed out before it: the slot a cycle's completion
    frees is handed out at the end of its write (the flush, after the claim), so that cycle
    claims nothing of the run, the next one does, and the run never has more than
    ``max_parallel`` tasks in flight."""
    orch = Orchestrator()
    capped = orch.create_run(max_parallel=1)
    first = orch.enqueue_task(run_id=capped.id, kind="k", priority=1)
    second = orch.enqueue_task(run_id=capped.id, kind="k")
    folds = Folds()
    claim = _cycle(orch, None, folds=folds)
    assert claim is not None and claim.task.id == first.id
    assert _cycle(orch, None, folds=folds) is None  # the one slot is taken
    assert _cycle(orch, claim, folds=folds) is None  # frees it; its claim came first
    assert Task.objects.get(pk=second.id).claimable
    last = _cycle(orch, None, folds=folds)
    assert last is not None and last.task.id == second.id
    assert folds == set()  # every cycle got the run row
    assert counters(capped.id) == {**done(2), "active": 1, "completed": 1}


def record_token(token: str, task: Task) -> None:
    ClientTokenRecord.objects.create(
        token=token, run_id=task.run_id, task=task, outcome="completed", created_at=timezone.now()
    )


def token_free(token: str, task: Task) -> bool:
    """Whether no other transaction has recorded ``token`` without committing yet (its insert
    here would wait for it: it is given 200 ms)."""
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '200ms'")
            record_token(token, task)
            transaction.set_rollback(True)
    except OperationalError:
        return False
    return True


@postgres_only
def test_a_context_move_over_two_runs_holds_no_run_row_while_it_waits_for_one():
    """A write that moves a context and touches several runs takes their rows in id order,
    waiting, after its first round trip; it never holds one it got on the way (SKIP LOCKED)
    while it waits for another."""
    orch = Orchestrator()
    first, second = sorted((orch.create_run() for _ in range(2)), key=lambda run: run.id)
    for run in (first, second):
        orch.enqueue_task(run_id=run.id, kind="k")
    items = [
        {"task_id": claim.task.id, "lease_id": claim.lease.id, "next_context": {"n": 1}}
        for claim in orch.claim_next_tasks(worker_id="w", limit=2)
    ]
    with run_row_held(first.id):
        completing = _in_thread(lambda: complete_tasks(using="default", worker_id="w", items=items))
        wait_for_a_lock_wait()
        assert row_free(Run, second.id)
    completing.join(10)
    for run in (first, second):
        assert counters(run.id) == done(1)
        assert Run.objects.get(pk=run.id).current_context_snapshot_id is not None
    assert not RunDelta.objects.exists()


@postgres_only
def test_a_fold_of_several_runs_holds_one_run_row_at_a_time():
    """Each run folded in a transaction of its own: a fold never holds a run row while it
    waits for another (which, with a context move waiting for the first, could close a
    circle through a write waiting for a task the context move holds)."""
    from parallel_mcp.services.write import fold_runs

    orch = Orchestrator()
    first, second = sorted((orch.create_run() for _ in range(2)), key=lambda run: run.id)
    with run_row_held(second.id):
        now = timezone.now()
        folding = _in_thread(
            lambda: fold_runs(using="default", run_ids=[first.id, second.id], now=now)
        )
        wait_for_a_lock_wait()
        assert row_free(Run, first.id)
    folding.join(10)
    assert not folding.is_alive()


@postgres_only
def test_plain_completions_count_apart_while_a_context_move_holds_the_run_row():
    """A ``next_context`` completion holds the run row to its commit, but only the row: the
    run's writer lock it holds shared, so a plain completion of the same run meanwhile commits
    by delta row instead of waiting for it."""
    from parallel_mcp.services import complete as complete_module

    orch = Orchestrator()
    run = orch.create_run()
    moving, plain = (orch.enqueue_task(run_id=run.id, kind="k") for _ in range(2))
    claims = {c.task.id: c for c in (orch.claim_next_task(worker_id="w") for _ in range(2))}
    inside, release = threading.Event(), threading.Event()
    real_add_snapshot = complete_module.add_snapshot

    def held_add_snapshot(*args, **kwargs):
        inside.set()  # the run row is locked by now: taken after the first round trip
        release.wait(30)
        return real_add_snapshot(*args, **kwargs)

    with mock.patch.object(complete_module, "add_snapshot", held_add_snapshot):
        context_move = _complete_in_thread(orch, claims[moving.id], next_context={"n": 1})
        try:
            assert inside.wait(10)
            plain_completion = _complete_in_thread(orch, claims[plain.id])
            wait_until(
                lambda: Task.objects.filter(pk=plain.id, status="completed").exists(),
                timeout=10,
                message="the plain completion waited for the context move",
            )
            assert RunDelta.objects.filter(run_id=run.id).count() == 1
        finally:
            release.set()
        context_move.join(10)
        plain_completion.join(10)

    assert counters(run.id) == done(2)
    assert Run.objects.get(pk=run.id).status == "completed"
    assert orch.get_current_context_snapshot(run_id=run.id).payload == {"n": 1}
    assert not RunDelta.objects.exists()


# -- a fold that never ran ---------------------------------------------------------------------


def _complete_without_fold(orch: Orchestrator, run_id) -> Task:
    """A completion counted by delta row (its run's row held meanwhile) whose fold fails
    after its commit, as a crash there would leave it."""

    def failing_fold(**_: object) -> None:
        raise RuntimeError("fold lost")

    with mock.patch("parallel_mcp.services.write.fold_runs", failing_fold):
        with run_row_held(run_id), pytest.raises(RuntimeError, match="fold lost"):
            claim_and_complete(orch, "w")
    task = Task.objects.get(run_id=run_id, status="completed")
    # Committed, not folded: the run row lags, its delta row is there.
    assert counters(run_id)["completed"] == 0
    assert Run.objects.get(pk=run_id).status == "active"
    assert RunDelta.objects.filter(run_id=run_id).count() == 1
    return task


@postgres_only
def test_the_lease_expiry_pass_folds_what_a_lost_fold_left():
    orch = Orchestrator()
    run = orch.create_run()
    orch.enqueue_task(run_id=run.id, kind="k")
    _complete_without_fold(orch, run.id)

    orch.expire_leases()  # the rows are younger than FOLD_LAG_MS: left to their own fold
    assert RunDelta.objects.filter(run_id=run.id).count() == 1
    orch.expire_leases(now=timezone.now() + timedelta(milliseconds=fold_module.FOLD_LAG_MS + 1))

    assert counters(run.id) == done(1)
    assert Run.objects.get(pk=run.id).status == "completed"
    assert status_moves(run.id)[-1] == ("active", "completed")
    assert not RunDelta.objects.exists()


@postgres_only
def test_the_lease_expiry_pass_hands_out_the_slots_a_lost_fold_left_idle():
    orch = Orchestrator()
    run = orch.create_run(max_parallel=1)
    orch.enqueue_task(run_id=run.id, kind="k")
    waiting = orch.enqueue_task(run_id=run.id, kind="k")
    _complete_without_fold(orch, run.id)
    assert not Task.objects.get(pk=waiting.id).claimable  # its slot was never handed out

    orch.expire_leases(now=timezone.now() + timedelta(milliseconds=fold_module.FOLD_LAG_MS + 1))

    assert Task.objects.get(pk=waiting.id).claimable
    claim = orch.claim_next_task(worker_id="w2")
    assert claim is not None and claim.task.id == waiting.id


@postgres_only
def test_a_write_that_locks_the_run_folds_its_delta_rows_first():
    """retry_task of a completed task whose completion was never folded: it moves the task
    out of ``completed``, which the run row does not count yet. Folding under the lock first
    keeps the counters right (else: completed = -1, refused by the counters' check)."""
    orch = Orchestrator()
    run = orch.create_run()
    orch.enqueue_task(run_id=run.id, kind="k")
    task = _complete_without_fold(orch, run.id)

    orch.retry_task(task_id=task.id)

    assert counters(run.id) == {**done(1), "active": 1, "completed": 0}
    assert Run.objects.get(pk=run.id).status == "active"
    assert status_moves(run.id)[-2:] == [("active", "completed"), ("completed", "active")]
    assert not RunDelta.objects.exists()


@postgres_only
@pytest.mark.slow
def test_a_process_killed_between_commit_and_fold_is_folded_by_a_workers_expiry_loop():
    orch = Orchestrator()
    run = orch.create_run()
    task = orch.enqueue_task(run_id=run.id, kind="test.echo")

    with run_row_held(run.id):  # so that the completion counts by delta row
        dying = start("die_before_fold", "doomed")
        dying.communicate(timeout=60)
    assert dying.returncode == -signal.SIGKILL
    assert Task.objects.get(pk=task.id).status == "completed"
    assert Run.objects.get(pk=run.id).status == "active"
    assert RunDelta.objects.filter(run_id=run.id).count() == 1

    # A local worker's built-in lease-expiry loop folds it once the row is FOLD_LAG_MS old.
    worker = start_worker("--lease-expiry-interval-ms", "100", "--worker-id", "survivor")
    wait_until(
        lambda: Run.objects.get(pk=run.id).status == "completed",
        alive=[worker],
        message="the worker's expiry loop did not fold the run",
    )
    assert counters(run.id) == done(1)
    assert not RunDelta.objects.exists()


def test_a_delta_row_has_a_column_for_each_run_counter_and_nothing_else():
    from parallel_mcp.models.run_deltas import DELTA_COUNTERS

    columns = {f.name for f in RunDelta._meta.concrete_fields} - {"id", "run", "created_at"}
    counters_of_a_run = {f.name.removeprefix("tasks_") for f in Run._meta.concrete_fields}
    assert columns == set(DELTA_COUNTERS)
    assert columns <= counters_of_a_run

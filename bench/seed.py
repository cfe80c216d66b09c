"""Filling the work database quickly (Django must be set up).

- ``seed_runs``: tasks through the public API (``enqueue_tasks``, 2,000 per call), so the rows,
  counters and ``task.enqueued`` events are exactly what users get;
- ``seed_backlog``: 100k ready + 100k dependency-blocked tasks in a few ``INSERT … SELECT``
  statements (a recursive CTE on SQLite, ``generate_series`` on PostgreSQL): too many for the
  API within the time budget. Rows are consistent (counters add up, edges exist) but have no
  events.

The peers (bench/peers) seed their own rows with their own APIs: bench/peers/seed.py.
"""

from __future__ import annotations

from typing import Any

KIND = "bench.noop"
API_BATCH = 2_000


def seed_runs(shape: list[tuple[int, int]], namespace: str = "bench") -> list[Any]:
    """``shape`` is a list of (number of runs, tasks per run); returns the run ids."""
    from parallel_mcp import Orchestrator

    orch = Orchestrator()
    run_ids = []
    for runs, per_run in shape:
        for _ in range(runs):
            run = orch.create_run(namespace=namespace)
            left = per_run
            while left:
                batch = min(left, API_BATCH)
                orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": KIND}] * batch)
                left -= batch
            run_ids.append(run.id)
    return run_ids


# The "variants" scenario: what each variant's tasks are, against plain no-op tasks.
VARIANTS = ("plain", "capped", "metadata", "next_context", "dependencies")


# Dependencies: the tasks form binary trees with this many roots, more than two workers' slots
# (2 x 8): with one root, a second worker that started while the first held the few ready
# tasks of the tree's first levels found nothing to claim and, being a burst worker, stopped
# (until 2026-11-24 the "2 processes" cell mostly measured one process).
DEPENDENCY_ROOTS = 32

# Capped runs: their tasks are enqueued in turns of this many, so claims (oldest first) take
# from all 4 runs until the end instead of emptying one run after the other.
CAPPED_TURN = 50


def seed_variant(variant: str, tasks: int) -> None:
    """``tasks`` tasks for one variant: plain (one run), capped (4 runs with
    ``max_parallel=8``, enqueued in turns: together more than the slots of two workers until
    the last tasks, so the cap costs work but does not hold a slot back; were the runs
    emptied one after the other, the last alone would allow 8 tasks at a time to 16 slots),
    metadata and next_context (handlers that complete with them), and dependencies (one run,
    each task after the first ``DEPENDENCY_ROOTS`` waits on task ``(i - DEPENDENCY_ROOTS) //
    2``: binary trees whose ready frontier always exceeds the slots)."""
    from parallel_mcp import Orchestrator

    orch = Orchestrator()
    if variant == "capped":
        runs = [orch.create_run(namespace="bench", max_parallel=8) for _ in range(4)]
        for _ in range(0, tasks // 4, CAPPED_TURN):
            for run in runs:
                orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": KIND}] * CAPPED_TURN)
        return
    kind = {"metadata": "bench.metadata", "next_context": "bench.context"}.get(variant, KIND)
    specs: list[dict[str, Any]] = [{"kind": kind, "key": f"t{i}"} for i in range(tasks)]
    if variant == "dependencies":
        for i in range(DEPENDENCY_ROOTS, tasks):
            specs[i]["depends_on"] = [f"t{(i - DEPENDENCY_ROOTS) // 2}"]
    run = orch.create_run(namespace="bench")
    orch.enqueue_tasks(run_id=run.id, tasks=specs)


def _series(vendor: str, count: int) -> tuple[str, str]:
    """(WITH prefix, FROM item) giving the integers 1..count as ``g.n``."""
    if vendor == "postgresql":
        return "", f"generate_series(1, {int(count)}) AS g(n)"
    return (
        f"WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM g WHERE n < {int(count)}) ",
        "g",
    )


def _ts(vendor: str, seconds_sql: str) -> str:
    """2026-01-01 00:00:00 UTC plus ``seconds_sql`` seconds, in the vendor's column format."""
    if vendor == "postgresql":
        return f"(TIMESTAMPTZ '2026-01-01 00:00:00+00' + ({seconds_sql}) * INTERVAL '1 second')"
    return (
        f"(strftime('%Y-%m-%d %H:%M:%S', '2026-01-01 00:00:00', '+' || ({seconds_sql}) "
        "|| ' seconds') || '.000000')"
    )


def seed_backlog(*, queued: int, blocked: int) -> Any:
    """One run holding ``queued`` ready tasks and ``blocked`` tasks that wait on a dependency
    (a task that is not due before 2100, so it never completes and sorts after the ready
    ones). Returns the run id."""
    from django.db import connection

    from parallel_mcp import Orchestrator
    from parallel_mcp.models import Run, Task

    vendor = connection.vendor
    orch = Orchestrator()
    run = orch.create_run(namespace="bench-backlog")
    far = (
        "TIMESTAMPTZ '2100-01-01 00:00:00+00'"
        if vendor == "postgresql"
        else "'2100-01-01 00:00:00.000000'"
    )
    blocker = orch.enqueue_task(run_id=run.id, kind=KIND, priority=-1)
    true, false = ("TRUE", "FALSE") if vendor == "postgresql" else ("1", "0")
    uuid_sql = "gen_random_uuid()" if vendor == "postgresql" else "lower(hex(randomblob(16)))"
    run_id = run.id if vendor == "postgresql" else run.id.hex
    blocker_id = blocker.id if vendor == "postgresql" else blocker.id.hex
    columns = (
        "id, run_id, kind, status, priority, attempt_count, progress, claimable, "
        "pending_blockers, blocks_others, unmet_dependencies, failed_dependencies, dead, "
        "created_at, updated_at"
    )
    with connection.cursor() as cursor:
        cursor.execute(f"UPDATE pmcp_task SET not_before = {far} WHERE id = %s", [blocker_id])
        for count, unmet, offset in ((queued, 0, 0), (blocked, 1, queued)):
            with_clause, series = _series(vendor, count)
            cursor.execute(
                f"{with_clause}INSERT INTO pmcp_task ({columns}) "
                f"SELECT {uuid_sql}, %s, %s, 'queued', 0, 0, 0.0, {true}, 0, {false}, {unmet}, "
                f"0, {false}, {_ts(vendor, f'g.n + {offset}')}, {_ts(vendor, f'g.n + {offset}')} "
                f"FROM {series}",
                [run_id, KIND],
            )
        cursor.execute(
            "INSERT INTO pmcp_task_dependency (run_id, task_id, depends_on_id, required) "
            f"SELECT run_id, id, %s, {true} FROM pmcp_task "
            "WHERE run_id = %s AND unmet_dependencies = 1",
            [blocker_id, run_id],
        )
    total = Task.objects.filter(run_id=run.id).count()
    Run.objects.filter(pk=run.id).update(tasks_total=total, tasks_active=total)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    return run.id

"""Where the time of one task goes: claim -> mark running -> heartbeat -> complete, in process.

    python -m bench.profile_cycle                     # SQLite FULL, SQLite NORMAL, PostgreSQL
    python -m bench.profile_cycle --db sqlite-full --cycles 2000

For each database it migrates a fresh database (bench/dbs.py: a SQLite file, or a throwaway
PostgreSQL cluster with durable commits), enqueues tasks, and then, with the calls the worker
makes (client tokens on claim and complete, ``kinds`` on claim):

1. times every call, splitting its wall time into SQL (inside ``cursor.execute``, driver and
   server included), COMMIT (the durable part: fsync on SQLite FULL / PostgreSQL) and the rest
   (Python: validation, ORM query building, model instances, services);
2. lists the statements of one cycle;
3. profiles cycles with cProfile (top functions by own time, and the cumulative time of the
   ORM's SQL compilers) and, when it is installed, pyinstrument (a call tree).

Writes ``bench/results/profile-<database>-<timestamp>.txt``.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from .dbs import CONFIGS, durable_cluster, process_env

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
OPERATIONS = ("claim", "running", "heartbeat", "complete")


class Timers:
    """Execute wrapper and commit hook that add up time per current operation."""

    def __init__(self) -> None:
        self.current = "other"
        self.sql: dict[str, float] = {}
        self.statements: dict[str, int] = {}
        self.commit: dict[str, float] = {}

    def __call__(self, execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            op = self.current
            self.sql[op] = self.sql.get(op, 0.0) + time.perf_counter() - started
            self.statements[op] = self.statements.get(op, 0) + 1

    def wrap_commit(self, connection) -> None:
        original = connection._commit

        def timed_commit():
            started = time.perf_counter()
            try:
                return original()
            finally:
                op = self.current
                self.commit[op] = self.commit.get(op, 0.0) + time.perf_counter() - started

        connection._commit = timed_commit


def one_cycle(orch, worker_id: str, timers: Timers | None = None) -> dict[str, float]:
    """The worker's calls for one no-op task; returns wall seconds per operation."""
    walls = {}

    def step(name, call):
        if timers is not None:
            timers.current = name
        started = time.perf_counter()
        result = call()
        walls[name] = time.perf_counter() - started
        return result

    token = f"claim:{uuid.uuid4()}"
    claim = step(
        "claim",
        lambda: orch.claim_next_task(worker_id=worker_id, kinds=["bench.noop"], client_token=token),
    )
    if claim is None:
        raise RuntimeError("profile: ran out of tasks")
    ids = {"task_id": claim.task.id, "lease_id": claim.lease.id, "worker_id": worker_id}
    step("running", lambda: orch.mark_task_running(**ids))
    step("heartbeat", lambda: orch.heartbeat_lease(**ids, lease_ms=30_000))
    step(
        "complete",
        lambda: orch.complete_task(**ids, output=None, client_token=f"{claim.lease.id}:completed"),
    )
    if timers is not None:
        timers.current = "other"
    return walls


def child(config_name: str, cycles: int, profile_cycles: int, out: Path) -> int:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from parallel_mcp import Orchestrator

    from .seed import seed_runs

    lines: list[str] = []

    def say(text: str = "") -> None:
        print(text, flush=True)
        lines.append(text)

    call_command("migrate", verbosity=0)
    total = cycles + profile_cycles * 3 + 50
    seed_runs([(1, total)])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    orch = Orchestrator()
    for _ in range(20):  # warm up: imports, caches, prepared plans
        one_cycle(orch, "warm")

    say(f"# {CONFIGS[config_name].label}: {cycles} cycles of claim -> running -> heartbeat -> "
        f"complete (worker-style calls), in one process")  # fmt: skip
    say(f"# {datetime.now(UTC).isoformat(timespec='seconds')}, load {os.getloadavg()[0]:.2f}")

    # 1. wall / SQL / COMMIT / Python per operation
    timers = Timers()
    timers.wrap_commit(connection)
    walls: dict[str, list[float]] = {op: [] for op in OPERATIONS}
    with connection.execute_wrapper(timers):
        started = time.perf_counter()
        for _ in range(cycles):
            for op, seconds in one_cycle(orch, "timed", timers).items():
                walls[op].append(seconds)
        elapsed = time.perf_counter() - started
    del connection._commit  # back to the class's method
    say()
    say(f"{cycles / elapsed:.0f} cycles/s ({elapsed / cycles * 1000:.2f} ms per cycle)")
    say()
    say(
        f"{'call':<10} {'mean ms':>8} {'p50 ms':>7} {'stmts':>6} {'SQL ms':>7} {'COMMIT ms':>9} "
        f"{'Python ms':>9}  {'SQL %':>5} {'COMMIT %':>8} {'Python %':>8}"
    )
    sums = {"wall": 0.0, "sql": 0.0, "commit": 0.0}
    for op in OPERATIONS:
        wall = sum(walls[op]) / cycles * 1000
        sql = timers.sql.get(op, 0.0) / cycles * 1000
        commit = timers.commit.get(op, 0.0) / cycles * 1000
        python = wall - sql - commit
        sums["wall"] += wall
        sums["sql"] += sql
        sums["commit"] += commit
        say(
            f"{op:<10} {wall:8.2f} {statistics.median(walls[op]) * 1000:7.2f} "
            f"{timers.statements.get(op, 0) / cycles:6.1f} {sql:7.2f} {commit:9.2f} {python:9.2f}"
            f"  {sql / wall:5.0%} {commit / wall:8.0%} {python / wall:8.0%}"
        )
    python = sums["wall"] - sums["sql"] - sums["commit"]
    say(
        f"{'cycle':<10} {sums['wall']:8.2f} {'':>7} "
        f"{sum(timers.statements.get(op, 0) for op in OPERATIONS) / cycles:6.1f} "
        f"{sums['sql']:7.2f} {sums['commit']:9.2f} {python:9.2f}  "
        f"{sums['sql'] / sums['wall']:5.0%} {sums['commit'] / sums['wall']:8.0%} "
        f"{python / sums['wall']:8.0%}"
    )
    say(
        "(SQL = inside cursor.execute, BEGIN included; COMMIT = the commit call; Python = the rest)"
    )

    # 2. the statements of one cycle
    say()
    say("## Statements of one cycle")
    captured: dict[str, list[str]] = {}
    token = f"claim:{uuid.uuid4()}"
    with CaptureQueriesContext(connection) as ctx:
        claim = orch.claim_next_task(worker_id="listed", kinds=["bench.noop"], client_token=token)
    captured["claim"] = [q["sql"] for q in ctx.captured_queries]
    ids = {"task_id": claim.task.id, "lease_id": claim.lease.id, "worker_id": "listed"}
    calls = {
        "running": lambda: orch.mark_task_running(**ids),
        "heartbeat": lambda: orch.heartbeat_lease(**ids, lease_ms=30_000),
        "complete": lambda: orch.complete_task(**ids, client_token=f"{claim.lease.id}:completed"),
    }
    for op, call in calls.items():
        with CaptureQueriesContext(connection) as ctx:
            call()
        captured[op] = [q["sql"] for q in ctx.captured_queries]
    for op in OPERATIONS:
        say(f"### {op} ({len(captured[op])} statements)")
        for sql in captured[op]:
            say(f"  {sql[:300]}{' …' if len(sql) > 300 else ''}")

    # 3. profiles
    say()
    say(f"## cProfile over {profile_cycles} cycles")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(profile_cycles):
        one_cycle(orch, "cprofile")
    profiler.disable()
    stats = pstats.Stats(profiler)
    total_time = stats.total_tt  # type: ignore[attr-defined]
    say(f"total {total_time:.2f}s ({total_time / profile_cycles * 1000:.2f} ms per cycle, "
        "with profiler overhead)")  # fmt: skip
    say()
    say("Cumulative time of selected functions (they nest; shares of the profiled total):")
    wanted = {
        ("compiler.py", "as_sql"): "ORM: building SQL (SQLCompiler*.as_sql)",
        ("compiler.py", "execute_sql"): "ORM: compiler.execute_sql (build + run + fetch)",
        ("query.py", "_fetch_all"): "ORM: QuerySet._fetch_all",
        ("query.py", "bulk_create"): "ORM: bulk_create",
        ("query.py", "update"): "ORM: QuerySet.update",
        ("base.py", "__init__"): "Model.__init__ (any base.py __init__)",
        ("utils.py", "_execute"): "backend CursorWrapper._execute (driver + server)",
        ("base.py", "_commit"): "COMMIT",
        ("transaction.py", "__enter__"): "transaction.atomic enter",
        ("transaction.py", "__exit__"): "transaction.atomic exit (incl. COMMIT)",
        ("validation.py", None): "parallel_mcp validation",
        ("write.py", "flush"): "Write.flush (run counters + events)",
        ("encoder.py", None): "json encoding",
    }
    rows: dict[str, float] = {}
    for (filename, _line, name), entry in stats.stats.items():  # type: ignore[attr-defined]
        cumulative = entry[3]
        for (suffix, function), label in wanted.items():
            if filename.endswith(suffix) and (function is None or name == function):
                if function is None:
                    rows[label] = rows.get(label, 0.0) + entry[2]  # own time for whole modules
                else:
                    rows[label] = rows.get(label, 0.0) + cumulative
    for label, seconds in sorted(rows.items(), key=lambda item: -item[1]):
        say(
            f"  {seconds / total_time:6.1%}  "
            f"{seconds / profile_cycles * 1000:7.3f} ms/cycle  {label}"
        )
    say()
    say("Top 30 functions by own time:")
    buffer = io.StringIO()
    pstats.Stats(profiler, stream=buffer).sort_stats("tottime").print_stats(30)
    for line in buffer.getvalue().splitlines():
        if line.strip() and not line.startswith(("   Ordered by", "         ")):
            say("  " + line.replace(str(REPO) + "/", "").replace(sys.prefix + "/", "")[:160])

    with contextlib.suppress(ImportError):
        from pyinstrument import Profiler

        say()
        say(f"## pyinstrument over {profile_cycles} cycles")
        profiler2 = Profiler(interval=0.0005)
        profiler2.start()
        for _ in range(profile_cycles):
            one_cycle(orch, "pyinstrument")
        profiler2.stop()
        text = profiler2.output_text(unicode=False, color=False, show_all=False)
        for line in text.splitlines():
            say(line)
    out.write_text("\n".join(lines) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", default="sqlite-full,sqlite-normal,postgres")
    parser.add_argument("--cycles", type=int, default=1000)
    parser.add_argument("--profile-cycles", type=int, default=500)
    parser.add_argument("--results", type=Path, default=BENCH / "results")
    parser.add_argument("--child", metavar="CONFIG", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(args.child, args.cycles, args.profile_cycles, args.out)

    configs = [name.strip() for name in args.db.split(",") if name.strip()]
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    args.results.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pmcp-profile-", dir="/var/tmp") as workdir:
        with contextlib.ExitStack() as stack:
            pg_env = stack.enter_context(durable_cluster()) if "postgres" in configs else None
            for name in configs:
                out = args.results / f"profile-{name}-{stamp}.txt"
                env = process_env(CONFIGS[name], Path(workdir), pg_env)
                code = subprocess.call(
                    [
                        sys.executable, "-m", "bench.profile_cycle", "--child", name,
                        "--cycles", str(args.cycles), "--profile-cycles",
                        str(args.profile_cycles), "--out", str(out),
                    ],
                    cwd=REPO,
                    env=env,
                )  # fmt: skip
                if code:
                    return code
                print(f"wrote {out.relative_to(REPO)}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Where the time of one task goes: claim (straight into running) -> heartbeat -> complete,
in process.

    python -m bench.profile_cycle                     # SQLite FULL, SQLite NORMAL, PostgreSQL
    python -m bench.profile_cycle --db sqlite-full --cycles 2000
    python -m bench.profile_cycle --db sqlite-full --with-running  # + mark_task_running

For each database it migrates a fresh database (bench/dbs.py: a SQLite file, or a throwaway
PostgreSQL cluster with durable commits), enqueues tasks, and then runs the calls one
``pmcp_worker`` slot makes for a task when it claims one at a time:

- ``claim_next_task`` with ``kinds``, a client token and ``start=True`` (straight into
  running: no ``mark_task_running``);
- one ``heartbeat_lease``: a worker sends one every third of the lease while a handler runs,
  so a no-op task needs none, but it is profiled all the same;
- ``complete_task`` with a client token.

Batched claims and group-committed completions (``--concurrency N``) are not profiled here
(``python -m bench.run --only slots`` measures them). For these calls it

1. times every call, splitting its wall time into SQL (inside ``cursor.execute``, driver and
   server included), COMMIT (the durable part: fsync on SQLite FULL / PostgreSQL) and the rest
   (Python: validation, ORM query building, model instances, services);
2. lists the statements of one cycle;
3. profiles cycles with cProfile (top functions by own time, and the cumulative time of the
   ORM's SQL compilers) and, when it is installed, pyinstrument (a call tree).

``--with-running`` profiles the older cycle instead: a claim without ``start`` (the task stays
``leased``) followed by ``mark_task_running`` — what remote workers (``pmcp_worker --api``) do.

Writes ``bench/results/profile-<database>-<timestamp>.txt`` (with ``--with-running``:
``profile-<database>-with-running-<timestamp>.txt``).
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
from typing import Any

from .dbs import CONFIGS, durable_cluster, process_env

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
OPERATIONS = ("claim", "heartbeat", "complete")
OPERATIONS_WITH_RUNNING = ("claim", "running", "heartbeat", "complete")


class Timers:
    """Execute wrapper and commit hook that add up time per operation and per statement
    (by its position within the operation)."""

    def __init__(self, connection) -> None:
        self.connection = connection
        self.current = "other"
        self.index = 0
        self.txn_start: float | None = None
        self.in_txn: dict[str, float] = {}  # BEGIN (or first statement) to end of COMMIT
        self.sql: dict[str, float] = {}
        self.statements: dict[str, int] = {}
        self.commit: dict[str, float] = {}
        self.by_statement: dict[tuple[str, int], list[Any]] = {}  # -> [seconds, count, sql]

    def start(self, op: str) -> None:
        self.current = op
        self.index = 0

    def __call__(self, execute, sql, params, many, context):
        started = time.perf_counter()
        if self.txn_start is None and (sql.startswith("BEGIN") or self.connection.in_atomic_block):
            self.txn_start = started
        try:
            return execute(sql, params, many, context)
        finally:
            seconds = time.perf_counter() - started
            op = self.current
            self.sql[op] = self.sql.get(op, 0.0) + seconds
            self.statements[op] = self.statements.get(op, 0) + 1
            entry = self.by_statement.setdefault((op, self.index), [0.0, 0, sql])
            entry[0] += seconds
            entry[1] += 1
            self.index += 1

    def wrap_commit(self, connection) -> None:
        original = connection._commit

        def timed_commit():
            started = time.perf_counter()
            try:
                return original()
            finally:
                ended = time.perf_counter()
                op = self.current
                self.commit[op] = self.commit.get(op, 0.0) + ended - started
                if self.txn_start is not None:
                    self.in_txn[op] = self.in_txn.get(op, 0.0) + ended - self.txn_start
                    self.txn_start = None

        connection._commit = timed_commit


def one_cycle(
    orch, worker_id: str, timers: Timers | None = None, *, with_running: bool = False
) -> dict[str, float]:
    """The worker's calls for one no-op task; returns wall seconds per operation.

    By default the claim starts the task (``start=True``) as a local ``pmcp_worker`` does;
    ``with_running`` claims without starting it and then calls ``mark_task_running``."""
    walls = {}

    def step(name, call):
        if timers is not None:
            timers.start(name)
        started = time.perf_counter()
        result = call()
        walls[name] = time.perf_counter() - started
        return result

    token = f"claim:{uuid.uuid4()}"
    claim = step(
        "claim",
        lambda: orch.claim_next_task(
            worker_id=worker_id,
            kinds=["bench.noop"],
            client_token=token,
            start=not with_running,
        ),
    )
    if claim is None:
        raise RuntimeError("profile: ran out of tasks")
    ids = {"task_id": claim.task.id, "lease_id": claim.lease.id, "worker_id": worker_id}
    if with_running:
        step("running", lambda: orch.mark_task_running(**ids))
    step("heartbeat", lambda: orch.heartbeat_lease(**ids, lease_ms=30_000))
    step(
        "complete",
        lambda: orch.complete_task(**ids, output=None, client_token=f"{claim.lease.id}:completed"),
    )
    if timers is not None:
        timers.start("other")
    return walls


def child(
    config_name: str, cycles: int, profile_cycles: int, out: Path, *, with_running: bool
) -> int:
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import connection

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
    operations = OPERATIONS_WITH_RUNNING if with_running else OPERATIONS
    for _ in range(20):  # warm up: imports, caches, prepared plans
        one_cycle(orch, "warm", with_running=with_running)

    how = (
        "claim (leased) -> mark running"
        if with_running
        else "claim (start=True: straight into running)"
    )
    say(f"# {CONFIGS[config_name].label}: {cycles} cycles of {how} -> heartbeat -> complete "
        "(worker-style calls: kinds and client tokens), in one process")  # fmt: skip
    say(f"# {datetime.now(UTC).isoformat(timespec='seconds')}, load {os.getloadavg()[0]:.2f}")

    # 1. wall / SQL / COMMIT / Python per operation
    timers = Timers(connection)
    timers.wrap_commit(connection)
    walls: dict[str, list[float]] = {op: [] for op in operations}
    with connection.execute_wrapper(timers):
        started = time.perf_counter()
        for _ in range(cycles):
            for op, seconds in one_cycle(orch, "timed", timers, with_running=with_running).items():
                walls[op].append(seconds)
        elapsed = time.perf_counter() - started
    del connection._commit  # back to the class's method
    say()
    say(f"{cycles / elapsed:.0f} cycles/s ({elapsed / cycles * 1000:.2f} ms per cycle)")
    say()
    header = ("call", "mean ms", "p50 ms", "stmts", "SQL ms", "COMMIT ms", "Python ms",
              "in-txn ms", "SQL %", "COMMIT %", "Python %")  # fmt: skip
    say("  ".join(f"{h:>9}" if i else f"{h:<9}" for i, h in enumerate(header)))
    totals = {"wall": 0.0, "sql": 0.0, "commit": 0.0, "txn": 0.0, "stmts": 0.0}
    rows = []
    for op in operations:
        wall = sum(walls[op]) / cycles * 1000
        sql = timers.sql.get(op, 0.0) / cycles * 1000
        commit = timers.commit.get(op, 0.0) / cycles * 1000
        txn = timers.in_txn.get(op, 0.0) / cycles * 1000
        stmts = timers.statements.get(op, 0) / cycles
        p50 = statistics.median(walls[op]) * 1000
        for key, value in (("wall", wall), ("sql", sql), ("commit", commit), ("txn", txn),
                           ("stmts", stmts)):  # fmt: skip
            totals[key] += value
        rows.append((op, wall, p50, stmts, sql, commit, txn))
    rows.append(("cycle", totals["wall"], float("nan"), totals["stmts"], totals["sql"],
                 totals["commit"], totals["txn"]))  # fmt: skip
    for op, wall, p50, stmts, sql, commit, txn in rows:
        python = wall - sql - commit
        cells = [f"{op:<9}", f"{wall:9.2f}", f"{p50:9.2f}" if p50 == p50 else " " * 9,
                 f"{stmts:9.1f}", f"{sql:9.2f}", f"{commit:9.2f}", f"{python:9.2f}",
                 f"{txn:9.2f}", f"{sql / wall:9.0%}", f"{commit / wall:9.0%}",
                 f"{python / wall:9.0%}"]  # fmt: skip
        say("  ".join(cells))
    say("SQL = inside cursor.execute (BEGIN included); COMMIT = the commit call; Python = the")
    say("rest; in-txn = from BEGIN (or the first statement of the transaction) to the end of")
    if connection.vendor == "sqlite":
        ceiling = 1000 / totals["txn"] if totals["txn"] else float("nan")
        say("COMMIT. On SQLite the write lock is held that long, so with one task per")
        say(f"transaction (as here) writers in any number of processes cannot exceed "
            f"1000 / {totals['txn']:.2f} ms = {ceiling:.0f} cycles/s together.")  # fmt: skip
    else:
        say("COMMIT (row locks only: other processes' transactions run meanwhile).")
    say("Batched claims and group-committed completions (pmcp_worker --concurrency N) share")
    say("one transaction between several tasks; they are not measured here (python -m bench.run")
    say("--only slots).")

    # 2. the statements of one cycle
    say()
    say("## Statements of one cycle")
    say("(parametrized SQL as sent by the ORM, mean time inside cursor.execute)")
    for op in operations:
        entries = sorted((i, e) for (o, i), e in timers.by_statement.items() if o == op)
        say(f"### {op}: {len(entries)} statements + COMMIT "
            f"({timers.commit.get(op, 0.0) / cycles * 1000:.3f} ms)")  # fmt: skip
        for _index, (seconds, count, sql) in entries:
            text = " ".join(sql.split())
            say(
                f"  {seconds / count * 1000:6.3f} ms  {text[:260]}{' …' if len(text) > 260 else ''}"
            )
    say()

    # 3. profiles
    say()
    say(f"## cProfile over {profile_cycles} cycles")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(profile_cycles):
        one_cycle(orch, "cprofile", with_running=with_running)
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
            one_cycle(orch, "pyinstrument", with_running=with_running)
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
    parser.add_argument(
        "--with-running",
        action="store_true",
        help="claim without start=True and call mark_task_running (the remote worker's cycle)",
    )
    parser.add_argument("--results", type=Path, default=BENCH / "results")
    parser.add_argument("--child", metavar="CONFIG", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        return child(
            args.child, args.cycles, args.profile_cycles, args.out, with_running=args.with_running
        )

    configs = [name.strip() for name in args.db.split(",") if name.strip()]
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    args.results.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pmcp-profile-", dir="/var/tmp") as workdir:
        with contextlib.ExitStack() as stack:
            pg_env = stack.enter_context(durable_cluster()) if "postgres" in configs else None
            for name in configs:
                suffix = "-with-running" if args.with_running else ""
                out = args.results / f"profile-{name}{suffix}-{stamp}.txt"
                env = process_env(CONFIGS[name], Path(workdir), pg_env)
                code = subprocess.call(
                    [
                        sys.executable, "-m", "bench.profile_cycle", "--child", name,
                        "--cycles", str(args.cycles), "--profile-cycles",
                        str(args.profile_cycles), "--out", str(out),
                    ] + (["--with-running"] if args.with_running else []),
                    cwd=REPO,
                    env=env,
                )  # fmt: skip
                if code:
                    return code
                print(f"wrote {out.relative_to(REPO) if out.is_relative_to(REPO) else out}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

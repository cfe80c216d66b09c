"""Where a task's time goes on the PostgreSQL server: one burn-down of pre-seeded no-op tasks by
``pmcp_worker`` processes against a throwaway durable cluster with ``pg_stat_statements``.

``python -m bench.pg_server [--tasks 5000] [--processes 1] [--concurrency 8] [--reps 1]
[--variant plain] [--sample-slots] [--system pmcp|oban]``

``--system oban`` measures oban's Python port the same way (the peers scenario's seeding,
command and settings, ``bench/peers/systems.py``): its ``--concurrency`` is the queue's limit
per process; it has no burst mode, so its workers are stopped once every job is done.

``--variant NAME`` seeds one of the variants scenario's data sets instead (``bench.seed.VARIANTS``:
plain, capped, metadata, next_context, dependencies; see bench/README.md).
``--sample-slots`` samples, every ~3 ms of the measured window, the capped runs' free slots
that no ready task holds (a freed slot not yet handed out) and the tasks in flight.

Reports, per task completed: the CPU time of the workers and of the server (every backend
and background process of the cluster, exited ones included), the statements the server ran
(calls, execution time, rows, WAL bytes; ``pg_stat_statements``), the rows each table got
(inserted, updated, HOT-updated, deleted; ``pg_stat_user_tables``), the index entries that
writes added (a non-HOT update or an insert adds one to every index whose predicate the row
meets), and the WAL written (``pg_stat_wal``). Each repetition starts from the same seeded
copy. Writes ``bench/results/pg-server-<timestamp>.json`` and prints a summary.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from unittest import mock

from bench.seed import VARIANTS

REPO = Path(__file__).resolve().parent.parent
# Per system: the tables whose rows and indexes are reported. pmcp_lease is a view of
# pmcp_attempt (migration 0013): no rows or indexes of its own.
TABLES = {
    "pmcp": ("pmcp_task", "pmcp_attempt", "pmcp_event", "pmcp_run", "pmcp_client_token"),
    "oban": ("oban_jobs",),
}


def _ticks(path: Path) -> tuple[float, float]:
    """(own utime+stime, reaped children's cutime+cstime) of a process, in seconds."""
    fields = path.read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / tick, (int(fields[13]) + int(fields[14])) / tick


def server_cpu(postmaster: int) -> float:
    """CPU seconds of the cluster: the postmaster, its live children, and (through the
    postmaster's cutime/cstime) every child that exited and was reaped."""
    own, reaped = _ticks(Path(f"/proc/{postmaster}/stat"))
    total = own + reaped
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            if int(stat.rsplit(")", 1)[1].split()[1]) == postmaster:
                total += _ticks(entry / "stat")[0]
        except (OSError, ValueError, IndexError):
            continue
    return total


def machine_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine, every core (/proc/stat)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]
    total = sum(fields[:8])
    tick = os.sysconf("SC_CLK_TCK")
    return (total - idle) / tick, total / tick


def worker_cpu(pid: int) -> float:
    return _ticks(Path(f"/proc/{pid}/stat"))[0]


def _cursor():
    from django.db import connection

    return connection.cursor()


def _rows(sql: str, params: list[Any] | None = None) -> list[tuple]:
    with _cursor() as cursor:
        cursor.execute(sql, params or [])
        return cursor.fetchall()


def _reset_stats() -> None:
    with _cursor() as cursor:
        cursor.execute("SELECT pg_stat_statements_reset()")
        cursor.execute("SELECT pg_stat_reset()")
        cursor.execute("SELECT pg_stat_reset_shared('wal')")


def _index_predicates(tables: tuple[str, ...]) -> dict[str, list[tuple[str, str | None]]]:
    """Per table, its indexes with their predicates (None: every row)."""
    out: dict[str, list[tuple[str, str | None]]] = {}
    for table, index, predicate in _rows(
        "SELECT c.relname, i.relname, pg_get_expr(x.indpred, x.indrelid) FROM pg_index x "
        "JOIN pg_class c ON c.oid = x.indrelid JOIN pg_class i ON i.oid = x.indexrelid "
        "WHERE c.relname = ANY(%s) ORDER BY 1, 2",
        [list(tables)],
    ):
        out.setdefault(table, []).append((index, predicate))
    return out


def _collect(tasks_done: int, tables: tuple[str, ...]) -> dict[str, Any]:
    time.sleep(0.7)  # statistics reach the shared counters within PGSTAT_MIN_INTERVAL (1 s)
    statements = [
        {
            "query": " ".join(query.split())[:300],
            "calls": calls,
            "exec_ms": round(total, 3),
            "rows": rows,
            "wal_bytes": int(wal),
            "per_task_us": round(total * 1000 / tasks_done, 2),
            "calls_per_task": round(calls / tasks_done, 3),
            "plans": plans,
            "plan_us_per_task": round(plan_ms * 1000 / tasks_done, 2),
        }
        for query, calls, total, rows, wal, plans, plan_ms in _rows(
            "SELECT query, calls, total_exec_time, rows, wal_bytes, plans, total_plan_time "
            "FROM pg_stat_statements "
            "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
            "ORDER BY total_exec_time DESC"
        )
    ]
    tables = {
        name: {
            "ins": ins,
            "upd": upd,
            "hot_upd": hot,
            "del": dele,
            "per_task": {
                "ins": round(ins / tasks_done, 3),
                "upd": round(upd / tasks_done, 3),
                "non_hot_upd": round((upd - hot) / tasks_done, 3),
            },
        }
        for name, ins, upd, hot, dele in _rows(
            "SELECT relname, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del "
            "FROM pg_stat_user_tables WHERE relname = ANY(%s)",
            [list(tables)],
        )
    }
    wal = _rows(
        "SELECT wal_records, wal_fpi, wal_bytes, wal_sync, wal_sync_time, wal_write "
        "FROM pg_stat_wal"
    )[0]
    # A cycle is one COMMIT; its statements are the top-level ones (not the foreign keys'
    # checks, not this tool's polling, not the transaction's boundaries).
    commits = sum(s["calls"] for s in statements if s["query"] == "COMMIT")
    sent = sum(
        s["calls"]
        for s in statements
        if not s["query"].startswith(
            (
                "SELECT $2 FROM ONLY",
                "SELECT tasks_completed FROM",
                "SELECT r.max_parallel",
                "SELECT count(*) FROM oban_jobs",
            )
        )
        and s["query"] not in ("BEGIN", "COMMIT")
    )
    return {
        "statements": statements,
        "statements_per_cycle": round(sent / commits, 2) if commits else None,
        "plan_us_per_task": round(sum(s["plan_us_per_task"] for s in statements), 1),
        "tables": tables,
        "indexes": {t: [i for i, _ in ixs] for t, ixs in _index_predicates(tables).items()},
        "wal": {
            "records_per_task": round(wal[0] / tasks_done, 2),
            "fpi_per_task": round(wal[1] / tasks_done, 3),
            "bytes_per_task": round(int(wal[2]) / tasks_done),
            "syncs_per_task": round(wal[3] / tasks_done, 3),
            "sync_ms_each": round(wal[4] / wal[3], 3) if wal[3] else None,
        },
    }


# Tasks done so far, per system. Ours: the measured runs' counters (the variants' capped runs
# are four), a few rows, so polling costs the server next to nothing (the history run is the
# only one in another namespace). oban keeps no counter: its jobs are counted (an index scan
# of a few thousand entries; its cost per task shows in the statements table).
COMPLETED_SQL = {
    "pmcp": "SELECT COALESCE(SUM(tasks_completed), 0) FROM pmcp_run WHERE namespace = 'bench'",
    "oban": "SELECT count(*) FROM oban_jobs WHERE state = 'completed'",
}


def _completed(system: str) -> int:
    return _rows(COMPLETED_SQL[system])[0][0]


# Per capped run: its limit, tasks in flight, ready tasks holding a slot (claimable) and ready
# tasks waiting for one. A free slot no ready task holds is "idle": min(limit - in flight -
# claimable, waiting), summed over the runs.
SLOTS_SQL = (
    "SELECT r.max_parallel, "
    "(SELECT COUNT(*) FROM pmcp_task t WHERE t.run_id = r.id AND t.status IN ('leased', "
    "'running')), "
    "(SELECT COUNT(*) FROM pmcp_task t WHERE t.run_id = r.id AND t.status = 'queued' "
    "AND t.unmet_dependencies = 0 AND t.claimable), "
    "(SELECT COUNT(*) FROM pmcp_task t WHERE t.run_id = r.id AND t.status = 'queued' "
    "AND t.unmet_dependencies = 0 AND NOT t.claimable) "
    "FROM pmcp_run r WHERE r.namespace = 'bench'"
)


class SlotSampler(threading.Thread):
    """``--sample-slots``: every ~3 ms, from a connection of its own, the capped runs' idle
    slots (``SLOTS_SQL``) and the measured runs' tasks in flight, while ``active`` is set."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.active = threading.Event()
        self.stop = threading.Event()
        self.samples: list[tuple[int, int]] = []

    def run(self) -> None:
        from django.db import connections

        try:
            with connections["default"].cursor() as cursor:
                while not self.stop.is_set():
                    if self.active.is_set():
                        cursor.execute(SLOTS_SQL)
                        rows = cursor.fetchall()
                        idle = sum(max(0, min(m - f - c, w)) for m, f, c, w in rows if m)
                        self.samples.append((idle, sum(row[1] for row in rows)))
                    time.sleep(0.003)
        finally:
            connections.close_all()

    def summary(self) -> dict[str, Any]:
        n = len(self.samples)
        if not n:
            return {"samples": 0}
        return {
            "samples": n,
            "share_with_an_idle_slot": round(sum(1 for idle, _ in self.samples if idle) / n, 3),
            "mean_idle_slots": round(sum(idle for idle, _ in self.samples) / n, 3),
            "mean_in_flight": round(sum(flight for _, flight in self.samples) / n, 2),
        }


def _seed(tasks: int, history: int, variant: str | None) -> None:
    from bench.driver import close_db
    from bench.seed import seed_runs, seed_variant

    if history:
        seed_runs([(1, history)], namespace="history")
        close_db()
        subprocess.run(
            [sys.executable, "-m", "django", "pmcp_worker", "--burst", "--concurrency", "8",
             "--worker-id", "history"],
            check=True, cwd=REPO, env=dict(os.environ), stdout=subprocess.DEVNULL,
        )  # fmt: skip
    if variant:
        seed_variant(variant, tasks)
    else:
        seed_runs([(1, tasks)])


def _worker_argv(args: argparse.Namespace, index: int) -> list[str]:
    if args.system == "oban":
        from bench.peers.systems import OBAN

        return OBAN.command(f"w{index}", args.concurrency)
    return [sys.executable, "-m", "django", "pmcp_worker", "--burst",
            "--concurrency", str(args.concurrency), "--worker-id", f"w{index}"]  # fmt: skip


def _restore_seeded(driver: Any, args: argparse.Namespace) -> None:
    """The work database as seeded for this run (a snapshot kept from the first time)."""
    if args.system == "oban":
        from bench.peers.scenario import _seed as seed_peer
        from bench.peers.systems import OBAN

        driver.ws.restore(seed_peer(driver, OBAN, args.tasks))
        return
    driver.seeded(
        f"pg-server-{args.variant or 'runs'}-{args.tasks}-h{args.history}",
        lambda: _seed(args.tasks, args.history, args.variant),
    )


def _one_run(args: argparse.Namespace, postmaster: int, logdir: Path, rep: int) -> dict:
    from django.db import connections

    from bench.driver import close_db

    _reset_stats()
    close_db()
    sampler = SlotSampler() if args.sample_slots else None
    if sampler is not None:
        sampler.start()
    env = dict(os.environ)
    if args.system == "oban":
        from bench.peers.systems import OBAN

        env = OBAN.process_env(env)
    procs = []
    logs = []
    for index in range(args.processes):
        path = logdir / f"pg-server-r{rep}-{index}.log"
        logs.append(path)
        with path.open("w") as out:
            procs.append(
                subprocess.Popen(
                    _worker_argv(args, index),
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    cwd=REPO,
                    env=env,
                )
            )
    # Measure from the moment every worker has completed some task (start-up excluded) to
    # just before the last tasks (drain excluded).
    while True:
        time.sleep(0.05)
        done = _completed(args.system)
        connections.close_all()
        if done >= args.tasks * 0.1 or not any(p.poll() is None for p in procs):
            break
    if sampler is not None:
        sampler.active.set()
    cpu0 = [worker_cpu(p.pid) for p in procs]
    srv0 = server_cpu(postmaster)
    machine0 = machine_cpu()
    done0, t0 = _completed(args.system), time.monotonic()
    while True:
        time.sleep(0.05)
        done = _completed(args.system)
        if done >= args.tasks * 0.9 or not any(p.poll() is None for p in procs):
            break
    cpu1 = [worker_cpu(p.pid) for p in procs]
    srv1 = server_cpu(postmaster)
    machine1 = machine_cpu()
    done1, t1 = _completed(args.system), time.monotonic()
    slots = {}
    if sampler is not None:
        sampler.stop.set()
        sampler.join(10)
        slots = {"slots": sampler.summary()}
    if args.system == "oban":  # no burst mode: stopped once every job is done
        deadline = time.monotonic() + 300
        while _completed(args.system) < args.tasks and time.monotonic() < deadline:
            time.sleep(0.05)
        for proc in procs:
            proc.terminate()
    connections.close_all()
    for proc in procs:
        proc.wait(timeout=300)
    close_db()
    stats = _collect(args.tasks, TABLES[args.system])
    measured = done1 - done0
    worker_s = sum(cpu1) - sum(cpu0)
    server_s = srv1 - srv0
    return {
        "tasks_per_s": round(measured / (t1 - t0), 1),
        "tasks_measured": measured,
        "worker_cpu_ms_per_task": round(worker_s * 1000 / measured, 3),
        "server_cpu_ms_per_task": round(server_s * 1000 / measured, 3),
        "total_cpu_ms_per_task": round((worker_s + server_s) * 1000 / measured, 3),
        # Busy share of the machine's cores over the window, and how much of it was not this
        # bench (other jobs on a shared machine).
        "machine_busy": round((machine1[0] - machine0[0]) / (machine1[1] - machine0[1]), 3),
        "others_cpu_s_per_s": round(
            ((machine1[0] - machine0[0]) - worker_s - server_s) / (t1 - t0), 3
        ),
        "wall_s": round(t1 - t0, 3),
        "exit_codes": [p.returncode for p in procs],
        "tracebacks": sum(path.read_text().count("Traceback") for path in logs),
        **slots,
        **stats,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=5000)
    parser.add_argument("--processes", type=int, default=1)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--label", default="", help="added to the result file's name")
    parser.add_argument(
        "--system",
        choices=sorted(TABLES),
        default="pmcp",
        help="whose workers burn the tasks down: ours, or oban's Python port (the peers "
        "scenario's seeding, command and settings)",
    )
    parser.add_argument(
        "--variant",
        choices=VARIANTS,
        help="seed this data set of the variants scenario (bench/README.md) instead of "
        "plain tasks in one run",
    )
    parser.add_argument(
        "--history",
        type=int,
        default=0,
        help="first burn down this many tasks of another run, so the history tables hold "
        "rows and are analyzed as in a live database",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="log a sample of the plans (auto_explain) into the work directory's server.log",
    )
    parser.add_argument(
        "--sample-slots",
        action="store_true",
        help="sample the capped runs' free slots that no ready task holds, and the tasks in "
        "flight, every ~3 ms from another connection (adds its own load to the server)",
    )
    args = parser.parse_args(argv)
    if args.system != "pmcp" and (args.variant or args.history or args.sample_slots):
        parser.error("--variant, --history and --sample-slots are parallel_mcp's data sets")

    from bench import dbs
    from tests import pg_cluster

    preload = {
        "shared_preload_libraries": "'pg_stat_statements'",
        "pg_stat_statements.track_planning": "on",
        "track_wal_io_timing": "on",
    }
    if args.explain:
        preload = {
            "shared_preload_libraries": "'pg_stat_statements,auto_explain'",
            "auto_explain.log_min_duration": "0",
            "auto_explain.sample_rate": "0.01",
            "auto_explain.log_nested_statements": "on",
            "pg_stat_statements.track_planning": "on",
            "track_wal_io_timing": "on",
        }
    with (
        mock.patch.dict(pg_cluster.SERVER_SETTINGS, preload),
        dbs.durable_cluster() as pg_env,
    ):
        workdir = Path(os.environ.get("TMPDIR", "/tmp")) / f"pmcp-pg-server-{os.getpid()}"
        workdir.mkdir(parents=True, exist_ok=True)
        os.environ.update(dbs.process_env(dbs.CONFIGS["postgres"], workdir, pg_env))
        import django

        django.setup()
        from bench.driver import Driver
        from bench.plan import FULL

        driver = Driver("postgres", FULL, workdir, workdir / "unused.json")
        driver.migrate()
        with _cursor() as cursor:
            cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            cursor.execute("SELECT pg_backend_pid()")
            backend = cursor.fetchone()[0]
        postmaster = int(Path(f"/proc/{backend}/stat").read_text().rsplit(")", 1)[1].split()[1])
        driver.ws.snapshot("empty")
        results = []
        for rep in range(args.reps):
            _restore_seeded(driver, args)
            with _cursor() as cursor:
                cursor.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            results.append(_one_run(args, postmaster, workdir, rep))
            r = results[-1]
            if args.explain:
                # The postmaster runs in the data directory; its log is beside it.
                server_log = Path(f"/proc/{postmaster}/cwd").resolve().parent / "server.log"
                kept = workdir / f"server-r{rep}.log"
                kept.write_text(server_log.read_text(errors="replace"))
                print(f"plans: {kept}", flush=True)
            print(
                f"rep {rep + 1}: {r['tasks_per_s']} tasks/s; CPU per task: worker "
                f"{r['worker_cpu_ms_per_task']} ms, server {r['server_cpu_ms_per_task']} ms; "
                f"machine busy {r['machine_busy']:.0%}, others {r['others_cpu_s_per_s']} cores",
                flush=True,
            )
            if "slots" in r:
                print(f"  slots: {r['slots']}", flush=True)
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=REPO
    ).stdout.strip()
    out = {
        "args": vars(args),
        "commit": commit,
        "load": os.getloadavg(),
        "runs": results,
    }
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    label = f"-{args.label}" if args.label else ""
    path = REPO / "bench" / "results" / f"pg-server-{stamp}{label}.json"
    path.write_text(json.dumps(out, indent=2))
    _print(results[-1])
    print(f"written: {path.relative_to(REPO)}")
    return 0


def _print(r: dict[str, Any]) -> None:
    print("\nstatements (server execution time per task, top 20):")
    for s in r["statements"][:20]:
        print(
            f"  {s['per_task_us']:8.1f} us  {s['calls_per_task']:6.3f}/task  "
            f"plan {s['plan_us_per_task']:5.1f} us  {s['query'][:140]}"
        )
    total = sum(s["per_task_us"] for s in r["statements"])
    print(
        f"  total {total:.1f} us per task in execution, {r['plan_us_per_task']} us planning; "
        f"{r['statements_per_cycle']} statements per cycle (one COMMIT each)"
    )
    print("\nrows per task:")
    for name, t in sorted(r["tables"].items()):
        print(f"  {name:20s} {t['per_task']}  indexes: {len(r['indexes'].get(name, []))}")
    print(f"\nWAL per task: {r['wal']}")


if __name__ == "__main__":
    raise SystemExit(main())

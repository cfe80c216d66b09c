#!/usr/bin/env python
"""How fast the admin renders at scale (a benchmark, not a test).

    python bench/admin_scale.py                      # SQLite, 100,000 tasks, 1,000,000 events
    python bench/admin_scale.py --db postgres        # a throwaway PostgreSQL cluster
    python bench/admin_scale.py --events-per-task 1  # smaller

It migrates a fresh database (a temporary SQLite file, or a throwaway PostgreSQL cluster started
with tests/pg_cluster.py unless PMCP_PG_HOST names one; its ``postgres`` database must be
empty), bulk-loads it with tests/admin_support.seed_scale (1,000 runs of 50 tasks, one run of
50,000 tasks, 10 events per task by default) plus one demo-like run, logs a superuser in with
Django's test client and requests each admin page ``--repeat`` times after a warm-up. It prints
one line per page: statements, then the median and slowest wall time of the whole request and
the median time spent inside ``cursor.execute`` (SQLite's driver reads most rows on fetch, after
that call, so its SQL figure undercounts).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--repeat", type=int, default=5, help="timed requests per page (5)")
    parser.add_argument("--small-runs", type=int, default=1_000)
    parser.add_argument("--tasks-per-run", type=int, default=50)
    parser.add_argument("--big-run-tasks", type=int, default=50_000)
    parser.add_argument("--events-per-task", type=int, default=10)
    return parser.parse_args(argv)


@contextlib.contextmanager
def database(kind: str):
    """Point tests.settings at a fresh database of ``kind``; yield a description of it."""
    os.environ["PMCP_TEST_DB"] = kind
    if kind == "sqlite":
        with tempfile.TemporaryDirectory(prefix="pmcp-bench-") as directory:
            os.environ["PMCP_DB_NAME"] = str(Path(directory) / "bench.sqlite3")
            yield "SQLite (temporary file, WAL)"
        return
    if os.environ.get("PMCP_PG_HOST"):
        yield f"PostgreSQL at {os.environ['PMCP_PG_HOST']}:{os.environ.get('PMCP_PG_PORT', 5432)}"
        return
    from tests.pg_cluster import throwaway_cluster

    with throwaway_cluster() as cluster:
        os.environ.update(cluster.env())
        yield "PostgreSQL (throwaway cluster, fsync off)"


class SqlTimer:
    """An execute wrapper summing the time spent in the database."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.count = 0

    def __call__(self, execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            self.seconds += time.perf_counter() - started
            self.count += 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sys.path.insert(0, str(REPO))
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    with database(args.db) as description:
        import django

        django.setup()
        from django.core.management import call_command
        from django.db import connection
        from django.test import Client
        from django.test.utils import CaptureQueriesContext, setup_test_environment

        from parallel_mcp import Orchestrator
        from tests.admin_support import full_counts, make_user, seed_fanout_run, seed_scale
        from tests.test_admin_scale import pages

        setup_test_environment()
        call_command("migrate", verbosity=0)
        print(f"database: {description}; {connection.vendor} {connection.Database.__name__}")
        print(
            f"python {platform.python_version()}, django {django.get_version()}, "
            f"{platform.machine()}"
        )
        started = time.perf_counter()
        ids = seed_scale(
            small_runs=args.small_runs,
            tasks_per_small_run=args.tasks_per_run,
            big_run_tasks=args.big_run_tasks,
            events_per_task=args.events_per_task,
        )
        ids["demo_run_id"] = seed_fanout_run(Orchestrator())["run"].id
        print(
            f"seeded {ids['tasks']:,} tasks and {ids['events']:,} events "
            f"in {time.perf_counter() - started:.1f} s"
        )
        client = Client()
        client.force_login(make_user("superuser", "bench"))

        header = f"{'page':32} {'queries':>7} {'median ms':>10} {'max ms':>8} {'sql ms':>8}  notes"
        print()
        print(header)
        print("-" * len(header))
        for name, address in pages(ids).items():
            client.get(address)  # warm up
            walls, sqls, counts, notes = [], [], set(), ""
            for _ in range(args.repeat):
                timer = SqlTimer()
                with connection.execute_wrapper(timer):
                    with CaptureQueriesContext(connection) as captured:
                        began = time.perf_counter()
                        response = client.get(address)
                        walls.append(time.perf_counter() - began)
                sqls.append(timer.seconds)
                counts.add(timer.count)
                if response.status_code != 200:
                    notes = f"HTTP {response.status_code}"
                if full_counts(captured.captured_queries):
                    notes = "FULL COUNT"
            print(
                f"{name:32} {max(counts):7d} {statistics.median(walls) * 1000:10.1f} "
                f"{max(walls) * 1000:8.1f} {statistics.median(sqls) * 1000:8.1f}  {notes}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

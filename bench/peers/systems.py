"""The systems of the "peers" scenario: how each one's workers are started, which settings the
bench chose for it (and the documentation that justifies them), and how its own rows tell when
each worker claimed its first task and when each task finished.

Runs in the driver (the bench's virtualenv, Django set up with ``bench.settings``) and imports
no peer: peers run in processes of their own, some under a second interpreter (Python >= 3.12,
``PMCP_BENCH_PEERS_PYTHON``; the Makefile's ``venv-bench-peers`` makes it).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent.parent
PEERS_VENV = REPO / ".venv-bench-peers"

Firsts = dict[str, datetime]


def peers_python() -> str | None:
    """The Python >= 3.12 interpreter of oban and django-ox, or None."""
    configured = os.environ.get("PMCP_BENCH_PEERS_PYTHON")
    if configured:
        return configured
    default = PEERS_VENV / "bin" / "python"
    return str(default) if default.exists() else None


def timestamp(value: Any) -> datetime:
    """A column value as an aware UTC datetime: a datetime (naive ones are UTC, as Oban's
    ``timestamp without time zone`` columns are), Django's SQLite text, or epoch
    milliseconds (DBOS)."""
    if isinstance(value, int | float):
        return datetime.fromtimestamp(value / 1000, UTC)
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _json_list(value: Any) -> list:
    return json.loads(value) if isinstance(value, str | bytes) else list(value or [])


def _rows(sql: str) -> list[tuple]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(sql)
        return cursor.fetchall()


def _vendor() -> str:
    from django.db import connection

    return connection.vendor


def _firsts_from(rows: list[tuple]) -> Firsts:
    """(worker, claim time) pairs -> the earliest claim of each worker."""
    firsts: Firsts = {}
    for worker, moment in rows:
        if worker is None or moment is None:
            continue
        moment = timestamp(moment)
        key = str(worker)
        if key not in firsts or moment < firsts[key]:
            firsts[key] = moment
    return firsts


# -- each system's rows ------------------------------------------------------------------------


def _pmcp_firsts() -> Firsts:
    return _firsts_from(
        _rows("SELECT worker_id, MIN(leased_at) FROM pmcp_attempt GROUP BY worker_id")
    )


def _pmcp_completions() -> list[datetime]:
    return [
        timestamp(r[0])
        for r in _rows("SELECT completed_at FROM pmcp_task WHERE status = 'completed'")
    ]


def _tasks_framework_firsts(table: str) -> Firsts:
    """django-tasks-db and django-ox: ``worker_ids`` (JSON list, the last is the worker that
    claimed last) and ``started_at`` (the first claim's time)."""
    rows = _rows(f"SELECT worker_ids, started_at FROM {table} WHERE started_at IS NOT NULL")
    return _firsts_from([((_json_list(ids) or [None])[-1], started) for ids, started in rows])


def _tasks_framework_completions(table: str) -> list[datetime]:
    return [
        timestamp(r[0])
        for r in _rows(
            f"SELECT finished_at FROM {table} "
            "WHERE status = 'SUCCESSFUL' AND finished_at IS NOT NULL"
        )
    ]


def _oban_firsts() -> Firsts:
    # attempted_by = [node, producer uuid]; the node is unique per process (hostname.pid).
    return _firsts_from(
        _rows(
            "SELECT attempted_by[1], MIN(attempted_at) FROM oban_jobs "
            "WHERE attempted_at IS NOT NULL GROUP BY 1"
        )
    )


def _oban_completions() -> list[datetime]:
    return [
        timestamp(r[0])
        for r in _rows("SELECT completed_at FROM oban_jobs WHERE state = 'completed'")
    ]


def _procrastinate_firsts() -> Firsts:
    # A stopping worker deletes its procrastinate_workers row and its jobs' worker_id becomes
    # NULL: the driver reads this while the workers still run.
    return _firsts_from(
        _rows(
            "SELECT j.worker_id, MIN(e.at) FROM procrastinate_events e "
            "JOIN procrastinate_jobs j ON j.id = e.job_id "
            "WHERE e.type = 'started' AND j.worker_id IS NOT NULL GROUP BY j.worker_id"
        )
    )


def _procrastinate_completions() -> list[datetime]:
    return [
        timestamp(r[0])
        for r in _rows("SELECT at FROM procrastinate_events WHERE type = 'succeeded'")
    ]


def _dbos_table() -> str:
    return "dbos.workflow_status" if _vendor() == "postgresql" else "workflow_status"


def _dbos_firsts() -> Firsts:
    return _firsts_from(
        _rows(
            f"SELECT executor_id, MIN(started_at_epoch_ms) FROM {_dbos_table()} "
            "WHERE started_at_epoch_ms IS NOT NULL AND queue_name = 'bench' GROUP BY executor_id"
        )
    )


def _dbos_completions() -> list[datetime]:
    return [
        timestamp(r[0])
        for r in _rows(
            f"SELECT completed_at FROM {_dbos_table()} "
            "WHERE status = 'SUCCESS' AND queue_name = 'bench' AND completed_at IS NOT NULL"
        )
    ]


# -- the systems ------------------------------------------------------------------------------

# What every system shares (bench/README.md, "peers"): the same database (file or cluster) and
# durability settings, the same number of pre-seeded no-op tasks, processes started by the
# driver, per-task log lines dropped (bench/peers/logfilter.py).


@dataclass(frozen=True)
class System:
    name: str
    label: str
    packages: tuple[str, ...]  # distributions whose versions the results record
    interpreter: str  # "bench": the bench's virtualenv; "peers": the Python >= 3.12 one
    engines: tuple[str, ...]  # database engines it runs on: "sqlite", "postgres"
    marker: str  # what a worker's output says once it has started
    build: Callable[[str, str, int], list[str]]  # (python, worker id, slots) -> argv
    firsts: Callable[[], Firsts]
    completions: Callable[[], list[datetime]]
    settings: dict[str, str]  # what the bench chose, with the documentation behind it
    multi_slot: bool = True  # runs several tasks at a time in one process
    env: dict[str, str] = field(default_factory=dict)
    not_on: dict[str, str] = field(default_factory=dict)  # engine -> why it does not run there
    no_slots: str = ""  # why it has no several-at-a-time mode

    def python(self) -> str | None:
        return sys.executable if self.interpreter == "bench" else peers_python()

    def command(self, worker_id: str, slots: int) -> list[str]:
        python = self.python()
        if python is None:
            raise RuntimeError(f"{self.name}: no interpreter")
        return self.build(python, worker_id, slots)

    def process_env(self, base: dict[str, str]) -> dict[str, str]:
        env = dict(base)
        env["PYTHONUNBUFFERED"] = "1"  # start markers printed to stdout reach the log at once
        env.update(self.env)
        if self.env.get("PMCP_BENCH_SYSTEM"):
            env["DJANGO_SETTINGS_MODULE"] = "bench.peers.settings"
        return env


def _django(python: str, *args: str) -> list[str]:
    return [python, "-m", "django", *args]


def _pg_dsn() -> str:
    return (
        f"postgresql://{os.environ['PMCP_PG_USER']}@{os.environ['PMCP_PG_HOST']}:"
        f"{os.environ['PMCP_PG_PORT']}/{os.environ['PMCP_PG_DB']}"
    )


def _oban_command(python: str, worker_id: str, slots: int) -> list[str]:
    dsn = _pg_dsn()
    return [python, "-m", "oban", "start", "--dsn", dsn, "--queues", f"default:{slots}",
            "--cron-modules", "bench.peers.oban_jobs", "--log-level", "WARNING"]  # fmt: skip


def _dbos_command(python: str, worker_id: str, slots: int) -> list[str]:
    return [python, "-m", "bench.peers.dbos_app", "work", "--executor-id", worker_id,
            "--slots", str(slots)]  # fmt: skip


PMCP = System(
    name="pmcp",
    label="parallel_mcp",
    packages=("parallel-mcp", "django"),
    interpreter="bench",
    engines=("sqlite", "postgres"),
    marker=" started: ",
    build=lambda py, wid, slots: _django(
        py, "pmcp_worker", "--burst", "--concurrency", str(slots), "--worker-id", wid
    ),
    firsts=_pmcp_firsts,
    completions=_pmcp_completions,
    settings={
        "command": "python -m django pmcp_worker --burst --concurrency {1|8} --worker-id ID",
        "slots": "--concurrency 1 is the default (one task at a time); with --concurrency 8 "
        "the worker claims up to --claim-batch tasks (default 16) in one transaction and "
        "group-commits completions (docs/performance.md)",
        "connections": "the worker keeps one connection per process (and per slot thread)",
        "wake-up": "LISTEN/NOTIFY on PostgreSQL, PRAGMA data_version polling on SQLite (defaults)",
        "database": "bench.settings: SQLite WAL, IMMEDIATE, synchronous=FULL, busy_timeout 30 s; "
        "PostgreSQL with psycopg 3, OPTIONS prepare_threshold=5 (no pooler: docs/settings.md)",
    },
)

DTDB = System(
    name="dtdb",
    label="django-tasks-db",
    packages=("django-tasks-db", "django-tasks", "django"),
    interpreter="bench",
    engines=("sqlite", "postgres"),
    marker="Starting worker worker_id=",
    build=lambda py, wid, slots: _django(
        py, "db_worker", "--batch", "--no-reload", "--no-startup-delay", "--worker-id", wid
    ),
    firsts=lambda: _tasks_framework_firsts("django_tasks_database_dbtaskresult"),
    completions=lambda: _tasks_framework_completions("django_tasks_database_dbtaskresult"),
    env={"PMCP_BENCH_SYSTEM": "dtdb"},
    multi_slot=False,
    no_slots="db_worker runs one task at a time per process and has no concurrency option",
    settings={
        "command": "python -m django db_worker --batch --no-reload --no-startup-delay "
        "--worker-id ID",
        "options": "--no-reload, as its README says for production; --batch exits when the "
        "queue is empty (like pmcp_worker --burst); --no-startup-delay skips the random "
        "start-up sleep of up to 1 s (start-up only); --interval stays at its default (1 s, "
        "slept only when the queue is empty)",
        "connections": "CONN_MAX_AGE=600, CONN_HEALTH_CHECKS=True (bench/peers/settings.py): "
        "db_worker calls close_old_connections() around every task, so with Django's default "
        "CONN_MAX_AGE=0 it would reconnect for every task",
        "database": "the same DATABASES as parallel_mcp (bench.settings, with prepare_threshold=5 "
        "on PostgreSQL)",
    },
)

OX = System(
    name="ox",
    label="django-ox",
    packages=("django-ox", "django"),
    interpreter="peers",
    engines=("sqlite", "postgres"),
    marker=" starting: queues=",
    build=lambda py, wid, slots: _django(py, "ox_worker", "--batch", "--concurrency", str(slots)),
    firsts=lambda: _tasks_framework_firsts("django_ox_oxtask"),
    completions=lambda: _tasks_framework_completions("django_ox_oxtask"),
    env={"PMCP_BENCH_SYSTEM": "ox"},
    settings={
        "command": "python -m django ox_worker --batch --concurrency {1|8}",
        "slots": "--concurrency N: a thread pool of N (its README's worker CLI)",
        "options": "--batch exits once a poll finds nothing to claim (like pmcp_worker "
        "--burst); --interval stays at its default (1 s, only when idle or full); package "
        "defaults otherwise (MAX_ATTEMPTS 3, LOCK_TIMEOUT 300 s)",
        "connections": "CONN_MAX_AGE=600, CONN_HEALTH_CHECKS=True: django-ox 1.9.1's CHANGELOG "
        "and its worker_connection_hint warning ('Retaining worker connections' in its "
        "docs/production.md) say to set CONN_MAX_AGE above 0 with health checks for workers",
        "database": "the same DATABASES as parallel_mcp (bench.settings, with prepare_threshold=5 "
        "on PostgreSQL), Django 6.1",
    },
)

OBAN = System(
    name="oban",
    label="oban (Python)",
    packages=("oban",),
    interpreter="peers",
    engines=("postgres",),
    marker="Job orchestration framework for Python",
    build=_oban_command,
    firsts=_oban_firsts,
    completions=_oban_completions,
    not_on={"sqlite": "oban's Python port supports PostgreSQL only (its README: PostgreSQL 14+)"},
    settings={
        "command": "python -m oban start --dsn DSN --queues default:{1|8} "
        "--cron-modules bench.peers.oban_jobs --log-level WARNING",
        "slots": "--queues default:N, the queue's concurrency limit per node",
        "options": "the CLI, which its docs/production.md call production-ready (pruner, "
        "lifeline, PostgreSQL LISTEN/NOTIFY notifier, stager every 1 s: all defaults); pool "
        "1-10 connections (default, 'comfortable for most deployments'); --cron-modules names "
        "the jobs module so that start-up does not grep the working tree for cron workers; "
        "--log-level WARNING drops its per-job INFO lines like every system's here",
        "database": "the same PostgreSQL database; no SQLite support",
    },
)

PROCRASTINATE = System(
    name="procrastinate",
    label="procrastinate",
    packages=("procrastinate",),
    interpreter="bench",
    engines=("postgres",),
    marker="Starting worker on ",
    build=lambda py, wid, slots: _django(
        py, "procrastinate", "worker", "--concurrency", str(slots), "--name", wid
    ),
    firsts=_procrastinate_firsts,
    completions=_procrastinate_completions,
    env={"PMCP_BENCH_SYSTEM": "procrastinate"},
    not_on={"sqlite": "procrastinate supports PostgreSQL only"},
    settings={
        "command": "python -m django procrastinate worker --concurrency {1|8} --name ID",
        "slots": "--concurrency N asynchronous sub-workers (docs/howto/production/"
        "concurrency.md); the no-op task is async, as that page recommends",
        "options": "its Django integration (docs/howto/django): the worker gets a psycopg "
        "pool connector with LISTEN/NOTIFY (defaults: listen_notify on, polling every 5 s as "
        "a fallback, delete_jobs never)",
        "database": "the same PostgreSQL database; no SQLite support",
    },
)

DBOS = System(
    name="dbos",
    label="dbos",
    packages=("dbos",),
    interpreter="bench",
    engines=("sqlite", "postgres"),
    marker="dbos worker ",
    build=_dbos_command,
    firsts=_dbos_firsts,
    completions=_dbos_completions,
    settings={
        "command": "python -m bench.peers.dbos_app work --executor-id ID --slots {1|8} "
        "(DBOS has no worker command: DBOS.launch() in a process of ours)",
        "slots": "the queue's worker_concurrency (DBOS.register_queue), with a unique "
        "executor_id per process as its queue docs require without Conductor",
        "options": "polling_interval_sec=0.01: the default 1 s caps a worker at one dequeue a "
        "second (about 1 task/s with one slot); application_version fixed so every process "
        "dequeues the seeded workflows; log_level WARNING; a sync no-op workflow",
        "database": "system database = the bench's work database (SQLite file in WAL mode "
        "with SQLite's default synchronous=FULL; PostgreSQL schema dbos)",
    },
)

SYSTEMS: dict[str, System] = {s.name: s for s in (PMCP, DTDB, OX, OBAN, PROCRASTINATE, DBOS)}


def versions(system: System) -> tuple[dict[str, str] | None, str | None]:
    """({distribution: version, "python": version}, None) when the system can run here,
    else (None, why not)."""
    python = system.python()
    if python is None:
        return None, (
            "needs Python >= 3.12: no peers interpreter (make venv-bench-peers, or set "
            "PMCP_BENCH_PEERS_PYTHON)"
        )
    probe = (
        "import importlib.metadata as m, json, platform; "
        f"d = {{p: m.version(p) for p in {list(system.packages)!r}}}; "
        "d['python'] = platform.python_version(); print(json.dumps(d))"
    )
    if python == sys.executable:
        import platform
        from importlib.metadata import PackageNotFoundError, version

        try:
            found = {p: version(p) for p in system.packages}
        except PackageNotFoundError as exc:
            return None, f"not installed: {exc} (pip install -e '.[bench]')"
        return {**found, "python": platform.python_version()}, None
    with contextlib.suppress(OSError, subprocess.SubprocessError, ValueError):
        out = subprocess.run(
            [python, "-c", probe], capture_output=True, text=True, timeout=60, check=False
        )
        if out.returncode == 0:
            return json.loads(out.stdout), None
        return None, f"not installed in {python}: {out.stderr.strip().splitlines()[-1:]}"
    return None, f"{python} does not run"


def seed_command(system: System, tasks: int) -> list[str]:
    python = system.python()
    if python is None:
        raise RuntimeError(f"{system.name}: no interpreter")
    return [python, "-m", "bench.peers.seed", system.name, "--tasks", str(tasks)]

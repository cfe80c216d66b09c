"""Helpers for the admin tests (tests/test_admin_*.py) and bench/admin_scale.py: users with the
roles the admin knows, a demo-like run with finished, failed and dead-lettered tasks, the
checks on captured SQL, and a fast bulk seed of a large database (raw INSERT ... SELECT)."""

from __future__ import annotations

import re
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db import connections
from django.urls import reverse
from django.utils import timezone

from parallel_mcp import Orchestrator
from parallel_mcp.models import Run

PASSWORD = "pmcp-admin-test"
VIEW_PERMISSIONS = [
    "view_run",
    "view_task",
    "view_event",
    "view_contextsnapshot",
    "view_attempt",
    "view_lease",
]
ROLES = ("superuser", "operator", "viewer", "staff")


def make_user(role: str, username: str | None = None):
    """``superuser``; ``operator`` (view permissions + operate_runs); ``viewer`` (view
    permissions only); ``staff`` (staff, no permission at all)."""
    assert role in ROLES, role
    User = get_user_model()
    username = username or role
    if role == "superuser":
        return User.objects.create_superuser(username, f"{username}@example.com", PASSWORD)
    user = User.objects.create_user(username, f"{username}@example.com", PASSWORD, is_staff=True)
    codenames = []
    if role in ("operator", "viewer"):
        codenames += VIEW_PERMISSIONS
    if role == "operator":
        codenames.append("operate_runs")
    if codenames:
        user.user_permissions.set(
            Permission.objects.filter(
                content_type__app_label="parallel_mcp", codename__in=codenames
            )
        )
    return user


def login(client, role: str, username: str | None = None):
    user = make_user(role, username)
    client.force_login(user)
    return user


def url(name: str, *args: Any, query: str = "") -> str:
    """``url("task_change", pk)`` -> /admin/parallel_mcp/task/<pk>/change/"""
    path = reverse(f"admin:parallel_mcp_{name}", args=args)
    return f"{path}?{query}" if query else path


def object_action_url(model: str, pk: Any, action: str) -> str:
    return reverse(f"admin:parallel_mcp_{model}_object_action", args=[pk, action])


def messages_of(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


# -- a demo-like run --------------------------------------------------------------------------
def take(orch: Orchestrator, task, worker: str = "w1", now=None, lease_ms: int | None = None):
    claim = orch.claim_next_task(worker_id=worker, kinds=[task.kind], now=now, lease_ms=lease_ms)
    assert claim is not None and claim.task.id == task.id, (task, claim)
    return claim


def _lease(claim, worker: str = "w1") -> dict[str, Any]:
    return {"task_id": claim.task.id, "lease_id": claim.lease.id, "worker_id": worker}


def complete(orch: Orchestrator, task, output: Any = None, **kwargs):
    claim = take(orch, task)
    orch.mark_task_running(**_lease(claim))
    return orch.complete_task(**_lease(claim), output=output or {"ok": task.key}, **kwargs)


def fail(orch: Orchestrator, task, error: str = "boom", retry: bool = False):
    claim = take(orch, task)
    orch.mark_task_running(**_lease(claim))
    return orch.fail_task(**_lease(claim), error=error, retry=retry)


def seed_fanout_run(orch: Orchestrator, *, fetches: int = 4, namespace: str = "demo") -> dict:
    """A finished run shaped like the demo's::

        parse -> fetch-1 .. fetch-N -> aggregate        flaky (dead-lettered)

    parse completes (writing a context snapshot), every fetch completes except the last, which
    fails; aggregate is stuck behind it; flaky runs out of attempts. The run ends ``failed``.
    Returns the run and its tasks by key."""
    run = orch.create_run(
        namespace=namespace, external_id="demo-1", metadata={"seeded": True}, context={"n": 0}
    )
    keys = [f"fetch-{index}" for index in range(1, fetches + 1)]
    tasks = orch.enqueue_tasks(
        run_id=run.id,
        tasks=[
            {"kind": "demo.parse", "key": "parse", "priority": 10, "input": {"items": keys}},
            *(
                {"kind": "demo.fetch", "key": key, "depends_on": ["parse"], "input": {"i": key}}
                for key in keys
            ),
            {"kind": "demo.aggregate", "key": "aggregate", "depends_on": keys},
            {"kind": "demo.flaky", "key": "flaky", "max_attempts": 1},
        ],
    )
    by_key = {task.key: task for task in tasks}
    complete(orch, by_key["parse"], next_context={"n": 1, "plan": keys}, next_context_label="plan")
    for key in keys[:-1]:
        complete(orch, by_key[key])
    fail(orch, by_key[keys[-1]], error="ConnectionError: upstream timed out\n  at fetch()")
    fail(orch, by_key["flaky"], error="simulated network blip", retry=True)
    by_key = {task.key: orch.get_task(task_id=task.id) for task in tasks}
    return {"run": orch.get_run(run_id=run.id), "tasks": by_key}


# -- SQL checks -------------------------------------------------------------------------------
BIG_TABLES = ("pmcp_event", "pmcp_task")
_COUNT = re.compile(r"\bCOUNT\s*\(", re.IGNORECASE)
_RUN_FILTER = re.compile(r"""["`]?run_id["`]?\s*=""", re.IGNORECASE)


def full_counts(queries: list[dict[str, str]]) -> list[str]:
    """Captured statements that COUNT over pmcp_event or pmcp_task without a WHERE on the
    indexed run_id (a count of one run's rows is bounded; a count of the table is not)."""
    bad = []
    for query in queries:
        sql = query["sql"]
        if not _COUNT.search(sql):
            continue
        if not any(table in sql for table in BIG_TABLES):
            continue
        where = sql.upper().split(" WHERE ", 1)
        if len(where) == 2 and _RUN_FILTER.search(where[1]):
            continue
        bad.append(sql)
    return bad


# -- a large database, fast -------------------------------------------------------------------
SEED_T0 = datetime(2026, 1, 1, tzinfo=UTC)


def _sql_uuid(vendor: str) -> str:
    if vendor == "postgresql":
        return "gen_random_uuid()"
    return "lower(hex(randomblob(16)))"


def _ts(vendor: str, seconds_sql: str) -> str:
    """A timestamp SEED_T0 + <seconds_sql> seconds, in the column format of the vendor."""
    if vendor == "postgresql":
        return f"(TIMESTAMPTZ '2026-01-01 00:00:00+00' + ({seconds_sql}) * INTERVAL '1 second')"
    return (
        f"strftime('%Y-%m-%d %H:%M:%f', '2026-01-01 00:00:00', "
        f"'+' || ({seconds_sql}) || ' seconds')"
    )


def _series(vendor: str, name: str, count: int) -> tuple[str, str]:
    """(WITH prefix, FROM item) producing integers 1..count as ``<name>.n``."""
    if vendor == "postgresql":
        return "", f"generate_series(1, {int(count)}) AS {name}(n)"
    return (
        f"WITH RECURSIVE {name}(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM {name} "
        f"WHERE n < {int(count)}) ",
        name,
    )


def seed_scale(
    *,
    small_runs: int = 1_000,
    tasks_per_small_run: int = 50,
    big_run_tasks: int = 50_000,
    events_per_task: int = 10,
    using: str = "default",
    analyze: bool = True,
) -> dict[str, Any]:
    """Bulk-load a large database with raw INSERT ... SELECT (generate_series on PostgreSQL,
    a recursive CTE on SQLite): ``small_runs`` runs of ``tasks_per_small_run`` tasks each (a
    binary-tree DAG: task n depends on task n // 2), one big run of ``big_run_tasks`` tasks,
    and ``events_per_task`` events per task. Defaults: 100,000 tasks, 1,000,000 events.

    The rows are consistent enough for the admin (statuses, run counters that add up, lease
    columns empty); they are not a replay of real executions. Returns the ids of a small run
    and of the big run, a task of each, and the time taken."""
    started = time.monotonic()
    connection = connections[using]
    vendor = connection.vendor
    now = timezone.now()
    small_done = tasks_per_small_run - tasks_per_small_run // 10 - 2
    runs = [
        Run(
            namespace="bench" if index % 3 else "bench-alt",
            external_id=f"ext-{index}",
            status="failed",
            tasks_total=tasks_per_small_run,
            tasks_completed=small_done,
            tasks_failed=tasks_per_small_run // 10,
            tasks_active=1,
            tasks_stuck=1,
            created_at=SEED_T0 + timedelta(seconds=index),
            updated_at=SEED_T0 + timedelta(seconds=index),
        )
        for index in range(small_runs)
    ]
    big = Run(
        namespace="bench-big",
        external_id="ext-big",
        status="active",
        tasks_total=big_run_tasks,
        tasks_completed=big_run_tasks // 2,
        tasks_active=big_run_tasks - big_run_tasks // 2,
        created_at=now - timedelta(hours=1),
        updated_at=now,
    )
    Run.objects.using(using).bulk_create([*runs, big], batch_size=2_000)

    task_columns = (
        "id, run_id, key, kind, status, priority, attempt_count, max_attempts, progress, "
        "claimable, pending_blockers, blocks_others, unmet_dependencies, failed_dependencies, "
        "dead, error, created_at, updated_at"
    )
    true, false = ("TRUE", "FALSE") if vendor == "postgresql" else ("1", "0")
    tenth = max(1, tasks_per_small_run // 10)
    with_small, series_small = _series(vendor, "g", tasks_per_small_run)
    with_big, series_big = _series(vendor, "g", big_run_tasks)
    status_small = (
        f"CASE WHEN g.n <= {small_done} THEN 'completed' "
        f"WHEN g.n <= {small_done + tenth} THEN 'failed' ELSE 'queued' END"
    )
    dead_small = (
        f"CASE WHEN g.n > {small_done} AND g.n <= {small_done + tenth} THEN {true} ELSE {false} END"
    )
    error_small = (
        f"CASE WHEN g.n > {small_done} AND g.n <= {small_done + tenth} "
        "THEN 'max_attempts_exceeded' ELSE NULL END"
    )
    with connection.cursor() as cursor:
        cursor.execute(
            f"{with_small}INSERT INTO pmcp_task ({task_columns}) "
            f"SELECT {_sql_uuid(vendor)}, r.id, 't-' || g.n, 'bench.small', {status_small}, "
            f"g.n % 5, 3, 3, CASE WHEN g.n <= {small_done} THEN 1.0 ELSE 0.0 END, {true}, 0, "
            f"{false}, 0, 0, {dead_small}, {error_small}, "
            f"{_ts(vendor, 'g.n')}, {_ts(vendor, 'g.n + 60')} "
            f"FROM pmcp_run r CROSS JOIN {series_small} WHERE r.namespace <> 'bench-big'"
        )
        cursor.execute(
            f"{with_big}INSERT INTO pmcp_task ({task_columns}) "
            f"SELECT {_sql_uuid(vendor)}, r.id, 'b-' || g.n, 'bench.big', "
            f"CASE WHEN g.n <= {big_run_tasks // 2} THEN 'completed' ELSE 'queued' END, "
            f"g.n % 7, CASE WHEN g.n <= {big_run_tasks // 2} THEN 1 ELSE 0 END, NULL, "
            f"CASE WHEN g.n <= {big_run_tasks // 2} THEN 1.0 ELSE 0.0 END, {true}, 0, {false}, "
            f"0, 0, {false}, NULL, {_ts(vendor, 'g.n')}, {_ts(vendor, 'g.n')} "
            f"FROM pmcp_run r CROSS JOIN {series_big} WHERE r.namespace = 'bench-big'"
        )
        # The small runs' DAG: t-n depends on t-(n/2).
        half = "(CAST(substr(t.key, 3) AS INTEGER) / 2)"
        if vendor == "postgresql":
            half = "(CAST(substr(t.key, 3) AS INTEGER) / 2)"
        cursor.execute(
            "INSERT INTO pmcp_task_dependency (run_id, task_id, depends_on_id, required) "
            f"SELECT t.run_id, t.id, p.id, {true} FROM pmcp_task t "
            f"JOIN pmcp_task p ON p.run_id = t.run_id AND p.key = 't-' || {half} "
            "WHERE t.kind = 'bench.small' AND CAST(substr(t.key, 3) AS INTEGER) > 1"
        )
        with_events, series_events = _series(vendor, "e", events_per_task)
        types = (
            "CASE e.n % 5 WHEN 0 THEN 'task.enqueued' WHEN 1 THEN 'task.claimed' "
            "WHEN 2 THEN 'task.running' WHEN 3 THEN 'task.progress' ELSE 'task.completed' END"
        )
        payload = "'{}'::jsonb" if vendor == "postgresql" else "'{}'"
        cursor.execute(
            f"{with_events}INSERT INTO pmcp_event (run_id, task_id, event_type, payload, "
            "created_at) "
            f"SELECT t.run_id, t.id, {types}, {payload}, t.created_at "
            f"FROM pmcp_task t CROSS JOIN {series_events} ORDER BY t.created_at, e.n"
        )
        if analyze:
            cursor.execute("ANALYZE")
    small = Run.objects.using(using).filter(namespace="bench").order_by("created_at").first()
    from parallel_mcp.models import Task

    return {
        "small_run_id": small.id,
        "big_run_id": big.id,
        "small_task_id": Task.objects.using(using)
        .filter(run_id=small.id, key=f"t-{tasks_per_small_run}")
        .values_list("id", flat=True)
        .first(),
        "big_task_id": Task.objects.using(using)
        .filter(run_id=big.id, key="b-1")
        .values_list("id", flat=True)
        .first(),
        "tasks": small_runs * tasks_per_small_run + big_run_tasks,
        "events": (small_runs * tasks_per_small_run + big_run_tasks) * events_per_task,
        "seconds": time.monotonic() - started,
    }


def new_uuid() -> uuid.UUID:
    return uuid.uuid4()

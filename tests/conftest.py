from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from parallel_mcp import Orchestrator

T0 = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def at(seconds: float = 0, *, ms: int = 0) -> datetime:
    """A fixed point in time, ``seconds`` (+``ms``) after T0."""
    return T0 + timedelta(seconds=seconds, milliseconds=ms)


@pytest.fixture
def orch(db) -> Orchestrator:
    return Orchestrator(default_lease_ms=30_000)


@pytest.fixture
def run(orch):
    return orch.create_run(namespace="tests", now=at(0))


def claim(orch, worker: str = "w1", *, now=None, **kwargs):
    return orch.claim_next_task(worker_id=worker, now=now or at(1), **kwargs)


def event_types(orch, run_id) -> list[str]:
    return [event.event_type for event in orch.list_run_events(run_id=run_id)]


def claim_query_plan(now: datetime, kinds: list[str] | None = None) -> str:
    """The database's plan for the claim's own candidate query (services.claim)."""
    from django.db import connection, transaction

    from parallel_mcp.services.claim import candidates_sql
    from parallel_mcp.services.dialect import dialect_for

    sql, params = candidates_sql(dialect_for("default"), now=now, kinds=kinds)
    explain = "EXPLAIN QUERY PLAN " if connection.vendor == "sqlite" else "EXPLAIN "
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("ANALYZE pmcp_task")
        cursor.execute(explain + sql, [*params, 1])
        return "\n".join(" ".join(str(part) for part in row) for row in cursor.fetchall())


def assert_reads_the_claim_index_in_order(plan: str) -> None:
    """The plan walks pmcp_task_claim_idx in claim order: no sort of the ready backlog
    (SQLite: ``USE TEMP B-TREE FOR ORDER BY``; PostgreSQL: a ``Sort`` node)."""
    assert "pmcp_task_claim_idx" in plan, plan
    assert "TEMP B-TREE" not in plan and "Sort" not in plan, plan


def live_worker(*kinds: str, worker_id: str = "test-worker", using: str = "default"):
    """Record a running worker process that handles ``kinds``, for tests where "no running
    worker handles it" (explain_task's ``no_worker``) is not the point. It counts as running
    for days after the real clock, so also at every ``at(...)`` time."""
    from parallel_mcp.services import record_worker_presence

    return record_worker_presence(
        using=using,
        process_id=uuid.uuid4(),
        worker_id=worker_id,
        hostname="test-host",
        kinds=list(kinds),
        interval_ms=24 * 3600 * 1000,
    )

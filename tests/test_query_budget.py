"""Hot-path query counts and index use. The numbers here are quoted in docs/performance.md."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction

from parallel_mcp.models import Task
from parallel_mcp.services.leases import claim_candidates
from tests.conftest import at


def _fence() -> int:
    """PostgreSQL writers take the event-feed fence lock: one statement per write."""
    return 1 if connection.vendor == "postgresql" else 0


def _notify() -> int:
    """PostgreSQL writes that make a task claimable send one NOTIFY to wake idle workers."""
    return 1 if connection.vendor == "postgresql" else 0


# Each count includes the transaction's two boundary statements (SAVEPOINT/RELEASE inside
# the test's transaction; BEGIN/COMMIT in production).
# claim: candidate select, guarded update, attempt insert, lease insert, event insert.
CLAIM_QUERIES = 7
# running: task select, guarded update, attempt update, event insert.
RUNNING_QUERIES = 6
# heartbeat: lease+task select, guarded update, lease update, attempt update, event insert.
HEARTBEAT_QUERIES = 7
# complete: run lock, task select, guarded update, lease update, attempt update,
# dependents update, run counters update, event insert (+ NOTIFY on PostgreSQL when a
# dependent became ready, as here).
COMPLETE_QUERIES = 10


def test_claim_running_heartbeat_complete_query_counts(orch, run, django_assert_num_queries):
    first = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    orch.enqueue_task(run_id=run.id, kind="k", depends_on=[first.id], now=at(0))
    with django_assert_num_queries(CLAIM_QUERIES + _fence()):
        claim = orch.claim_next_task(worker_id="w", now=at(1))
    ids = {"task_id": claim.task.id, "lease_id": claim.lease.id, "worker_id": "w"}
    with django_assert_num_queries(RUNNING_QUERIES + _fence()):
        orch.mark_task_running(**ids, now=at(2))
    with django_assert_num_queries(HEARTBEAT_QUERIES + _fence()):
        orch.heartbeat_lease(**ids, now=at(3))
    with django_assert_num_queries(COMPLETE_QUERIES + _fence() + _notify()):
        orch.complete_task(**ids, output={"ok": True}, now=at(4))


def test_claim_cost_does_not_depend_on_backlog_size(orch, run, django_assert_num_queries):
    root = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    for _ in range(50):
        orch.enqueue_task(run_id=run.id, kind="k", depends_on=[root.id], now=at(0))
    with django_assert_num_queries(CLAIM_QUERIES + _fence()):
        orch.claim_next_task(worker_id="w", now=at(1))


def _seed_backlog(run, *, ready: int, blocked: int) -> None:
    """Bulk rows: ``ready`` queued tasks and ``blocked`` ones waiting on a dependency."""
    rows = []
    for index in range(ready + blocked):
        rows.append(
            Task(
                run_id=run.id,
                kind="bulk",
                priority=index % 7,
                unmet_dependencies=0 if index < ready else 1,
                created_at=at(index),
                updated_at=at(index),
            )
        )
    Task.objects.bulk_create(rows, batch_size=2000)


def _plan(queryset) -> str:
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE pmcp_task")
        return queryset.explain()


def test_claim_query_uses_the_partial_claim_index(orch, run):
    _seed_backlog(run, ready=200, blocked=5000)
    plan = _plan(claim_candidates("default", now=at(10_000))[:1])
    assert "pmcp_task_claim_idx" in plan, plan


def test_claim_query_with_kinds_uses_the_claim_index(orch, run):
    _seed_backlog(run, ready=200, blocked=5000)
    plan = _plan(claim_candidates("default", now=at(10_000), kinds=["bulk", "other"])[:1])
    assert "pmcp_task_claim_idx" in plan, plan


@pytest.mark.parametrize("blocked", [0, 3000])
def test_claim_picks_the_same_task_regardless_of_blocked_backlog(orch, run, blocked):
    _seed_backlog(run, ready=20, blocked=blocked)
    claim = orch.claim_next_task(worker_id="w", now=at(10_000) + timedelta(seconds=1))
    assert claim.task.priority == 6
    assert claim.task.unmet_dependencies == 0

"""Model instances and result objects as JSON-ready dicts: ids as strings, ISO 8601 datetimes.

Every function here may touch the database (lazy relations, dependency lists), so call them in
the same worker thread as the Orchestrator call that produced the objects.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date, datetime
from typing import Any
from uuid import UUID

from ..models import Attempt, ContextSnapshot, Event, Lease, Run, Task, TaskDependency
from ..results import Blocker, Claim, EventPage, ExpireResult, PruneResult


def plain(value: Any) -> Any:
    """A JSON-ready copy of ``value``: UUIDs and str-enums as strings, datetimes in ISO 8601."""
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return str(value)
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(key): plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(item) for item in value]
    return str(value)


def _id(value: Any) -> str | None:
    return None if value is None else str(value)


def _time(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def run(run: Run) -> dict[str, Any]:
    return {
        "id": str(run.pk),
        "namespace": run.namespace,
        "external_id": run.external_id,
        "status": str(run.status),
        "metadata": run.metadata,
        "current_context_snapshot_id": _id(run.current_context_snapshot_id),
        "max_parallel": run.max_parallel,
        "cancel_reason": run.cancel_reason,
        "counts": {
            "total": run.tasks_total,
            "active": run.tasks_active,
            "waiting": run.tasks_waiting,
            "stuck": run.tasks_stuck,
            "completed": run.tasks_completed,
            "failed": run.tasks_failed,
            "cancelled": run.tasks_cancelled,
        },
        "progress": run.progress,
        "created_at": _time(run.created_at),
        "updated_at": _time(run.updated_at),
    }


def dependencies_of(tasks: Iterable[Task]) -> dict[Any, list[str]]:
    """Every task's dependency ids (declaration order) in one query."""
    tasks = list(tasks)
    if not tasks:
        return {}
    using = tasks[0]._state.db or "default"
    found: dict[Any, list[str]] = {task.pk: [] for task in tasks}
    rows = (
        TaskDependency.objects.using(using)
        .filter(task_id__in=list(found))
        .order_by("id")
        .values_list("task_id", "depends_on_id")
    )
    for task_id, depends_on_id in rows:
        found[task_id].append(str(depends_on_id))
    return found


def task(task: Task, *, depends_on: list[str] | None = None) -> dict[str, Any]:
    if depends_on is None:
        depends_on = [str(dep) for dep in task.depends_on_task_ids]
    data = {
        "id": str(task.pk),
        "run_id": str(task.run_id),
        "key": task.key,
        "kind": task.kind,
        "status": str(task.status),
        "priority": task.priority,
        "max_attempts": task.max_attempts,
        "attempt_count": task.attempt_count,
        "retry_delay_ms": task.retry_delay_ms,
        "retry_backoff": task.retry_backoff,
        "retry_max_delay_ms": task.retry_max_delay_ms,
        "timeout_ms": task.timeout_ms,
        "not_before": _time(task.not_before),
        "input": task.input,
        "output": task.output,
        "metadata": task.metadata,
        "error": task.error,
        "progress": task.progress,
        "progress_message": task.progress_message,
        "context_snapshot_id": _id(task.context_snapshot_id),
        "lease_id": _id(task.lease_id),
        "leased_by": task.leased_by,
        "lease_expires_at": _time(task.lease_expires_at),
        "dead": task.dead,
        "depends_on_task_ids": depends_on,
        "created_at": _time(task.created_at),
        "updated_at": _time(task.updated_at),
        "started_at": _time(task.started_at),
        "completed_at": _time(task.completed_at),
    }
    running_for_ms = getattr(task, "running_for_ms", None)  # set by list_stuck_tasks
    if running_for_ms is not None:
        data["running_for_ms"] = running_for_ms
    return data


def tasks(items: Iterable[Task]) -> list[dict[str, Any]]:
    items = list(items)
    deps = dependencies_of(items)
    return [task(item, depends_on=deps.get(item.pk, [])) for item in items]


def attempt(attempt: Attempt) -> dict[str, Any]:
    return {
        "id": str(attempt.pk),
        "run_id": str(attempt.run_id),
        "task_id": str(attempt.task_id),
        "worker_id": attempt.worker_id,
        "status": str(attempt.status),
        "leased_at": _time(attempt.leased_at),
        "started_at": _time(attempt.started_at),
        "ended_at": _time(attempt.ended_at),
        "lease_expires_at": _time(attempt.lease_expires_at),
        "error": attempt.error,
        "output": attempt.output,
        "metadata": attempt.metadata,
    }


def lease(lease: Lease) -> dict[str, Any]:
    return {
        "id": str(lease.pk),
        "run_id": str(lease.run_id),
        "task_id": str(lease.task_id),
        "attempt_id": str(lease.attempt_id),
        "worker_id": lease.worker_id,
        "status": str(lease.status),
        "acquired_at": _time(lease.acquired_at),
        "expires_at": _time(lease.expires_at),
        "heartbeat_at": _time(lease.heartbeat_at),
        "released_at": _time(lease.released_at),
        "client_token": lease.client_token,
    }


def snapshot(snapshot: ContextSnapshot) -> dict[str, Any]:
    return {
        "id": str(snapshot.pk),
        "run_id": str(snapshot.run_id),
        "task_id": _id(snapshot.task_id),
        "scope": snapshot.scope,
        "parent_snapshot_id": _id(snapshot.parent_snapshot_id),
        "label": snapshot.label,
        "payload": snapshot.payload,
        "created_at": _time(snapshot.created_at),
    }


def event(event: Event) -> dict[str, Any]:
    return {
        "id": event.pk,
        "run_id": str(event.run_id),
        "task_id": _id(event.task_id),
        "attempt_id": _id(event.attempt_id),
        "event_type": event.event_type,
        "payload": plain(event.payload),
        "created_at": _time(event.created_at),
    }


def claim(claim: Claim) -> dict[str, Any]:
    return {
        "run": run(claim.run),
        "task": task(claim.task),
        "attempt": attempt(claim.attempt),
        "lease": lease(claim.lease),
    }


def claims(items: Iterable[Claim]) -> list[dict[str, Any]]:
    """A batch of claims, the dependencies of their tasks read in one query."""
    items = list(items)
    deps = dependencies_of([item.task for item in items])
    return [
        {
            "run": run(item.run),
            "task": task(item.task, depends_on=deps.get(item.task.pk, [])),
            "attempt": attempt(item.attempt),
            "lease": lease(item.lease),
        }
        for item in items
    ]


def blocker(blocker: Blocker) -> dict[str, Any]:
    return {
        "kind": blocker.kind,
        "message": blocker.message,
        "task_id": _id(blocker.task_id),
        "until": plain(blocker.until),
    }


def event_page(page: EventPage) -> dict[str, Any]:
    return {"events": [event(item) for item in page.events], "next_cursor": page.next_cursor}


def expire_result(result: ExpireResult) -> dict[str, Any]:
    return {"expired_task_ids": [str(pk) for pk in result.expired_task_ids], "count": result.count}


def prune_result(result: PruneResult) -> dict[str, Any]:
    return {"pruned_run_ids": [str(pk) for pk in result.pruned_run_ids], "count": result.count}

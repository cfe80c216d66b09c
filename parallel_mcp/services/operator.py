"""Operator actions on tasks and runs: cancel a task, re-execute tasks (with their dependents),
copy a run."""

from __future__ import annotations

from collections import defaultdict
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import transaction

from ..contract import validation as v
from ..exceptions import InvalidTransitionError, RecordNotFoundError, RunTerminalError
from ..ids import new_id
from ..models import ContextSnapshot, Run, Task, TaskDependency
from ..states import TERMINAL_TASK_STATUSES, TaskStatus
from .enqueue import insert_tasks, prepare_batch
from .leases import move_task
from .outcomes import recount_waiters
from .runs import CANCELLED_FIELDS, create_run, record_cancelled
from .write import Write, write

RESET_FIELDS: dict[str, Any] = {
    "output": None,
    "error": None,
    "progress": 0.0,
    "progress_message": None,
    "started_at": None,
    "completed_at": None,
    "dead": False,
    "not_before": None,
    "attempt_count": 0,
    "pending_blockers": 0,
}


def cancel_task(
    *, using: str, task_id: Any, reason: str | None = None, now: datetime | None = None
) -> Task:
    """Any non-terminal task -> ``cancelled``; a worker holding its lease is fenced out."""
    now = v.resolve_now(now)
    task_uuid = v.require_id(task_id, "task_id")
    reason = v.reason(reason)
    with write(using=using, now=now) as w:
        run, task = w.lock_run_of_task(task_uuid)
        if task.status in TERMINAL_TASK_STATUSES:
            raise InvalidTransitionError(
                f"Task {task.pk} is already {task.status}; only non-terminal tasks can be "
                "cancelled (retry_task re-executes a finished one).",
                task_id=task.pk,
                current=task.status,
                target=TaskStatus.CANCELLED,
            )
        lease_id = task.lease_id
        previous = move_task(w, task, TaskStatus.CANCELLED, **CANCELLED_FIELDS, completed_at=now)
        record_cancelled(w, run.pk, [(task.pk, previous, lease_id)], reason)
    return task


def retry_task(
    *,
    using: str,
    task_id: Any,
    cascade: bool = True,
    reason: str | None = None,
    now: datetime | None = None,
) -> Task:
    """Re-execute a finished task: back to ``queued`` with output, error, progress, timestamps,
    attempts and the dead flag cleared (history is kept). With ``cascade``, every transitive
    dependent in a terminal state is reset too, each once, upstream first."""
    now = v.resolve_now(now)
    task_uuid = v.require_id(task_id, "task_id")
    reason = v.reason(reason)
    v.flag(cascade, "cascade")
    with write(using=using, now=now) as w:
        run, task = w.lock_run_of_task(task_uuid)
        if run.cancel_requested_at is not None:
            raise RunTerminalError(
                f"Run {run.pk} was cancelled; copy_run makes a fresh run to execute again.",
                run_id=run.pk,
                status=run.status,
            )
        if task.status not in TERMINAL_TASK_STATUSES:
            raise InvalidTransitionError(
                f"Task {task.pk} is {task.status}; only completed, failed or cancelled tasks "
                "can be re-executed.",
                task_id=task.pk,
                current=task.status,
                target=TaskStatus.QUEUED,
            )
        dependents = _downstream_in_order(w, task.pk) if cascade else []
        _reset(w, run, task, reason=reason, root=task.pk)
        for pk in dependents:
            dependent = Task.objects.using(using).select_for_update(no_key=True).get(pk=pk)
            if dependent.status in TERMINAL_TASK_STATUSES:
                _reset(w, run, dependent, reason=reason, root=task.pk)
        w.ready(run.pk)
    task.refresh_from_db(using=using)
    return task


def _downstream_in_order(w: Write, root: UUID) -> list[UUID]:
    """Every transitive dependent of ``root`` (not ``root``), each once, after its upstream."""
    children: dict[UUID, list[UUID]] = defaultdict(list)
    parents_left: dict[UUID, int] = defaultdict(int)
    seen = {root}
    frontier = [root]
    while frontier:
        rows = list(
            TaskDependency.objects.using(w.using)
            .filter(depends_on_id__in=frontier)
            .values_list("depends_on_id", "task_id")
        )
        frontier = []
        for upstream, dependent in rows:
            children[upstream].append(dependent)
            parents_left[dependent] += 1
            if dependent not in seen:
                seen.add(dependent)
                frontier.append(dependent)
    order, ready = [], [root]
    while ready:
        node = ready.pop()
        order.append(node)
        for dependent in children.get(node, ()):
            parents_left[dependent] -= 1
            if parents_left[dependent] == 0:
                ready.append(dependent)
    return order[1:]


def _reset(w: Write, run: Run, task: Task, *, reason: str | None, root: UUID) -> None:
    reset = {"claimable": run.max_parallel is None, **RESET_FIELDS}
    previous = move_task(w, task, TaskStatus.QUEUED, operator=True, **reset)
    if task.blocks_others and previous == TaskStatus.COMPLETED:
        recount_waiters(w, run.pk, task.pk, release=False)
    w.event(
        "task.requeued",
        run_id=run.pk,
        task_id=task.pk,
        payload={
            "reason": reason,
            "from": previous,
            "cascade_from": None if task.pk == root else str(root),
        },
    )


def copy_run(
    *, using: str, run_id: Any, reason: str | None = None, now: datetime | None = None
) -> Run:
    """A new run with a fresh copy of every task definition and the same dependency graph."""
    now = v.resolve_now(now)
    run_uuid = v.require_id(run_id, "run_id")
    reason = v.reason(reason)
    with transaction.atomic(using=using):
        source = Run.objects.using(using).select_for_update(no_key=True).filter(pk=run_uuid).first()
        if source is None:
            raise RecordNotFoundError(f"Run {run_uuid} does not exist.", run_id=run_uuid)
        context = None
        if source.current_context_snapshot_id is not None:
            context = (
                ContextSnapshot.objects.using(using)
                .filter(pk=source.current_context_snapshot_id)
                .values_list("payload", flat=True)
                .first()
            )
        copy = create_run(
            using=using,
            namespace=source.namespace,
            external_id=source.external_id,
            metadata=source.metadata,
            context=context,
            max_parallel=source.max_parallel,
            now=now,
            _created_payload={"source_run_id": str(source.pk), "reason": reason},
        )
        originals = list(
            Task.objects.using(using).filter(run_id=source.pk).order_by("created_at", "id")
        )
        if not originals:
            return copy
        edges: dict[UUID, list[tuple[UUID, bool]]] = defaultdict(list)
        for task_id, upstream, required in (
            TaskDependency.objects.using(using)
            .filter(run_id=source.pk)
            .order_by("id")
            .values_list("task_id", "depends_on_id", "required")
        ):
            edges[task_id].append((upstream, required))
        new_ids = {task.pk: new_id() for task in originals}
        specs = [
            {
                "id": new_ids[task.pk],
                "kind": task.kind,
                "key": task.key,
                "priority": task.priority,
                "max_attempts": task.max_attempts,
                "retry_delay_ms": task.retry_delay_ms,
                "retry_backoff": task.retry_backoff,
                "retry_max_delay_ms": task.retry_max_delay_ms,
                "timeout_ms": task.timeout_ms,
                "input": task.input,
                "metadata": task.metadata,
                "not_before": None,
                "context_snapshot_id": None,
                "depends_on": [
                    (new_ids[upstream], required) for upstream, required in edges[task.pk]
                ],
            }
            for task in originals
        ]
        batch = prepare_batch(specs, using=using, run_id=copy.pk, now=now)
        with write(using=using, now=now) as w:
            insert_tasks(w, w.lock_run(copy.pk), batch)
        copy.refresh_from_db(using=using)
    return copy

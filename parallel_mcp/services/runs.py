"""Run lifecycle: create, cancel, prune."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import transaction
from django.db.models import Q

from ..conf import app_settings
from ..contract import arguments as a
from ..contract import validation as v
from ..exceptions import DuplicateIdError, ValidationError
from ..ids import new_id
from ..models import (
    Attempt,
    ClientTokenRecord,
    ContextSnapshot,
    Event,
    InputRequest,
    Run,
    RunDelta,
    Task,
    TaskBlocker,
    TaskDependency,
    ToolCall,
)
from ..models.tool_calls import expired_calls
from ..results import PruneResult
from ..states import (
    TERMINAL_RUN_STATUSES,
    AttemptStatus,
    RunStatus,
    TaskStatus,
    sources_of,
)
from .context import add_snapshot
from .leases import LEASE_CLEARED, close_attempts
from .write import Write, write


def create_run(
    *,
    using: str,
    namespace: str = "default",
    external_id: str | None = None,
    metadata: Any = None,
    context: Any = None,
    id: Any = None,
    max_parallel: int | None = None,
    now: datetime | None = None,
    _created_payload: dict[str, Any] | None = None,
) -> Run:
    now = v.resolve_now(now)
    namespace = v.text(namespace, "namespace")
    max_parallel = (
        None if max_parallel is None else a.MAX_PARALLEL.check(max_parallel, "max_parallel")
    )
    external_id = v.text(external_id, "external_id", allow_none=True)
    metadata = v.json_value(metadata, "metadata")
    context = v.json_value(context, "context")
    run_id = v.optional_id(id, "id") or new_id()
    run = Run(
        id=run_id,
        namespace=namespace,
        external_id=external_id,
        status=RunStatus.PENDING,
        metadata=metadata,
        max_parallel=max_parallel,
        created_at=now,
        updated_at=now,
    )
    run._state.adding, run._state.db = False, using
    with write(using=using, now=now) as w:
        # Checked by the insert itself: two calls with one id at the same moment get one
        # run and one DuplicateIdError, never a constraint error.
        if not w.insert_new(run):
            raise DuplicateIdError(f"A run with id {run_id} already exists.", run_id=run_id)
        w.locked_runs[run.pk] = run  # inserted in this transaction: nobody else can see it
        w.event(
            "run.created",
            run_id=run.pk,
            payload={
                "namespace": namespace,
                "external_id": external_id,
                "metadata": metadata,
                "max_parallel": max_parallel,
                **(_created_payload or {}),
            },
        )
        if context is not None:
            add_snapshot(w, run, payload=context, scope="run", label="run.initial")
    return run


def cancel_run(
    *, using: str, run_id: Any, reason: str | None = None, now: datetime | None = None
) -> Run:
    """Cancel every non-terminal task of the run; a terminal run is returned unchanged."""
    now = v.resolve_now(now)
    run_uuid = v.require_id(run_id, "run_id")
    reason = v.reason(reason)
    with write(using=using, now=now) as w:
        run = w.lock_run(run_uuid)
        if run.status in TERMINAL_RUN_STATUSES:
            return run
        tasks = list(
            Task.objects.using(using)
            .select_for_update(no_key=True)
            .filter(run_id=run.pk, status__in=sources_of(TaskStatus.CANCELLED))
            .order_by("id")
            .values_list("id", "status", "lease_id")
        )
        task_ids = [task_id for task_id, _, _ in tasks]
        if task_ids:
            cancelled = {"status": TaskStatus.CANCELLED, **CANCELLED_FIELDS}
            w.update(Task, task_ids, **cancelled, completed_at=now, updated_at=now)
        record_cancelled(w, run.pk, tasks, reason)
        # Every non-terminal task is now cancelled.
        w.count(
            run.pk,
            active=-run.tasks_active,
            waiting=-run.tasks_waiting,
            stuck=-run.tasks_stuck,
            cancelled=run.tasks_active + run.tasks_waiting + run.tasks_stuck,
        )
        run.cancel_requested_at = now
        run.cancel_reason = reason
        w.update(Run, [run.pk], cancel_requested_at=now, cancel_reason=reason)
        w.event(
            "run.cancelled",
            run_id=run.pk,
            payload={"reason": reason, "cancelled_tasks": len(task_ids)},
        )
    return run


# What a cancellation writes on a task besides its status and completed_at.
CANCELLED_FIELDS: dict[str, Any] = {"pending_blockers": 0, **LEASE_CLEARED}


def record_cancelled(
    w: Write,
    run_id: UUID,
    cancelled: list[tuple[UUID, str, UUID | None]],
    reason: str | None,
) -> None:
    """Tasks just cancelled, as (id, the status they left, the lease they held): their
    attempts (and so their leases) end, and each gets its event."""
    leases = [lease_id for _, _, lease_id in cancelled if lease_id is not None]
    if leases:
        close_attempts(
            w,
            leases,
            status=AttemptStatus.CANCELLED,
            error=reason,
        )
    for task_id, previous, lease_id in cancelled:
        w.event(
            "task.cancelled",
            run_id=run_id,
            task_id=task_id,
            attempt_id=lease_id,
            payload={"reason": reason, "from": previous},
        )


def prune_runs(
    *,
    using: str,
    older_than: Any,
    statuses: Any = None,
    limit: Any = None,
    now: datetime | None = None,
) -> PruneResult:
    """Delete terminal runs last updated before ``older_than`` with everything they own."""
    now = v.resolve_now(now)
    cutoff = v.duration_or_datetime(older_than, "older_than", now=now)
    chosen = v.choice_list(statuses, "statuses", RunStatus)
    if chosen is None:
        chosen = sorted(TERMINAL_RUN_STATUSES)
    refused = [status for status in chosen if status not in TERMINAL_RUN_STATUSES]
    if refused:
        raise ValidationError(
            f"prune_runs deletes terminal runs only; refused statuses: {', '.join(refused)}.",
            field="statuses",
            refused=refused,
        )
    return _prune(using, Q(status__in=chosen, updated_at__lt=cutoff), limit)


def prune_expired_tool_calls(
    *, using: str, limit: Any = None, now: datetime | None = None
) -> PruneResult:
    """Delete the runs of MCP tool calls whose task has expired at ``now`` (past its TTL and
    ended: ``models.tool_calls.expired_calls``) with everything they own."""
    now = v.resolve_now(now)
    expired = ToolCall.objects.using(using).filter(expired_calls(now)).values("pk")
    # The status again on the locked row: retry_task may have re-opened the run meanwhile.
    return _prune(using, Q(pk__in=expired, status__in=sorted(TERMINAL_RUN_STATUSES)), limit)


def _prune(using: str, condition: Q, limit: Any) -> PruneResult:
    """Delete up to ``limit`` runs matching ``condition`` (terminal ones only), oldest update
    first, in one transaction."""
    limit = v.limit(limit, default=app_settings.DEFAULT_PRUNE_LIMIT)
    with transaction.atomic(using=using):
        run_ids = list(
            Run.objects.using(using)
            .select_for_update()  # rows are deleted: a full lock
            .filter(condition)
            .order_by("updated_at", "id")
            .values_list("id", flat=True)[:limit]
        )
        if run_ids:
            _delete_runs(using, run_ids)
    return PruneResult(pruned_run_ids=run_ids, count=len(run_ids))


def _delete_runs(using: str, run_ids: list) -> None:
    # Every relation is DO_NOTHING, so each delete is one statement with no row fetching;
    # foreign keys are checked at commit (Django declares them DEFERRABLE INITIALLY DEFERRED).
    for model in (
        RunDelta,  # a terminal run has none left (its last write folded them): to be sure
        ToolCall,
        InputRequest,
        Event,
        TaskDependency,
        TaskBlocker,
        ClientTokenRecord,
        Attempt,  # with its lease (the view pmcp_lease reads it)
        ContextSnapshot,
        Task,
    ):
        model.objects.using(using).filter(run_id__in=run_ids).delete()
    Run.objects.using(using).filter(pk__in=run_ids).delete()

"""Context snapshots: immutable payloads; a run-scope snapshot becomes the run's current one."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from ..contract import arguments as a
from ..contract import validation as v
from ..exceptions import DuplicateIdError, RecordNotFoundError, ValidationError
from ..ids import new_id
from ..models import ContextSnapshot, Run, Task
from ..models.snapshots import SCOPES
from .dialect import saved_instance
from .write import Write, write


def add_snapshot(
    w: Write,
    run: Run,
    *,
    payload: Any,
    scope: str = "run",
    label: str | None = None,
    task_id: UUID | None = None,
    parent_snapshot_id: UUID | None = None,
    snapshot_id: UUID | None = None,
) -> ContextSnapshot:
    """Insert a snapshot (run already locked); a run-scope one becomes current. Without a
    parent, a snapshot of either scope derives from the run's current one (as in the
    original)."""
    if parent_snapshot_id is None:
        parent_snapshot_id = run.current_context_snapshot_id
    snapshot = saved_instance(
        ContextSnapshot,
        w.using,
        {
            "id": snapshot_id or new_id(),
            "run_id": run.pk,
            "task_id": task_id,
            "scope": scope,
            "parent_snapshot_id": parent_snapshot_id,
            "label": label,
            "payload": payload,
            "created_at": w.now,
        },
    )
    if snapshot_id is None:
        w.insert_saved(snapshot)  # a write's snapshots go in one INSERT with its flush
    elif not w.insert_new(snapshot):  # an id the caller chose: checked by the insert itself
        raise DuplicateIdError(
            f"A context snapshot with id {snapshot_id} already exists.", snapshot_id=snapshot_id
        )
    if scope == "run":
        w.move_context(run, snapshot.pk)
    elif task_id is not None:
        # A task-scope snapshot is the context that task sees from now on.
        w.defer(
            "UPDATE pmcp_task SET context_snapshot_id = %s WHERE id = %s",
            [w.d.uuid(snapshot.pk), w.d.uuid(task_id)],
        )
    w.event(
        "context.snapshot.created",
        run_id=run.pk,
        task_id=task_id,
        payload={
            "snapshot_id": str(snapshot.pk),
            "scope": scope,
            "label": label,
            "parent_snapshot_id": str(parent_snapshot_id) if parent_snapshot_id else None,
        },
    )
    return snapshot


def append_context_snapshot(
    *,
    using: str,
    run_id: Any,
    payload: Any,
    scope: str = "run",
    label: str | None = None,
    task_id: Any = None,
    parent_snapshot_id: Any = None,
    id: Any = None,
    now: datetime | None = None,
) -> ContextSnapshot:
    now = v.resolve_now(now)
    run_uuid = v.require_id(run_id, "run_id")
    if scope not in SCOPES:
        raise ValidationError(f"scope must be 'run' or 'task', got {scope!r}.", field="scope")
    payload = a.PAYLOAD.check(payload, "payload")
    label = v.text(label, "label", allow_none=True)
    task_uuid = v.optional_id(task_id, "task_id")
    parent_uuid = v.optional_id(parent_snapshot_id, "parent_snapshot_id")
    snapshot_uuid = v.optional_id(id, "id")
    if scope == "task" and task_uuid is None:
        raise ValidationError("A task-scope snapshot needs task_id.", field="task_id")
    with write(using=using, now=now) as w:
        run = w.lock_run(run_uuid)
        if (
            task_uuid is not None
            and not Task.objects.using(using).filter(pk=task_uuid, run_id=run.pk).exists()
        ):
            raise RecordNotFoundError(
                f"Task {task_uuid} does not exist in run {run.pk}.",
                task_id=task_uuid,
                run_id=run.pk,
            )
        if (
            parent_uuid is not None
            and not ContextSnapshot.objects.using(using)
            .filter(pk=parent_uuid, run_id=run.pk)
            .exists()
        ):
            raise ValidationError(
                f"Parent snapshot {parent_uuid} does not exist in run {run.pk}.",
                field="parent_snapshot_id",
            )
        return add_snapshot(
            w,
            run,
            payload=payload,
            scope=scope,
            label=label,
            task_id=task_uuid,
            parent_snapshot_id=parent_uuid,
            snapshot_id=snapshot_uuid,
        )

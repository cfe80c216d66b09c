"""The guard of every transition (source states, the lease fence), and why it failed (one
read, nothing re-run); see docs/internals.md ("The guard")."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any
from uuid import UUID

from ..actors import current_principal
from ..exceptions import (
    LeaseConflictError,
    LeaseExpiredError,
    ParallelMcpError,
    RecordNotFoundError,
)
from ..models import Attempt, Task
from ..states import (
    LEASED_TASK_STATUSES,
    AttemptStatus,
    RunStatus,
    TaskStatus,
    sources_of,
    transition_error,
)
from .dialect import Dialect, columns, instances
from .statements import Result
from .write import Write


def status_in(statuses: Iterable[str]) -> str:
    """``status IN (…)`` as SQL, its values literal and sorted (so every call shares one
    plan)."""
    return "status IN (" + ", ".join(f"'{status}'" for status in sorted(map(str, statuses))) + ")"


@cache
def sources(target: str) -> str:
    """``status IN (…)``: the states ``target`` may be reached from."""
    return status_in(sources_of(target))


LEASED = status_in(LEASED_TASK_STATUSES)


def lease_fence(
    d: Dialect, *, statuses: str, worker_id: str, now: datetime, principal: str | None
) -> tuple[str, list[Any]]:
    """The task is in one of ``statuses`` (``status IN (…)``) and the caller's worker holds
    its lease, unexpired (expiry is strict: a lease expiring exactly at ``now`` still holds),
    taken by this principal when the caller acts as one (see parallel_mcp.actors; in-process
    callers may use any lease). The lease id itself is the caller's to match (with the task
    id). ``IS TRUE`` keeps generic plans off the lease-expiry index (docs/internals.md)."""
    sql = f"({statuses}) IS TRUE AND leased_by = %s AND lease_expires_at >= %s"
    params: list[Any] = [worker_id, d.when(now)]
    if principal is not None:
        sql += " AND lease_principal = %s"
        params.append(principal)
    return sql, params


@dataclass(frozen=True)
class Fenced:
    """A fenced transition sent by ``send_fenced``; its rows are read after the batch."""

    w: Write
    rows: Result
    task_id: UUID
    lease_id: UUID
    worker_id: str
    target: str | None

    def task(self) -> Task:
        """The task as written (its columns returned), or raise why not (``explain_lease``)."""
        w = self.w
        tasks = instances(Task, w.using, self.rows.fetchall())
        if not tasks:
            raise explain_lease(
                w.using, self.task_id, self.lease_id, self.worker_id, w.now, target=self.target
            )
        return tasks[0]


def send_fenced(
    w: Write,
    *,
    task_id: UUID,
    lease_id: UUID,
    worker_id: str,
    assignments: str,
    params: Sequence[Any] = (),
    target: str | None = None,
    returning: str = columns(Task),
) -> Fenced:
    """Queue ``UPDATE pmcp_task SET <assignments> WHERE`` the task holds the caller's lease
    (``lease_fence``) and may move to ``target`` (then also set), or, with no target, is
    leased or running."""
    d = w.d
    statuses = LEASED if target is None else sources(target)
    if target is not None:
        assignments = f"status = '{target}', {assignments}"
    fence, fence_params = lease_fence(
        d, statuses=statuses, worker_id=worker_id, now=w.now, principal=current_principal()
    )
    rows = w.db.send(
        f"UPDATE pmcp_task SET {assignments}, updated_at = %s WHERE id = %s AND lease_id = %s "
        f"AND {fence} RETURNING {returning}",
        [*params, d.when(w.now), d.uuid(task_id), d.uuid(lease_id), *fence_params],
    )
    return Fenced(w, rows, task_id, lease_id, worker_id, target)


# -- why a fenced transition matched nothing --------------------------------------------------


def lost_to_cancellation(using: str, task_id: UUID, lease_id: UUID | None) -> bool:
    """Whether a failed lease check is due to a cancellation: the task or its run is
    cancelled, or the lease was closed by one (the task may have been re-executed since)."""
    row = Task.objects.using(using).filter(pk=task_id).values("status", "run__status").first()
    if row is None:
        return False
    if row["status"] == TaskStatus.CANCELLED or row["run__status"] == RunStatus.CANCELLED:
        return True
    if lease_id is None:
        return False
    attempt_status = (
        Attempt.objects.using(using)
        .filter(pk=lease_id, task_id=task_id)
        .values_list("status", flat=True)
        .first()
    )
    return attempt_status == AttemptStatus.CANCELLED


def lease_conflict(
    using: str, message: str, *, task_id: UUID, held: UUID | None, **details: Any
) -> LeaseConflictError:
    """The ``LeaseConflictError`` to raise, its ``details`` ending with ``cancelled`` (see
    :func:`lost_to_cancellation`; ``held`` is the lease the call relied on), so that a worker
    can tell an operator's cancellation from a lease lost otherwise."""
    return LeaseConflictError(
        message,
        task_id=task_id,
        **details,
        cancelled=lost_to_cancellation(using, task_id, held),
    )


def lease_error(
    task: Task, lease_id: UUID, worker_id: str, now: datetime, *, using: str
) -> ParallelMcpError | None:
    """What is wrong with the caller's hold on ``task``, or None when it holds its lease."""
    principal = current_principal()
    details: dict[str, Any]
    if task.status not in LEASED_TASK_STATUSES or task.lease_id is None:
        message = (
            f"Task {task.pk} is {task.status}, not leased; lease {lease_id} is no longer valid."
        )
        details = {"status": task.status}
    elif task.lease_id != lease_id or task.leased_by != worker_id:
        message = (
            f"Task {task.pk} is held by lease {task.lease_id} of worker {task.leased_by!r}, "
            f"not lease {lease_id} of worker {worker_id!r}."
        )
        details = {"worker_id": worker_id}
    elif principal is not None and task.lease_principal != principal:
        # Only the credential that took a lease may use it (in-process callers may use any).
        message = (
            f"Lease {lease_id} on task {task.pk} was taken by another principal; {principal} "
            "may not use it."
        )
        details = {"principal": principal}
    elif task.lease_expires_at is not None and task.lease_expires_at < now:
        return LeaseExpiredError(
            f"Lease {lease_id} on task {task.pk} expired at {task.lease_expires_at.isoformat()}.",
            task_id=task.pk,
            lease_id=lease_id,
            expired_at=task.lease_expires_at.isoformat(),
        )
    else:
        return None
    return lease_conflict(
        using, message, task_id=task.pk, held=lease_id, lease_id=lease_id, **details
    )


def explain_lease(
    using: str,
    task_id: UUID,
    lease_id: UUID,
    worker_id: str,
    now: datetime,
    *,
    target: str | None = None,
) -> ParallelMcpError:
    """Why a fenced transition of ``task_id`` (to ``target``, when it changes the status)
    matched no row: one read of the task."""
    task = Task.objects.using(using).filter(pk=task_id).first()
    if task is None:
        return RecordNotFoundError(f"Task {task_id} does not exist.", task_id=task_id)
    error = lease_error(task, lease_id, worker_id, now, using=using)
    if error is None and target is not None:
        error = transition_error(task.status, target, task_id=task.pk)
    if error is not None:
        return error
    # It holds now, so the row changed between the update and this read (a lost race).
    return lease_conflict(
        using,
        f"Task {task_id} changed while this call was in flight; call again.",
        task_id=task_id,
        held=lease_id,
        lease_id=lease_id,
        status=task.status,
    )

"""Keeping leases (mark running, heartbeat, progress, expiry) and the moves of a task read
under its run's lock (``move_task``: a retry, a failure, the operator's moves)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any
from uuid import UUID

from django.db.models import QuerySet

from ..contract import arguments as a
from ..contract import validation as v
from ..models import Attempt, Lease, Run, Task
from ..models.tasks import SLOT_WAITING, lease_lapsed
from ..results import ExpireResult
from ..states import (
    LEASE_STATUS_OF_ATTEMPT,
    AttemptStatus,
    RunStatus,
    TaskStatus,
    assert_transition,
    retry_delay_ms,
)
from .dag import status_changed
from .dialect import columns, field_assignments, instances, json_param, saved_instance
from .fold import fold_lagging_runs
from .guard import explain_lease, lease_conflict, send_fenced
from .write import Write, write

LEASE_CLEARED: dict[str, Any] = {
    "lease_id": None,
    "leased_by": None,
    "lease_expires_at": None,
    "lease_principal": None,
}
CLEAR_LEASE = ", ".join(f"{name} = NULL" for name in LEASE_CLEARED)  # as SQL assignments


def move_task(w: Write, task: Task, status: str, *, operator: bool = False, **fields: Any) -> str:
    """``task``, read under its run's lock, moves to ``status`` with ``fields`` written
    alongside, guarded by the status and lease it was read in; its run's counters and
    dependents follow. Returns the status it left. ``operator``: an operator's move, which may
    leave a terminal state (docs/internals.md)."""
    previous = str(task.status)
    if status != previous and not operator:
        assert_transition(previous, status, task_id=task.pk)
    fields = {"status": status, **fields}
    fields.setdefault("updated_at", w.now)
    d = w.d
    assignments, params = field_assignments(Task, w.using, fields)
    matched = w.db.send(
        f"UPDATE pmcp_task SET {assignments} WHERE id = %s AND lease_id {d.same} %s "
        "AND status = %s RETURNING id",
        [*params, d.uuid(task.pk), d.uuid(task.lease_id), previous],
    ).fetchall()
    if not matched:
        current = Task.objects.using(w.using).filter(pk=task.pk).values("status").first()
        now_status = current["status"] if current else "deleted"
        raise lease_conflict(
            w.using,
            f"Task {task.pk} changed while this call was in flight: it was {previous} and "
            f"is now {now_status}.",
            task_id=task.pk,
            held=task.lease_id,
            expected_status=previous,
            status=now_status,
        )
    for name, value in fields.items():
        # Plain strings, as a read would give (status values are StrEnum members here).
        setattr(task, name, str(value) if isinstance(value, StrEnum) else value)
    status_changed(w, task, previous)
    return previous


def lease_of(attempt: Attempt, using: str) -> Lease:
    """The lease an attempt holds, as the view ``pmcp_lease`` reads it from the attempt's row
    (models/leases.py), built without ``Model.__init__`` like the write path's instances."""
    return saved_instance(
        Lease,
        using,
        {
            "id": attempt.pk,
            "run_id": attempt.run_id,
            "task_id": attempt.task_id,
            "attempt_id": attempt.pk,
            "worker_id": attempt.worker_id,
            "status": str(LEASE_STATUS_OF_ATTEMPT[attempt.status]),
            "acquired_at": attempt.leased_at,
            "expires_at": attempt.lease_expires_at,
            "heartbeat_at": attempt.heartbeat_at or attempt.leased_at,
            "released_at": attempt.ended_at,
            "client_token": attempt.client_token,
            "principal": attempt.principal,
        },
    )


def close_attempts(
    w: Write,
    attempt_ids: Sequence[UUID],
    *,
    status: str,
    error: str | None = None,
    outputs: Sequence[Any] | None = None,
    metadata: Sequence[Any] | None = None,
) -> None:
    """End attempts, and so their leases (models/leases.py), in the write's final batch;
    ``outputs`` and ``metadata`` hold one JSON value per attempt."""
    d = w.d
    sets, params = ["status = %s", "ended_at = %s"], [str(status), d.when(w.now)]
    if error is not None:
        sets.append("error = %s")
        params.append(error)
    for column, values in (("output", outputs), ("metadata", metadata)):
        if values is not None:
            value_sql, value_params = d.by_id(
                attempt_ids, [json_param(value) for value in values], d.json_cast
            )
            sets.append(f"{column} = {value_sql}")
            params += value_params
    in_sql, in_params = d.uuids(attempt_ids)
    w.defer(f"UPDATE pmcp_attempt SET {', '.join(sets)} WHERE id {in_sql}", [*params, *in_params])


def lease_args(task_id: Any, lease_id: Any, worker_id: Any) -> tuple[UUID, UUID, str]:
    return (
        v.require_id(task_id, "task_id"),
        v.require_id(lease_id, "lease_id"),
        v.text(worker_id, "worker_id"),
    )


# -- running and heartbeat -------------------------------------------------------------------


def mark_task_running(
    *, using: str, task_id: Any, lease_id: Any, worker_id: Any, now: datetime | None = None
) -> Task:
    """``leased -> running`` under the caller's lease."""
    now = v.resolve_now(now)
    task_uuid, lease_uuid, worker = lease_args(task_id, lease_id, worker_id)
    with write(using=using, now=now) as w:
        d = w.d
        task = send_fenced(
            w,
            task_id=task_uuid,
            lease_id=lease_uuid,
            worker_id=worker,
            assignments="started_at = COALESCE(started_at, %s)",
            params=[d.when(now)],
            target=TaskStatus.RUNNING,
        ).task()
        w.defer(
            "UPDATE pmcp_attempt SET status = 'running', started_at = %s WHERE id = %s",
            [d.when(now), d.uuid(lease_uuid)],
        )
        record_running(w, run_id=task.run_id, task_id=task.pk, lease_id=lease_uuid, worker=worker)
    return task


def record_running(w: Write, *, run_id: UUID, task_id: UUID, lease_id: UUID, worker: str) -> None:
    """The event of ``leased -> running`` (by ``mark_task_running``, or a claim with start)."""
    w.event(
        "task.running",
        run_id=run_id,
        task_id=task_id,
        attempt_id=lease_id,
        payload={"worker_id": worker},
    )


def heartbeat_lease(
    *,
    using: str,
    task_id: Any,
    lease_id: Any,
    worker_id: Any,
    lease_ms: int,
    now: datetime | None = None,
) -> Lease:
    """Extend the caller's lease to ``now + lease_ms`` (any leased status: a heartbeat never
    loses to the same worker's ``leased -> running``)."""
    now = v.resolve_now(now)
    task_uuid, lease_uuid, worker = lease_args(task_id, lease_id, worker_id)
    lease_ms = v.lease_ms(lease_ms)
    expires_at = now + timedelta(milliseconds=lease_ms)
    with write(using=using, now=now) as w:
        d = w.d
        until = d.when(expires_at)
        with w.db.batch():
            fenced = send_fenced(
                w,
                task_id=task_uuid,
                lease_id=lease_uuid,
                worker_id=worker,
                assignments="lease_expires_at = %s",
                params=[until],
                returning="run_id",
            )
            # Only where the fence held (the task now carries this very expiry).
            extended = w.db.send(
                "UPDATE pmcp_attempt SET lease_expires_at = %s, heartbeat_at = %s WHERE id = %s "
                "AND task_id = %s AND EXISTS (SELECT 1 FROM pmcp_task WHERE id = %s "
                f"AND lease_id = %s AND lease_expires_at = %s) RETURNING {columns(Attempt)}",
                [
                    until,
                    d.when(now),
                    d.uuid(lease_uuid),
                    d.uuid(task_uuid),
                    d.uuid(task_uuid),
                    d.uuid(lease_uuid),
                    until,
                ],
            )
        found = fenced.rows.fetchone()
        attempts = instances(Attempt, using, extended.fetchall())
        if found is None or not attempts:
            raise explain_lease(using, task_uuid, lease_uuid, worker, now)
        lease = lease_of(attempts[0], using)
        w.event(
            "task.lease_heartbeat",
            run_id=lease.run_id,
            task_id=task_uuid,
            attempt_id=lease_uuid,
            payload={"worker_id": worker, "lease_expires_at": expires_at.isoformat()},
        )
    return lease


# -- expiry -----------------------------------------------------------------------------------


def expire_leases(*, using: str, now: datetime | None = None) -> ExpireResult:
    """Requeue (with backoff) or dead-letter every task whose lease expired before ``now``.
    First, the maintenance fold: the runs whose delta rows a crash left behind are folded."""
    now = v.resolve_now(now)
    fold_lagging_runs(using=using, now=now)
    refresh_delayed_slots(using=using, now=now)
    lapsed = Task.objects.using(using).filter(lease_lapsed(now))
    # Read in the lease-expiry index's order, so that the index is what is read (a DISTINCT
    # would rather scan every task by run): one row per lapsed lease, none in the usual case.
    expired = set(lapsed.order_by("lease_expires_at").values_list("run_id", flat=True))
    if not expired:
        return ExpireResult(expired_task_ids=[], count=0)
    with write(using=using, now=now) as w:
        # All the runs at once (a run pruned meanwhile is just not there): see write.py on
        # the order of run locks.
        with w.db.batch():
            locks = w.send_lock_runs(sorted(expired))
        w.adopt_runs(locks)
        locked = lapsed.filter(run_id__in=list(w.locked_runs)).select_for_update(no_key=True)
        tasks = list(locked.order_by("id"))
        for task in tasks:
            expire_one(w, task)
    return ExpireResult(expired_task_ids=[task.pk for task in tasks], count=len(tasks))


# At most this many capped runs are refreshed by one expiry pass (a bound on its writes): the
# least recently updated first, and a refresh updates its run, so passes take turns.
SLOT_REFRESH_RUNS = 1000


def refresh_delayed_slots(*, using: str, now: datetime) -> None:
    """A max_parallel run hands its free slots only to due tasks; when a delayed task
    (``not_before``, retry backoff) becomes due, nothing else happens in its run, so the
    expiry loop hands the slots out again."""
    runs = list(runs_with_due_waiting_tasks(using, now)[:SLOT_REFRESH_RUNS])
    for run_id in sorted(runs):
        with write(using=using, now=now) as w:
            w.lock_run(run_id)
            w.changed_runs.add(run_id)


def runs_with_due_waiting_tasks(using: str, now: datetime) -> QuerySet[Run, UUID]:
    """The capped active runs with a due delayed task waiting for a slot, least recently
    updated first (read from pmcp_task_slot_delayed_idx: docs/internals.md)."""
    due_waiting = Task.objects.using(using).filter(
        SLOT_WAITING, not_before__isnull=False, not_before__lte=now
    )
    return (
        Run.objects.using(using)
        .filter(
            pk__in=due_waiting.values("run_id"),
            status=RunStatus.ACTIVE,
            max_parallel__isnull=False,
        )
        .order_by("updated_at")
        .values_list("pk", flat=True)
    )


def expire_one(w: Write, task: Task) -> None:
    lease_id = task.lease_id
    # A leased task has both (check constraints).
    assert lease_id is not None and task.lease_expires_at is not None
    close_attempts(
        w,
        [lease_id],
        status=AttemptStatus.EXPIRED,
        error="lease_expired",
    )
    w.event(
        "task.lease_expired",
        run_id=task.run_id,
        task_id=task.pk,
        attempt_id=lease_id,
        payload={
            "worker_id": task.leased_by,
            "attempt": task.attempt_count,
            "lease_expires_at": task.lease_expires_at.isoformat(),
        },
    )
    if attempts_left(task):
        schedule_retry(w, task, error="lease_expired", attempt_id=lease_id)
    else:
        fail_for_good(w, task, error="max_attempts_exceeded", attempt_id=lease_id, dead=True)


def attempts_left(task: Task) -> bool:
    return task.max_attempts is None or task.attempt_count < task.max_attempts


def schedule_retry(
    w: Write, task: Task, *, error: str, attempt_id: UUID | None, **fields: Any
) -> None:
    """Back to ``queued`` after the task's backoff, with ``fields`` written alongside."""
    delay = retry_delay_ms(
        attempt=task.attempt_count,
        delay_ms=task.retry_delay_ms,
        backoff=task.retry_backoff,
        max_delay_ms=task.retry_max_delay_ms,
    )
    not_before = w.now + timedelta(milliseconds=delay) if delay else None
    if not_before is None:
        w.ready(task.run_id)
    move_task(
        w, task, TaskStatus.QUEUED, not_before=not_before, error=error, **fields, **LEASE_CLEARED
    )
    w.event(
        "task.retry_scheduled",
        run_id=task.run_id,
        task_id=task.pk,
        attempt_id=attempt_id,
        payload={
            "error": error,
            "attempt": task.attempt_count,
            "max_attempts": task.max_attempts,
            "delay_ms": delay,
            "not_before": not_before.isoformat() if not_before else None,
        },
    )


def fail_for_good(
    w: Write, task: Task, *, error: str, attempt_id: UUID | None, dead: bool, **fields: Any
) -> None:
    """``failed`` with no retry (``fields`` written alongside): its handler failed it for
    good, or its attempts are spent (``dead``: into the dead-letter queue)."""
    failed: dict[str, Any] = {"error": error, "dead": dead, "completed_at": w.now}
    move_task(w, task, TaskStatus.FAILED, **failed, **fields, **LEASE_CLEARED)
    w.event(
        "task.failed",
        run_id=task.run_id,
        task_id=task.pk,
        attempt_id=attempt_id,
        payload={"error": error, "attempt": task.attempt_count, "dead": dead},
    )
    if dead:
        w.event(
            "task.dead_lettered",
            run_id=task.run_id,
            task_id=task.pk,
            attempt_id=attempt_id,
            payload={
                "error": error,
                "attempts": task.attempt_count,
                "max_attempts": task.max_attempts,
            },
        )


def merge_metadata(current: Any, update: Any) -> Any:
    """Dicts merge shallowly (the update wins); anything else replaces."""
    if isinstance(current, dict) and isinstance(update, dict):
        return {**current, **update}
    return update


# -- progress ---------------------------------------------------------------------------------


def report_progress(
    *,
    using: str,
    task_id: Any,
    lease_id: Any,
    worker_id: Any,
    progress: Any,
    message: str | None = None,
    now: datetime | None = None,
) -> Task:
    """Record how far a leased task has got (0.0 to 1.0) with an optional message."""
    now = v.resolve_now(now)
    task_uuid, lease_uuid, worker = lease_args(task_id, lease_id, worker_id)
    share = a.PROGRESS.check(progress, "progress")
    message = v.reason(message, "message")
    with write(using=using, now=now) as w:
        task = send_fenced(
            w,
            task_id=task_uuid,
            lease_id=lease_uuid,
            worker_id=worker,
            assignments="progress = %s, progress_message = %s",
            params=[share, message],
        ).task()
        w.event(
            "task.progress",
            run_id=task.run_id,
            task_id=task.pk,
            attempt_id=lease_uuid,
            payload={"worker_id": worker, "progress": share, "message": message},
        )
    return task

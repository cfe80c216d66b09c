"""What a worker reports about a leased task, and the operator moves on paused/dead tasks:
complete, fail, release, pause, resume, requeue from the dead-letter queue."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from django.db.models import Count, Q

from ..actors import current_principal
from ..contract import arguments as a
from ..contract import validation as v
from ..contract.protocol import UNSET
from ..exceptions import (
    InvalidDependencyError,
    InvalidTransitionError,
    RunTerminalError,
    ValidationError,
)
from ..ids import parse_id
from ..models import Task, TaskBlocker
from ..states import PAUSED_TASK_STATUSES, AttemptStatus, RunStatus, TaskStatus
from . import client_tokens
from . import input_requests as input_requests_service
from .dag import states_in_run, status_changed
from .enqueue import task_id_entries
from .guard import lease_error, send_fenced
from .leases import (
    CLEAR_LEASE,
    attempts_left,
    close_attempts,
    fail_for_good,
    lease_args,
    merge_metadata,
    move_task,
    schedule_retry,
)
from .write import Write, write


def fail_task(
    *,
    using: str,
    task_id: Any,
    lease_id: Any,
    worker_id: Any,
    error: Any,
    metadata: Any = None,
    retry: bool = False,
    client_token: str | None = None,
    now: datetime | None = None,
) -> Task:
    now = v.resolve_now(now)
    task_uuid, lease_uuid, worker = lease_args(task_id, lease_id, worker_id)
    error = a.ERROR.check(error, "error")
    metadata = v.json_value(metadata, "metadata")
    v.flag(retry, "retry")
    client_token = v.text(client_token, "client_token", allow_none=True)
    principal = current_principal()
    with write(using=using, now=now) as w:
        if client_token is not None:
            mine = client_tokens.send_record(w, [(client_token, task_uuid)], "failed", principal)
            if client_token not in client_tokens.recorded(mine):
                replayed = client_tokens.replay(using, client_token, task_uuid, "failed", principal)
                if isinstance(replayed, Task):
                    return replayed
                if replayed is not None:
                    raise replayed
        # Its target (a retry or not) depends on the task's attempts: read first, with the run.
        _, task = w.lock_run_of_task(task_uuid)
        refused = lease_error(task, lease_uuid, worker, now, using=using)
        if refused is not None:
            raise refused
        close_attempts(
            w,
            [lease_uuid],
            status=AttemptStatus.FAILED,
            error=error,
            metadata=[metadata],
        )
        merged = {} if metadata is None else {"metadata": merge_metadata(task.metadata, metadata)}
        if retry and attempts_left(task):
            schedule_retry(w, task, error=error, attempt_id=lease_uuid, **merged)
        else:
            fail_for_good(w, task, error=error, attempt_id=lease_uuid, dead=retry, **merged)
    return task


def release_task(
    *,
    using: str,
    task_id: Any,
    lease_id: Any,
    worker_id: Any,
    reason: str | None = None,
    now: datetime | None = None,
) -> Task:
    """Give the task back without consuming an attempt."""
    now = v.resolve_now(now)
    task_uuid, lease_uuid, worker = lease_args(task_id, lease_id, worker_id)
    reason = v.reason(reason)
    with write(using=using, now=now) as w:
        # A release gives back the attempt its claim counted (never below 0).
        back = "attempt_count = CASE WHEN attempt_count > 0 THEN attempt_count - 1 ELSE 0 END, "
        task = _let_go(w, task_uuid, lease_uuid, worker, reason, TaskStatus.QUEUED, back)
        w.ready(task.run_id)
        w.event(
            "task.released",
            run_id=task.run_id,
            task_id=task.pk,
            attempt_id=lease_uuid,
            payload={"worker_id": worker, "reason": reason},
        )
    return task


def pause_task(
    *,
    using: str,
    task_id: Any,
    lease_id: Any,
    worker_id: Any,
    status: str,
    reason: str | None = None,
    blocked_by: Any = None,
    input_requests: Any = None,
    now: datetime | None = None,
) -> Task:
    """Park a leased task. With ``blocked_by`` (status ``blocked``) it is queued again by the
    completion of the last named task; with ``input_requests`` (``waiting_input``, a tool call's
    task) once the client has answered them all (docs/internals.md)."""
    now = v.resolve_now(now)
    task_uuid, lease_uuid, worker = lease_args(task_id, lease_id, worker_id)
    a.PAUSE_STATUS.check(status, "status")
    reason = v.reason(reason)
    blocker_ids = _parse_blockers(blocked_by, status, task_uuid)
    requests = _parse_input_requests(input_requests, status)
    with write(using=using, now=now) as w:
        task = _let_go(w, task_uuid, lease_uuid, worker, reason, status, "pending_blockers = 0, ")
        run_id = task.run_id
        if requests is not None:
            input_requests_service.record(w, run_id, task.pk, requests)
        # A pause starts afresh: forget the blockers of any earlier pause.
        _forget_blockers(w, task.pk)
        pending = _register_blockers(w, run_id, task.pk, blocker_ids) if blocker_ids else 0
        if pending:
            w.update(Task, [task.pk], pending_blockers=pending)
            task.pending_blockers = pending
        payload: dict[str, Any] = {"worker_id": worker, "reason": reason}
        if blocker_ids:
            payload["blocked_by"] = [str(blocker) for blocker in blocker_ids]
        if requests is not None:
            payload["input_requests"] = list(requests)
        w.event(
            f"task.{status}",
            run_id=run_id,
            task_id=task.pk,
            attempt_id=lease_uuid,
            payload=payload,
        )
        if blocker_ids and pending == 0:  # every blocker had already completed
            _resume(w, run_id, task, {"unblocked_by": None})
    return task


def _let_go(
    w: Write,
    task_id: UUID,
    lease_id: UUID,
    worker: str,
    reason: str | None,
    target: str,
    assignments: str,
) -> Task:
    """The worker gives its task up with no outcome (a release, a pause): the task's run
    locked, then the guard, to ``target`` with ``assignments`` and the lease cleared (one
    round trip on PostgreSQL); its attempt and lease end as released, its run's counters and
    its dependents follow. The task as written."""
    with w.db.batch():
        runs = w.send_lock_runs(of_tasks=[task_id])
        fenced = send_fenced(
            w,
            task_id=task_id,
            lease_id=lease_id,
            worker_id=worker,
            assignments=f"{assignments}{CLEAR_LEASE}",
            target=target,
        )
    w.adopt_runs(runs)
    task = fenced.task()
    close_attempts(
        w,
        [lease_id],
        status=AttemptStatus.RELEASED,
        error=reason,
    )
    status_changed(w, task, TaskStatus.LEASED)  # leased or running: alike here
    return task


def _parse_input_requests(input_requests: Any, status: str) -> dict[str, Any] | None:
    if input_requests is None:
        return None
    if status != TaskStatus.WAITING_INPUT:
        raise ValidationError(
            "input_requests goes with status='waiting_input' only.", field="input_requests"
        )
    return a.INPUT_REQUESTS.check(input_requests, "input_requests")


def _parse_blockers(blocked_by: Any, status: str, task_id: UUID) -> list[UUID]:
    if blocked_by is None:
        return []
    if status != TaskStatus.BLOCKED:
        raise ValidationError("blocked_by goes with status='blocked' only.", field="blocked_by")
    ids: list[UUID] = []
    for raw in task_id_entries(blocked_by, "blocked_by"):
        blocker = parse_id(raw)
        if blocker is None:
            raise InvalidDependencyError(
                f"blocked_by entry {raw!r} is not a task id.", dependency=raw
            )
        if blocker == task_id:
            raise InvalidDependencyError("A task cannot be blocked by itself.", dependency=blocker)
        if blocker in ids:
            raise InvalidDependencyError(
                f"Task {blocker} is listed twice in blocked_by.", dependency=blocker
            )
        ids.append(blocker)
    if not ids:
        raise ValidationError("blocked_by must name at least one task.", field="blocked_by")
    return ids


def _register_blockers(w: Write, run_id: UUID, task_id: UUID, blocker_ids: list[UUID]) -> int:
    """Record the blocker edges; return how many blockers have not completed yet."""
    states = states_in_run(w.using, run_id, blocker_ids, noun="Blocker")
    d = w.d
    w.db.send(
        "INSERT INTO pmcp_task_blocker (run_id, task_id, blocker_id) VALUES "
        + ", ".join(["(%s, %s, %s)"] * len(blocker_ids)),
        [p for b in blocker_ids for p in (d.uuid(run_id), d.uuid(task_id), d.uuid(b))],
    )
    w.update(Task, blocker_ids, blocks_others=True)
    return sum(1 for status, _ in states.values() if status != TaskStatus.COMPLETED)


def _forget_blockers(w: Write, task_id: UUID) -> None:
    w.db.send("DELETE FROM pmcp_task_blocker WHERE task_id = %s", [w.d.uuid(task_id)])


def _resume(w: Write, run_id: UUID, task: Task, payload: dict[str, Any], **fields: Any) -> None:
    """A paused task goes back to the queue, its blocker edges forgotten (by resume_task,
    or once every blocker of a blocked task has completed)."""
    _forget_blockers(w, task.pk)
    previous = move_task(w, task, TaskStatus.QUEUED, pending_blockers=0, **fields)
    w.ready(run_id)
    w.event("task.resumed", run_id=run_id, task_id=task.pk, payload={"from": previous, **payload})


def recount_waiters(w: Write, run_id: UUID, blocker_id: UUID, *, release: bool) -> None:
    """``blocker_id`` completed (``release``) or was re-executed: recount the blockers each
    task paused on it still waits for; with ``release``, those left with none go back to the
    queue in this same transaction. Recounting (not decrementing) keeps re-executed
    blockers from being counted twice."""
    waiting = TaskBlocker.objects.using(w.using).filter(blocker_id=blocker_id).values("task_id")
    waiters = (
        Task.objects.using(w.using)
        .filter(pk__in=waiting, status=TaskStatus.BLOCKED)
        .annotate(
            still_open=Count(
                "blocker_edges",
                filter=~Q(blocker_edges__blocker__status=TaskStatus.COMPLETED),
            )
        )
        .order_by("id")
    )
    for task in waiters:
        if task.still_open == 0 and release:
            _resume(w, run_id, task, {"unblocked_by": str(blocker_id)})
        elif task.still_open != task.pending_blockers:
            w.update(Task, [task.pk], pending_blockers=task.still_open)


def resume_task(
    *,
    using: str,
    task_id: Any,
    input: Any = UNSET,
    reason: str | None = None,
    now: datetime | None = None,
) -> Task:
    """A paused task goes back to ``queued``; ``input``, when given, replaces the task's input
    (the answer a ``waiting_input`` task was waiting for)."""
    now = v.resolve_now(now)
    task_uuid = v.require_id(task_id, "task_id")
    new_input = UNSET if input is UNSET else v.json_value(input, "input")
    reason = v.reason(reason)
    with write(using=using, now=now) as w:
        run, task = w.lock_run_of_task(task_uuid)
        if task.status not in PAUSED_TASK_STATUSES:
            raise InvalidTransitionError(
                f"Task {task.pk} is {task.status}; only blocked or waiting_input tasks resume.",
                task_id=task.pk,
                current=task.status,
                target=TaskStatus.QUEUED,
            )
        extra = {} if new_input is UNSET else {"input": new_input}
        payload = {"input_replaced": new_input is not UNSET, "reason": reason}
        _resume(w, run.pk, task, payload, **extra)
    return task


def requeue_dead_task(
    *,
    using: str,
    task_id: Any,
    reset_attempts: bool = True,
    not_before: datetime | None = None,
    reason: str | None = None,
    now: datetime | None = None,
) -> Task:
    """Take a task out of the dead-letter queue and queue it again."""
    now = v.resolve_now(now)
    task_uuid = v.require_id(task_id, "task_id")
    not_before = v.optional_datetime(not_before, "not_before")
    reason = v.reason(reason)
    v.flag(reset_attempts, "reset_attempts")
    with write(using=using, now=now) as w:
        run, task = w.lock_run_of_task(task_uuid)
        if not task.dead:
            raise InvalidTransitionError(
                f"Task {task.pk} is not in the dead-letter queue (status {task.status}).",
                task_id=task.pk,
                current=task.status,
                target=TaskStatus.QUEUED,
            )
        if run.status == RunStatus.CANCELLED:
            raise RunTerminalError(
                f"Run {run.pk} is cancelled; its tasks cannot be requeued.",
                run_id=run.pk,
                status=run.status,
            )
        previous_error = task.error
        fields = {"dead": False, "error": None, "not_before": not_before, "completed_at": None}
        attempts = {"attempt_count": 0} if reset_attempts else {}
        move_task(w, task, TaskStatus.QUEUED, operator=True, **fields, **attempts)
        w.ready(run.pk)
        w.event(
            "task.requeued_from_dlq",
            run_id=run.pk,
            task_id=task.pk,
            payload={
                "reason": reason,
                "reset_attempts": reset_attempts,
                "previous_error": previous_error,
                "not_before": not_before.isoformat() if not_before else None,
            },
        )
    return task

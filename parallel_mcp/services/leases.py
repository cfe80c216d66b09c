"""Claiming tasks and keeping leases: claim, mark running, heartbeat, expiry."""

from __future__ import annotations

from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any, TypedDict
from uuid import UUID

from django.db import IntegrityError
from django.db.models import F, Q

from ..actors import current as current_actor
from ..actors import current_principal
from ..contract import limits
from ..contract import validation as v
from ..exceptions import (
    IdempotencyConflictError,
    InvalidTransitionError,
    PermissionDeniedError,
    RecordNotFoundError,
    ValidationError,
)
from ..ids import new_id
from ..models import Attempt, Lease, Run, Task
from ..models.tasks import CLAIM_READY
from ..results import Claim, ExpireResult
from ..states import (
    LEASED_TASK_STATUSES,
    AttemptStatus,
    LeaseStatus,
    TaskStatus,
    assert_transition,
    bucket_of,
    retry_delay_ms,
)
from . import hotpath
from .dag import dependency_changed, is_stuck, task_finished
from .guard import lease_conflict, lease_error, lost_to_cancellation
from .runs import close_leases
from .write import Write, write

LEASED = sorted(LEASED_TASK_STATUSES)


class LeaseColumnsCleared(TypedDict):
    lease_id: None
    leased_by: None
    lease_expires_at: None
    lease_principal: None


LEASE_CLEARED: LeaseColumnsCleared = {
    "lease_id": None,
    "leased_by": None,
    "lease_expires_at": None,
    "lease_principal": None,
}


def check_lease(task: Task, lease_id: UUID, worker_id: str, now: datetime, *, using: str) -> None:
    """Fencing: the caller must hold the task's current, unexpired lease."""
    error = lease_error(task, lease_id, worker_id, now, using=using)
    if error is not None:
        raise error


def guarded_update(
    w: Write, task: Task, *, fence_only: bool = False, operator: bool = False, **fields: Any
) -> None:
    """Apply ``fields`` only if the task is still in the status and lease it was read in.

    A status change is checked against the transition table first. ``fence_only`` conditions
    on the lease alone (any leased status): a heartbeat must not lose to the same worker's
    ``leased -> running`` move. ``operator`` marks the explicit operator actions that may
    leave a terminal state (requeue from the dead-letter queue, re-execution).
    """
    target = fields.get("status")
    if target is not None and target != task.status and not operator:
        assert_transition(task.status, target, task_id=task.pk)
    fields.setdefault("updated_at", w.now)
    leaving_lease = (
        target is not None
        and task.status in LEASED_TASK_STATUSES
        and target not in LEASED_TASK_STATUSES
    )
    guard = Task.objects.using(w.using).filter(pk=task.pk, lease_id=task.lease_id)
    if fence_only:
        guard = guard.filter(status__in=LEASED)
    else:
        guard = guard.filter(status=task.status)
    if guard.update(**fields) != 1:
        current = Task.objects.using(w.using).filter(pk=task.pk).values("status").first()
        now_status = current["status"] if current else "deleted"
        raise lease_conflict(
            w.using,
            f"Task {task.pk} changed while this call was in flight: it was {task.status} and "
            f"is now {now_status}.",
            task_id=task.pk,
            held=task.lease_id,
            expected_status=task.status,
            status=now_status,
        )
    for name, value in fields.items():
        if not hasattr(value, "resolve_expression"):
            # Plain strings, as a read would give (status values are StrEnum members here).
            setattr(task, name, str(value) if isinstance(value, StrEnum) else value)
    if leaving_lease:
        w.count(task.run_id, inflight=-1)  # counted only for max_parallel runs


def leased_task(w: Write, task_id: UUID, lease_id: UUID, worker_id: str, *, lock_run: bool):
    """Read (locking its run first when asked) and fence-check a leased task."""
    task: Task | None
    if lock_run:
        run, task = w.lock_run_of_task(task_id)
    else:
        run = None
        task = Task.objects.using(w.using).filter(pk=task_id).first()
        if task is None:
            raise RecordNotFoundError(f"Task {task_id} does not exist.", task_id=task_id)
    check_lease(task, lease_id, worker_id, w.now, using=w.using)
    return run, task


def lease_args(task_id: Any, lease_id: Any, worker_id: Any) -> tuple[UUID, UUID, str]:
    return (
        v.require_id(task_id, "task_id"),
        v.require_id(lease_id, "lease_id"),
        v.text(worker_id, "worker_id"),
    )


def allowed_worker_id(worker_id: str) -> str:
    """A caller bound to a worker-id prefix (a token with one, see parallel_mcp.actors) may
    claim only as worker ids that start with it."""
    actor = current_actor()
    if actor is not None and actor.worker_prefix and not worker_id.startswith(actor.worker_prefix):
        raise PermissionDeniedError(
            f"worker_id {worker_id!r} is not allowed for {actor.principal}: its worker ids must "
            f"start with {actor.worker_prefix!r}.",
            field="worker_id",
            worker_prefix=actor.worker_prefix,
        )
    return worker_id


# -- claim ------------------------------------------------------------------------------------


def claim_next_task(
    *,
    using: str,
    worker_id: str,
    lease_ms: int,
    kinds: Any = None,
    client_token: str | None = None,
    start: bool = False,
    now: datetime | None = None,
) -> Claim | None:
    """The best ready task, leased to ``worker_id`` (``start=True``: straight to running, as
    ``mark_task_running`` would, in the same transaction)."""
    now, worker_id, lease_ms, kind_list, client_token, start = _claim_args(
        now, worker_id, lease_ms, kinds, client_token, start, token_length=limits.NAME_LENGTH
    )
    try:
        claims = hotpath.claim(
            using=using,
            worker_id=worker_id,
            lease_ms=lease_ms,
            kinds=kind_list,
            limit=1,
            start=start,
            client_token=client_token,
            token_suffixes=False,
            now=now,
        )
    except IntegrityError:
        claims = None  # a client token already used: the path below replays it
    if claims:
        return claims[0]
    if claims == [] and client_token is None:
        return None
    return _claim_next_task_orm(using, worker_id, lease_ms, kind_list, client_token, start, now)


def claim_next_tasks(
    *,
    using: str,
    worker_id: str,
    limit: Any,
    lease_ms: int,
    kinds: Any = None,
    client_token: str | None = None,
    start: bool = False,
    now: datetime | None = None,
) -> list[Claim]:
    """Up to ``limit`` ready tasks in claim order, in one transaction. Each lease gets
    ``client_token#<n>`` when a token is given, so a retried call replays the whole batch."""
    now, worker_id, lease_ms, kind_list, client_token, start = _claim_args(
        now, worker_id, lease_ms, kinds, client_token, start, token_length=limits.BATCH_TOKEN_LENGTH
    )
    if (
        isinstance(limit, bool)
        or not isinstance(limit, int)
        or not 1 <= limit <= limits.MAX_CLAIM_BATCH
    ):
        raise ValidationError(
            f"limit must be an integer from 1 to {limits.MAX_CLAIM_BATCH}, got {limit!r}.",
            field="limit",
        )
    try:
        claims = hotpath.claim(
            using=using,
            worker_id=worker_id,
            lease_ms=lease_ms,
            kinds=kind_list,
            limit=limit,
            start=start,
            client_token=client_token,
            token_suffixes=True,
            now=now,
        )
    except IntegrityError:
        if client_token is not None:
            replay = _replay_batch(using, client_token, worker_id)
            if replay:
                return replay
        raise
    if claims == [] and client_token is not None:
        # A retried call whose first try went through finds the queue empty: replay it.
        return _replay_batch(using, client_token, worker_id)
    if claims is not None:
        return claims
    # A case the static path leaves to the ORM (a max_parallel run): one task at a time.
    single = _claim_next_task_orm(
        using,
        worker_id,
        lease_ms,
        kind_list,
        None if client_token is None else f"{client_token}#0",
        start,
        now,
    )
    return [single] if single is not None else []


def _claim_args(
    now: Any, worker_id: Any, lease_ms: Any, kinds: Any, client_token: Any, start: Any, *,
    token_length: int,
) -> tuple[datetime, str, int, list[str] | None, str | None, bool]:  # fmt: skip
    return (
        v.resolve_now(now),
        allowed_worker_id(v.text(worker_id, "worker_id")),
        v.lease_ms(lease_ms),
        v.kinds(kinds),
        v.text(client_token, "client_token", max_length=token_length, allow_none=True),
        _flag(start, "start"),
    )


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValidationError(f"{name} must be True or False, got {value!r}.", field=name)
    return value


def _batch_position(lease: Lease) -> int:
    """``n`` of a batch claim's client token ``<token>#<n>``."""
    assert lease.client_token is not None  # found by its token
    return int(lease.client_token.rsplit("#", 1)[1])


def _replay_batch(using: str, client_token: str, worker_id: str) -> list[Claim]:
    # The tokens a batch can have written, exactly: an IN list the unique index serves, with
    # no collation or prefix surprises (a single claim's "job#abc" is not batch "job").
    tokens = [f"{client_token}#{n}" for n in range(limits.MAX_CLAIM_BATCH)]
    leases = list(
        Lease.objects.using(using)
        .select_related("task", "attempt", "run")
        .filter(client_token__in=tokens)
    )
    if any(
        lease.worker_id != worker_id or lease.principal != current_principal() for lease in leases
    ):
        raise IdempotencyConflictError(
            f"Client token {client_token!r} was used by another worker.",
            client_token=client_token,
        )
    leases.sort(key=_batch_position)
    return [
        Claim(run=lease.run, task=lease.task, attempt=lease.attempt, lease=lease)
        for lease in leases
    ]


def _claim_next_task_orm(
    using: str,
    worker_id: str,
    lease_ms: int,
    kind_list: list[str] | None,
    client_token: str | None,
    start: bool,
    now: datetime,
) -> Claim | None:
    if client_token is not None:
        replay = _replay_claim(using, client_token, worker_id)
        if replay is not None:
            return replay
    busy_runs: set[UUID] = set()
    try:
        for _ in range(CLAIM_ATTEMPTS):
            try:
                with write(using=using, now=now) as w:
                    return _claim(w, worker_id, lease_ms, kind_list, client_token, busy_runs, start)
            except _RunBusy as busy:
                busy_runs.add(busy.run_id)  # rolled back; look past that run
        return None
    except IntegrityError:
        # Two claims raced with one client token: the loser replays the winner's claim.
        if client_token is not None:
            replay = _replay_claim(using, client_token, worker_id)
            if replay is not None:
                return replay
        raise


def claim_candidates(
    using: str, *, now: datetime, kinds: list[str] | None = None, lock: bool = True
):
    """Ready tasks in claim order, locked with SKIP LOCKED on PostgreSQL.

    The filter matches the partial index ``pmcp_task_claim_idx`` (queued, no unmet
    dependencies) and its ordering, so the cost does not grow with the backlog of tasks that
    are waiting for dependencies or finished.
    """
    candidates = Task.objects.using(using).all()
    if lock:
        candidates = candidates.select_for_update(
            skip_locked=True, of=("self",), no_key=True
        ).select_related("run")
    candidates = (
        candidates.filter(CLAIM_READY)
        .filter(Q(not_before__isnull=True) | Q(not_before__lte=now))
        .order_by("-priority", "created_at", "id")
    )
    if kinds:
        candidates = candidates.filter(kind__in=kinds)
    return candidates


class _RunBusy(Exception):
    def __init__(self, run_id: UUID) -> None:
        self.run_id = run_id


CLAIM_ATTEMPTS = 3


def _claim(
    w: Write,
    worker_id: str,
    lease_ms: int,
    kinds: list[str] | None,
    client_token: str | None,
    busy_runs: set[UUID],
    start: bool = False,
) -> Claim | None:
    candidates = claim_candidates(w.using, now=w.now, kinds=kinds)
    if busy_runs:
        candidates = candidates.exclude(run_id__in=busy_runs)
    task = candidates.first()
    if task is None:
        return None
    if task.run.max_parallel is not None and not (
        # A claim holds the task; it must not then wait for the run (a writer holding the run
        # may be waiting for this task): take the run lock only if it is free right now.
        Run.objects.using(w.using)
        .select_for_update(skip_locked=True, no_key=True)
        .filter(pk=task.run_id)
        .exists()
    ):
        raise _RunBusy(task.run_id)
    lease_id = new_id()
    expires_at = w.now + timedelta(milliseconds=lease_ms)
    guarded_update(
        w,
        task,
        status=TaskStatus.LEASED,
        attempt_count=F("attempt_count") + 1,
        lease_id=lease_id,
        leased_by=worker_id,
        lease_expires_at=expires_at,
        lease_principal=current_principal(),
        not_before=None,
    )
    task.attempt_count += 1
    if task.run.max_parallel is not None:
        # The task held one of the run's free slots; it is now one of the run's in-flight
        # tasks (the run row is locked by this transaction, see above).
        Run.objects.using(w.using).filter(pk=task.run_id).update(
            tasks_inflight=F("tasks_inflight") + 1
        )
        task.run.tasks_inflight += 1
    if start:
        guarded_update(w, task, status=TaskStatus.RUNNING, started_at=task.started_at or w.now)
    attempt = Attempt(
        id=lease_id,
        run_id=task.run_id,
        task_id=task.pk,
        worker_id=worker_id,
        status=AttemptStatus.RUNNING if start else AttemptStatus.LEASED,
        leased_at=w.now,
        started_at=w.now if start else None,
        lease_expires_at=expires_at,
    )
    lease = Lease(
        id=lease_id,
        run_id=task.run_id,
        task_id=task.pk,
        attempt_id=lease_id,
        worker_id=worker_id,
        status=LeaseStatus.ACTIVE,
        acquired_at=w.now,
        expires_at=expires_at,
        heartbeat_at=w.now,
        client_token=client_token,
        principal=current_principal(),
    )
    Attempt.objects.using(w.using).bulk_create([attempt])
    Lease.objects.using(w.using).bulk_create([lease])
    w.event(
        "task.claimed",
        run_id=task.run_id,
        task_id=task.pk,
        attempt_id=lease_id,
        payload={
            "worker_id": worker_id,
            "lease_id": str(lease_id),
            "lease_expires_at": expires_at.isoformat(),
            "attempt": task.attempt_count,
        },
    )
    if start:
        w.event(
            "task.running",
            run_id=task.run_id,
            task_id=task.pk,
            attempt_id=lease_id,
            payload={"worker_id": worker_id},
        )
    return Claim(run=task.run, task=task, attempt=attempt, lease=lease)


def _replay_claim(using: str, client_token: str, worker_id: str) -> Claim | None:
    lease = (
        Lease.objects.using(using)
        .select_related("task", "attempt", "run")
        .filter(client_token=client_token)
        .first()
    )
    if lease is None:
        return None
    if lease.worker_id != worker_id or lease.principal != current_principal():
        raise IdempotencyConflictError(
            f"Client token {client_token!r} was used by another worker or principal.",
            client_token=client_token,
        )
    return Claim(run=lease.run, task=lease.task, attempt=lease.attempt, lease=lease)


# -- running and heartbeat -------------------------------------------------------------------


def mark_task_running(
    *, using: str, task_id: Any, lease_id: Any, worker_id: Any, now: datetime | None = None
) -> Task:
    now = v.resolve_now(now)
    task_uuid, lease_uuid, worker = lease_args(task_id, lease_id, worker_id)
    started = hotpath.mark_running(
        using=using, task_id=task_uuid, lease_id=lease_uuid, worker_id=worker, now=now
    )
    if started is not None:
        return started
    with write(using=using, now=now) as w:
        _, task = leased_task(w, task_uuid, lease_uuid, worker, lock_run=False)
        if task.status != TaskStatus.LEASED:
            raise InvalidTransitionError(
                f"Task {task.pk} is already running.",
                task_id=task.pk,
                current=task.status,
                target=TaskStatus.RUNNING,
            )
        guarded_update(w, task, status=TaskStatus.RUNNING, started_at=task.started_at or now)
        Attempt.objects.using(using).filter(pk=lease_uuid).update(
            status=AttemptStatus.RUNNING, started_at=now
        )
        w.event(
            "task.running",
            run_id=task.run_id,
            task_id=task.pk,
            attempt_id=lease_uuid,
            payload={"worker_id": worker},
        )
    return task


def heartbeat_lease(
    *,
    using: str,
    task_id: Any,
    lease_id: Any,
    worker_id: Any,
    lease_ms: int,
    now: datetime | None = None,
) -> Lease:
    now = v.resolve_now(now)
    task_uuid, lease_uuid, worker = lease_args(task_id, lease_id, worker_id)
    lease_ms = v.lease_ms(lease_ms)
    extended = hotpath.heartbeat(
        using=using,
        task_id=task_uuid,
        lease_id=lease_uuid,
        worker_id=worker,
        lease_ms=lease_ms,
        now=now,
    )
    if extended is not None:
        return extended
    with write(using=using, now=now) as w:
        lease = Lease.objects.using(using).select_related("task").filter(pk=lease_uuid).first()
        if lease is None or lease.task_id != task_uuid:
            # Not this task's lease: say whether the task exists at all.
            leased_task(w, task_uuid, lease_uuid, worker, lock_run=False)
            raise lease_conflict(  # unreachable unless rows disagree; never extend it
                using,
                f"Lease {lease_uuid} does not belong to task {task_uuid}.",
                task_id=task_uuid,
                held=lease_uuid,
                lease_id=lease_uuid,
            )
        task = lease.task
        check_lease(task, lease_uuid, worker, now, using=using)
        expires_at = now + timedelta(milliseconds=lease_ms)
        guarded_update(w, task, fence_only=True, lease_expires_at=expires_at)
        Lease.objects.using(using).filter(pk=lease_uuid).update(
            expires_at=expires_at, heartbeat_at=now
        )
        lease.expires_at, lease.heartbeat_at = expires_at, now
        Attempt.objects.using(using).filter(pk=lease_uuid).update(lease_expires_at=expires_at)
        w.event(
            "task.lease_heartbeat",
            run_id=task.run_id,
            task_id=task.pk,
            attempt_id=lease_uuid,
            payload={"worker_id": worker, "lease_expires_at": expires_at.isoformat()},
        )
    return lease


# -- expiry -----------------------------------------------------------------------------------


def expire_leases(*, using: str, now: datetime | None = None) -> ExpireResult:
    """Requeue (with backoff) or dead-letter every task whose lease expired before ``now``."""
    now = v.resolve_now(now)
    refresh_delayed_slots(using=using, now=now)
    expired = list(
        Task.objects.using(using)
        .filter(status__in=LEASED, lease_expires_at__lt=now)
        .values_list("run_id", flat=True)
        .distinct()
    )
    if not expired:
        return ExpireResult(expired_task_ids=[], count=0)
    expired_ids: list[UUID] = []
    with write(using=using, now=now) as w:
        for run_id in sorted(expired):
            try:
                w.lock_run(run_id)
            except RecordNotFoundError:  # pruned meanwhile
                continue
        tasks = list(
            Task.objects.using(using)
            .select_for_update(no_key=True)
            .filter(run_id__in=list(w.locked_runs), status__in=LEASED, lease_expires_at__lt=now)
            .order_by("id")
        )
        for task in tasks:
            expire_one(w, task)
            expired_ids.append(task.pk)
    return ExpireResult(expired_task_ids=expired_ids, count=len(expired_ids))


def refresh_delayed_slots(*, using: str, now: datetime) -> None:
    """A max_parallel run hands its free slots only to due tasks; when a delayed task
    (``not_before``, retry backoff) becomes due, nothing else happens in its run, so the
    expiry loop hands the slots out again."""
    runs = list(
        Task.objects.using(using)
        .filter(
            status=TaskStatus.QUEUED,
            unmet_dependencies=0,
            claimable=False,
            not_before__isnull=False,
            not_before__lte=now,
            run__max_parallel__isnull=False,
            run__tasks_inflight__lt=F("run__max_parallel"),
        )
        .values_list("run_id", flat=True)
        .distinct()[:1000]
    )
    for run_id in sorted(runs):
        with write(using=using, now=now) as w:
            w.lock_run(run_id)
            w.changed_runs.add(run_id)


def expire_one(w: Write, task: Task) -> None:
    lease_id = task.lease_id
    assert task.lease_expires_at is not None  # a leased task's (a check constraint)
    close_leases(
        w.using,
        [lease_id],
        now=w.now,
        attempt_status=AttemptStatus.EXPIRED,
        lease_status=LeaseStatus.EXPIRED,
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
        dead_letter(w, task, error="max_attempts_exceeded", attempt_id=lease_id)


def attempts_left(task: Task) -> bool:
    return task.max_attempts is None or task.attempt_count < task.max_attempts


def schedule_retry(w: Write, task: Task, *, error: str, attempt_id: UUID | None) -> None:
    """Back to ``queued`` after the task's backoff (the run's counters do not move)."""
    delay = retry_delay_ms(
        attempt=task.attempt_count,
        delay_ms=task.retry_delay_ms,
        backoff=task.retry_backoff,
        max_delay_ms=task.retry_max_delay_ms,
    )
    not_before = w.now + timedelta(milliseconds=delay) if delay else None
    w.touch(task.run_id)
    if not_before is None:
        w.ready(task.run_id)
    guarded_update(
        w, task, status=TaskStatus.QUEUED, not_before=not_before, error=error, **LEASE_CLEARED
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


def requeue(w: Write, run_id: UUID, task: Task, *, operator: bool = False, **fields: Any) -> str:
    """``task`` goes back to ``queued`` from a paused or finished state (with ``fields``
    written alongside): the run's counters and the task's dependents follow, and idle workers
    are woken. ``operator`` allows leaving a terminal state. Returns the status it left."""
    previous = str(task.status)
    before = (previous, task.failed_dependencies)
    guarded_update(w, task, operator=operator, status=TaskStatus.QUEUED, **fields)
    after = (str(TaskStatus.QUEUED), task.failed_dependencies)
    w.move(run_id, bucket_of(previous), "stuck" if is_stuck(*after) else "active")
    dependency_changed(w, run_id, task.pk, before, after)
    w.ready(run_id)
    return previous


def dead_letter(
    w: Write, task: Task, *, error: str, attempt_id: UUID | None, metadata: Any = None
) -> None:
    """Attempts exhausted: ``failed`` and into the dead-letter queue."""
    fields: dict[str, Any] = {
        "status": TaskStatus.FAILED,
        "error": error,
        "dead": True,
        "completed_at": w.now,
        **LEASE_CLEARED,
    }
    if metadata is not None:
        fields["metadata"] = merge_metadata(task.metadata, metadata)
    guarded_update(w, task, **fields)
    w.move(task.run_id, "active", "failed")
    w.event(
        "task.failed",
        run_id=task.run_id,
        task_id=task.pk,
        attempt_id=attempt_id,
        payload={"error": error, "attempt": task.attempt_count, "dead": True},
    )
    w.event(
        "task.dead_lettered",
        run_id=task.run_id,
        task_id=task.pk,
        attempt_id=attempt_id,
        payload={"error": error, "attempts": task.attempt_count, "max_attempts": task.max_attempts},
    )
    task_finished(w, task, TaskStatus.FAILED)


def merge_metadata(current: Any, update: Any) -> Any:
    """Dicts merge shallowly (the update wins); anything else replaces."""
    if isinstance(current, dict) and isinstance(update, dict):
        return {**current, **update}
    return update


__all__ = [
    "LEASE_CLEARED",
    "Run",
    "attempts_left",
    "check_lease",
    "claim_next_task",
    "claim_next_tasks",
    "dead_letter",
    "expire_leases",
    "guarded_update",
    "heartbeat_lease",
    "lease_conflict",
    "leased_task",
    "lost_to_cancellation",
    "mark_task_running",
    "merge_metadata",
    "requeue",
    "schedule_retry",
]


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
    if isinstance(progress, bool) or not isinstance(progress, (int, float)):
        raise ValidationError(f"progress must be a number, got {progress!r}.", field="progress")
    if not 0.0 <= float(progress) <= 1.0:
        raise ValidationError(
            f"progress must be between 0.0 and 1.0, got {progress}.", field="progress"
        )
    message = v.reason(message, "message")
    with write(using=using, now=now) as w:
        _, task = leased_task(w, task_uuid, lease_uuid, worker, lock_run=False)
        guarded_update(w, task, fence_only=True, progress=float(progress), progress_message=message)
        w.event(
            "task.progress",
            run_id=task.run_id,
            task_id=task.pk,
            attempt_id=lease_uuid,
            payload={"worker_id": worker, "progress": float(progress), "message": message},
        )
    return task

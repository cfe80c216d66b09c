"""Pure state rules: task transitions and run-status derivation. No ORM here."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from .contract.limits import MAX_RETRY_DELAY_MS
from .exceptions import InvalidTransitionError


class TaskStatus(StrEnum):
    QUEUED = "queued"
    LEASED = "leased"
    RUNNING = "running"
    BLOCKED = "blocked"
    WAITING_INPUT = "waiting_input"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class RunStatus(StrEnum):
    PENDING = "pending"
    ACTIVE = "active"
    WAITING = "waiting"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class AttemptStatus(StrEnum):
    LEASED = "leased"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    RELEASED = "released"
    CANCELLED = "cancelled"


class LeaseStatus(StrEnum):
    ACTIVE = "active"
    EXPIRED = "expired"
    RELEASED = "released"
    CANCELLED = "cancelled"


# A lease is its attempt's hold on the task, so its status follows the attempt's: stored once,
# on the attempt (the view pmcp_lease spells this map as SQL, migration 0013).
LEASE_STATUS_OF_ATTEMPT: dict[str, LeaseStatus] = {
    AttemptStatus.LEASED: LeaseStatus.ACTIVE,
    AttemptStatus.RUNNING: LeaseStatus.ACTIVE,
    AttemptStatus.COMPLETED: LeaseStatus.RELEASED,
    AttemptStatus.FAILED: LeaseStatus.RELEASED,
    AttemptStatus.RELEASED: LeaseStatus.RELEASED,
    AttemptStatus.EXPIRED: LeaseStatus.EXPIRED,
    AttemptStatus.CANCELLED: LeaseStatus.CANCELLED,
}


T = TaskStatus

TASK_TRANSITIONS: dict[TaskStatus, frozenset[TaskStatus]] = {
    T.QUEUED: frozenset({T.LEASED, T.CANCELLED}),
    T.LEASED: frozenset(
        {T.RUNNING, T.QUEUED, T.BLOCKED, T.WAITING_INPUT, T.COMPLETED, T.FAILED, T.CANCELLED}
    ),
    T.RUNNING: frozenset(
        {T.QUEUED, T.BLOCKED, T.WAITING_INPUT, T.COMPLETED, T.FAILED, T.CANCELLED}
    ),
    T.BLOCKED: frozenset({T.QUEUED, T.CANCELLED}),
    T.WAITING_INPUT: frozenset({T.QUEUED, T.CANCELLED}),
    T.COMPLETED: frozenset(),
    T.FAILED: frozenset(),
    T.CANCELLED: frozenset(),
}

TERMINAL_TASK_STATUSES = frozenset({T.COMPLETED, T.FAILED, T.CANCELLED})
LEASED_TASK_STATUSES = frozenset({T.LEASED, T.RUNNING})
PAUSED_TASK_STATUSES = frozenset({T.BLOCKED, T.WAITING_INPUT})
TERMINAL_RUN_STATUSES = frozenset({RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED})


def sources_of(target: str) -> frozenset[TaskStatus]:
    """The states a task may reach ``target`` from."""
    return frozenset(s for s, targets in TASK_TRANSITIONS.items() if TaskStatus(target) in targets)


def can_transition(current: str, target: str) -> bool:
    return TaskStatus(target) in TASK_TRANSITIONS[TaskStatus(current)]


def transition_error(
    current: str, target: str, *, task_id: object = None
) -> InvalidTransitionError | None:
    """Why a task may not move from ``current`` to ``target``, or None when it may."""
    current, target = str(current), str(target)
    if can_transition(current, target):
        return None
    return InvalidTransitionError(
        f"Task {task_id} cannot move from {current!r} to {target!r}.",
        task_id=task_id,
        current=current,
        target=target,
    )


def assert_transition(current: str, target: str, *, task_id: object = None) -> None:
    error = transition_error(current, target, task_id=task_id)
    if error is not None:
        raise error


@dataclass(frozen=True)
class TaskCounts:
    """A run's task counters, by the bucket each counts toward.

    ``active``: queued tasks that can still run, plus leased and running ones.
    ``stuck``: queued tasks that can never run because a required dependency failed or was
    cancelled (directly or through another stuck task).
    ``waiting``: blocked and waiting_input tasks.
    """

    total: int = 0
    active: int = 0
    waiting: int = 0
    stuck: int = 0
    completed: int = 0
    failed: int = 0
    cancelled: int = 0


def derive_run_status(*, cancel_requested: bool, counts: TaskCounts) -> RunStatus:
    """The run status implied by its counters (see docs/lifecycle.md)."""
    if cancel_requested:
        return RunStatus.CANCELLED
    if counts.total == 0:
        return RunStatus.PENDING
    if counts.cancelled == counts.total:
        return RunStatus.CANCELLED
    if counts.completed + counts.cancelled == counts.total:
        return RunStatus.COMPLETED
    if counts.active > 0:
        return RunStatus.ACTIVE
    if counts.waiting > 0:
        return RunStatus.WAITING
    return RunStatus.FAILED


def bucket_of(status: str, *, stuck: bool = False) -> str:
    """Which counter of ``TaskCounts`` a task in ``status`` counts toward."""
    status = TaskStatus(status)
    if status is T.QUEUED:
        return "stuck" if stuck else "active"
    if status in LEASED_TASK_STATUSES:
        return "active"
    if status in PAUSED_TASK_STATUSES:
        return "waiting"
    return str(status.value)


def retry_delay_ms(
    *, attempt: int, delay_ms: int | None, backoff: str | None, max_delay_ms: int | None
) -> int:
    """Backoff before the next attempt: ``delay_ms``, doubled per attempt when exponential,
    capped by ``max_delay_ms`` when that is positive."""
    if not delay_ms or delay_ms <= 0:
        return 0
    delay = delay_ms
    if backoff == "exponential":
        delay = delay_ms * 2 ** min(max(0, attempt - 1), 64)
    if max_delay_ms is not None and max_delay_ms > 0:
        delay = min(delay, max_delay_ms)
    return min(delay, MAX_RETRY_DELAY_MS)

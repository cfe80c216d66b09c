"""Small frozen result types returned by the Orchestrator."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from uuid import UUID

if TYPE_CHECKING:  # pragma: no cover
    from .models import Attempt, Event, Lease, Run, Task


@dataclass(frozen=True)
class Claim:
    run: Run
    task: Task
    attempt: Attempt
    lease: Lease


@dataclass(frozen=True)
class RemoteClaim(Claim):
    """A claim read through the HTTP API, with the payload of the run's current context
    (the API sends it along, so a remote worker needs no read for ``ctx.context``)."""

    context: Any = None


@dataclass(frozen=True)
class ExpireResult:
    expired_task_ids: list[UUID] = field(default_factory=list)
    count: int = 0


@dataclass(frozen=True)
class PruneResult:
    pruned_run_ids: list[UUID] = field(default_factory=list)
    count: int = 0


@dataclass(frozen=True)
class EventPage:
    events: list[Event]
    next_cursor: int | None

    def __iter__(self) -> Any:
        return iter(self.events)


BLOCKER_KINDS = (
    "dependency_pending",
    "dependency_failed",
    "not_before",
    "paused",
    "leased",
    "run_limit",
    "run_cancelled",
    "no_worker",
)


@dataclass(frozen=True)
class Blocker:
    """One reason a task is not running now (see ``Orchestrator.explain_task``)."""

    kind: str
    message: str
    task_id: UUID | None = None
    until: Any = None

"""The methods every orchestrator offers, local or remote, defined once.

``Orchestrator`` (the database) and ``RemoteOrchestrator`` (the HTTP API, for
``pmcp_worker --api``) both subclass :class:`OrchestratorProtocol`, so a type checker verifies
each against these signatures, and ``tests/test_contract_protocol.py`` checks at run time that
both define every method with the same parameters (names, kinds, defaults, annotations).
Handler code typed against the protocol (``ctx.orchestrator``) runs under either.

Not in the protocol: ``Orchestrator.transaction()``. It holds one database transaction open
around several calls; over HTTP every call is its own transaction on the server and nothing can
hold one open between requests, so ``RemoteOrchestrator.transaction()`` raises instead (an
all-or-nothing graph is ``enqueue_tasks``).

Every time-dependent method takes ``now``; a remote orchestrator refuses a value other than
``None`` (the server's clock decides).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias
from uuid import UUID

if TYPE_CHECKING:  # pragma: no cover
    from ..models import ContextSnapshot, Event, Lease, Run, Task
    from ..results import Blocker, Claim, EventPage, ExpireResult, PruneResult

# An id: a UUID or its string form.
Id: TypeAlias = UUID | str
# Any JSON-serialisable value (input, output, metadata, payload, context).
Json: TypeAlias = Any
# A ``depends_on`` entry: a task id (or, in a batch, a key of the batch), or
# ``{"task_id": id, "required": False}`` for an optional dependency.
Dependency: TypeAlias = Id | Mapping[str, Any]


class _Unset:
    """The default of arguments whose absence differs from ``None`` (``resume_task(input=)``)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


class OrchestratorProtocol(Protocol):
    """Runs, task DAGs, leases, retries, the dead-letter queue, context and events.

    See CONTRACT.md and docs/ for what each method does; the signatures here are the contract.
    """

    default_lease_ms: int

    # -- runs -------------------------------------------------------------------------------
    def create_run(
        self,
        *,
        namespace: str = "default",
        external_id: str | None = None,
        metadata: Json = None,
        context: Json = None,
        id: Id | None = None,
        max_parallel: int | None = None,
        now: datetime | None = None,
    ) -> Run:
        """A new run; with ``context``, its first (current) context snapshot."""
        ...

    def get_run(self, *, run_id: Id) -> Run | None:
        """The run, or None when there is none with that id."""
        ...

    def cancel_run(
        self, *, run_id: Id, reason: str | None = None, now: datetime | None = None
    ) -> Run:
        """Cancel every non-terminal task of the run; a terminal run is left as it is."""
        ...

    def list_runs(
        self,
        *,
        namespace: str | None = None,
        statuses: Iterable[str] | None = None,
        external_id: str | None = None,
        updated_after: datetime | None = None,
        updated_before: datetime | None = None,
        limit: int | None = None,
        offset: int = 0,
        order_by: str = "updated_at",
        order_dir: str = "desc",
    ) -> list[Run]:
        """Runs matching the filters (``updated_after`` inclusive, ``updated_before``
        exclusive)."""
        ...

    def prune_runs(
        self,
        *,
        older_than: datetime | timedelta,
        statuses: Iterable[str] | None = None,
        limit: int | None = None,
        now: datetime | None = None,
    ) -> PruneResult:
        """Delete terminal runs last updated before ``older_than``, with everything of theirs."""
        ...

    def copy_run(
        self, *, run_id: Id, reason: str | None = None, now: datetime | None = None
    ) -> Run:
        """A new run with a fresh copy of every task definition and the same graph."""
        ...

    # -- tasks ------------------------------------------------------------------------------
    def enqueue_task(
        self,
        *,
        run_id: Id,
        kind: str,
        key: str | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        retry: Mapping[str, Any] | None = None,
        timeout_ms: int | None = None,
        input: Json = None,
        metadata: Json = None,
        depends_on: Iterable[Dependency] = (),
        not_before: datetime | None = None,
        context_snapshot_id: Id | None = None,
        id: Id | None = None,
        now: datetime | None = None,
    ) -> Task:
        """Add a task to the run."""
        ...

    def enqueue_tasks(
        self, *, run_id: Id, tasks: Iterable[Mapping[str, Any]], now: datetime | None = None
    ) -> list[Task]:
        """A graph at once (each item the arguments of ``enqueue_task``); ``depends_on`` may
        name a ``key`` of the batch; all or nothing."""
        ...

    def claim_next_task(
        self,
        *,
        worker_id: str,
        lease_ms: int | None = None,
        kinds: Iterable[str] | None = None,
        client_token: str | None = None,
        start: bool = False,
        now: datetime | None = None,
    ) -> Claim | None:
        """Lease the next ready task (``start``: straight into running), or None."""
        ...

    def claim_next_tasks(
        self,
        *,
        worker_id: str,
        limit: int,
        lease_ms: int | None = None,
        kinds: Iterable[str] | None = None,
        client_token: str | None = None,
        start: bool = False,
        now: datetime | None = None,
    ) -> list[Claim]:
        """Up to ``limit`` claims in one transaction, in claim order."""
        ...

    def mark_task_running(
        self, *, task_id: Id, lease_id: Id, worker_id: str, now: datetime | None = None
    ) -> Task:
        """A leased task starts running."""
        ...

    def heartbeat_lease(
        self,
        *,
        task_id: Id,
        lease_id: Id,
        worker_id: str,
        lease_ms: int | None = None,
        now: datetime | None = None,
    ) -> Lease:
        """Extend the lease to now + ``lease_ms`` (default: the orchestrator's)."""
        ...

    def report_progress(
        self,
        *,
        task_id: Id,
        lease_id: Id,
        worker_id: str,
        progress: float,
        message: str | None = None,
        now: datetime | None = None,
    ) -> Task:
        """Record progress (0.0 to 1.0) and an optional message."""
        ...

    def pause_task(
        self,
        *,
        task_id: Id,
        lease_id: Id,
        worker_id: str,
        status: str,
        reason: str | None = None,
        blocked_by: Iterable[Id] | None = None,
        input_requests: Mapping[str, Any] | None = None,
        now: datetime | None = None,
    ) -> Task:
        """Give the lease up and wait (``blocked`` or ``waiting_input``); ``blocked_by``: until
        those tasks complete; ``input_requests``: what a task of a tool call's run asks the MCP
        client (``{key: {"method", "params"}}``), recorded with the pause."""
        ...

    def resume_task(
        self,
        *,
        task_id: Id,
        input: Json = UNSET,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Task:
        """Paused -> queued; ``input`` (when given, even None) replaces the task's input."""
        ...

    def complete_task(
        self,
        *,
        task_id: Id,
        lease_id: Id,
        worker_id: str,
        output: Json = None,
        metadata: Json = None,
        next_context: Json = None,
        next_context_label: str | None = None,
        client_token: str | None = None,
        now: datetime | None = None,
    ) -> Task:
        """Complete the task; ``next_context`` becomes the run's current context."""
        ...

    def fail_task(
        self,
        *,
        task_id: Id,
        lease_id: Id,
        worker_id: str,
        error: str,
        metadata: Json = None,
        retry: bool = False,
        client_token: str | None = None,
        now: datetime | None = None,
    ) -> Task:
        """Fail the task: terminal, or (``retry``) requeued with backoff while attempts
        remain."""
        ...

    def release_task(
        self,
        *,
        task_id: Id,
        lease_id: Id,
        worker_id: str,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Task:
        """Back to the queue without consuming an attempt."""
        ...

    def cancel_task(
        self, *, task_id: Id, reason: str | None = None, now: datetime | None = None
    ) -> Task:
        """Any non-terminal task -> cancelled."""
        ...

    def retry_task(
        self,
        *,
        task_id: Id,
        cascade: bool = True,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Task:
        """Re-execute a finished task (and, with ``cascade``, its finished dependents)."""
        ...

    def requeue_dead_task(
        self,
        *,
        task_id: Id,
        reset_attempts: bool = True,
        not_before: datetime | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Task:
        """Take a task out of the dead-letter queue."""
        ...

    def expire_leases(self, *, now: datetime | None = None) -> ExpireResult:
        """Requeue (with backoff) or dead-letter every task whose lease ran out."""
        ...

    # -- reads ------------------------------------------------------------------------------
    def get_task(self, *, task_id: Id) -> Task | None:
        """The task, or None when there is none with that id."""
        ...

    def list_run_tasks(self, *, run_id: Id) -> list[Task]:
        """Every task of the run, oldest first."""
        ...

    def list_pending_tasks(
        self,
        *,
        run_id: Id | None = None,
        kinds: Iterable[str] | None = None,
        ready_by: datetime | None = None,
        limit: int | None = None,
    ) -> list[Task]:
        """Queued tasks in claim order; with ``ready_by``, only those a claim could take
        then."""
        ...

    def list_dead_tasks(
        self,
        *,
        run_id: Id | None = None,
        kinds: Iterable[str] | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Task]:
        """The dead-letter queue, most recent first."""
        ...

    def list_stuck_tasks(
        self, *, running_longer_than_ms: int | None = None, now: datetime | None = None
    ) -> list[Task]:
        """Leased or running tasks past the threshold or their own ``timeout_ms``."""
        ...

    def explain_task(self, *, task_id: Id, now: datetime | None = None) -> list[Blocker]:
        """Why a non-terminal task is not running; empty when it is claimable."""
        ...

    # -- context and events -----------------------------------------------------------------
    def append_context_snapshot(
        self,
        *,
        run_id: Id,
        payload: Json,
        scope: str = "run",
        label: str | None = None,
        task_id: Id | None = None,
        parent_snapshot_id: Id | None = None,
        id: Id | None = None,
        now: datetime | None = None,
    ) -> ContextSnapshot:
        """A new snapshot; with ``scope="run"`` it becomes the run's current context."""
        ...

    def get_current_context_snapshot(self, *, run_id: Id) -> ContextSnapshot | None:
        """The run's current context snapshot, or None."""
        ...

    def list_run_events(self, *, run_id: Id) -> list[Event]:
        """Every event of the run, in id order."""
        ...

    def list_events_since(
        self,
        *,
        after_id: int | None = None,
        run_id: Id | None = None,
        event_types: Iterable[str] | None = None,
        limit: int | None = None,
    ) -> EventPage:
        """A page of events after ``after_id``; pass ``next_cursor`` back as ``after_id``."""
        ...


def method_names() -> tuple[str, ...]:
    """The protocol's methods, in declaration order."""
    return tuple(
        name
        for name, member in vars(OrchestratorProtocol).items()
        if inspect.isfunction(member) and not name.startswith("_")
    )


def signature(name: str) -> inspect.Signature:
    """The signature of one of the protocol's methods."""
    return inspect.signature(getattr(OrchestratorProtocol, name))

"""The public facade: every method keyword-only, each a thin call into services/selectors."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction as db_transaction

from . import selectors, services
from .conf import app_settings
from .contract import validation as v
from .contract.protocol import UNSET, Dependency, Id, Json, OrchestratorProtocol
from .exceptions import ValidationError
from .models import ContextSnapshot, Event, Lease, Run, Task
from .results import Blocker, Claim, EventPage, ExpireResult, PruneResult


class Orchestrator(OrchestratorProtocol):
    """Runs, task DAGs, leases, retries, the dead-letter queue, context and events, straight
    on the database. Implements :class:`~parallel_mcp.contract.protocol.OrchestratorProtocol`
    (as the HTTP client ``RemoteOrchestrator`` does), plus ``transaction()``.

    ``Orchestrator()`` takes its defaults from ``settings.PARALLEL_MCP``;
    ``Orchestrator(default_lease_ms=60_000, using="default")`` overrides them.
    """

    def __init__(self, *, default_lease_ms: int | None = None, using: str | None = None) -> None:
        lease = app_settings.DEFAULT_LEASE_MS if default_lease_ms is None else default_lease_ms
        self.default_lease_ms = v.lease_ms(lease, "default_lease_ms")
        self.using = using or app_settings.DATABASE_ALIAS
        from django.conf import settings

        if self.using not in settings.DATABASES:
            raise ValidationError(f"Unknown database alias {self.using!r}.", field="using")

    def __repr__(self) -> str:
        return f"Orchestrator(using={self.using!r}, default_lease_ms={self.default_lease_ms})"

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
        return services.create_run(
            using=self.using,
            namespace=namespace,
            external_id=external_id,
            metadata=metadata,
            context=context,
            id=id,
            max_parallel=max_parallel,
            now=now,
        )

    def get_run(self, *, run_id: Id) -> Run | None:
        return selectors.get_run(using=self.using, run_id=run_id)

    def cancel_run(
        self, *, run_id: Id, reason: str | None = None, now: datetime | None = None
    ) -> Run:
        return services.cancel_run(using=self.using, run_id=run_id, reason=reason, now=now)

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
        return selectors.list_runs(
            using=self.using,
            namespace=namespace,
            statuses=statuses,
            external_id=external_id,
            updated_after=updated_after,
            updated_before=updated_before,
            limit=limit,
            offset=offset,
            order_by=order_by,
            order_dir=order_dir,
        )

    def prune_runs(
        self,
        *,
        older_than: datetime | timedelta,
        statuses: Iterable[str] | None = None,
        limit: int | None = None,
        now: datetime | None = None,
    ) -> PruneResult:
        return services.prune_runs(
            using=self.using, older_than=older_than, statuses=statuses, limit=limit, now=now
        )

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
        return services.enqueue_task(
            using=self.using,
            run_id=run_id,
            kind=kind,
            key=key,
            priority=priority,
            max_attempts=max_attempts,
            retry=retry,
            timeout_ms=timeout_ms,
            input=input,
            metadata=metadata,
            depends_on=depends_on,
            not_before=not_before,
            context_snapshot_id=context_snapshot_id,
            id=id,
            now=now,
        )

    def enqueue_tasks(
        self, *, run_id: Id, tasks: Iterable[Mapping[str, Any]], now: datetime | None = None
    ) -> list[Task]:
        """Enqueue a graph at once: ``depends_on`` may name a ``key`` of the same batch;
        all or nothing; a cycle raises DependencyCycleError naming it."""
        return services.enqueue_tasks(using=self.using, run_id=run_id, tasks=tasks, now=now)

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
        return services.claim_next_task(
            using=self.using,
            worker_id=worker_id,
            lease_ms=self.default_lease_ms if lease_ms is None else lease_ms,
            kinds=kinds,
            client_token=client_token,
            start=start,
            now=now,
        )

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
        """Up to ``limit`` claims in one transaction (see docs/performance.md)."""
        return services.claim_next_tasks(
            using=self.using,
            worker_id=worker_id,
            limit=limit,
            lease_ms=self.default_lease_ms if lease_ms is None else lease_ms,
            kinds=kinds,
            client_token=client_token,
            start=start,
            now=now,
        )

    def mark_task_running(
        self, *, task_id: Id, lease_id: Id, worker_id: str, now: datetime | None = None
    ) -> Task:
        return services.mark_task_running(
            using=self.using, task_id=task_id, lease_id=lease_id, worker_id=worker_id, now=now
        )

    def heartbeat_lease(
        self,
        *,
        task_id: Id,
        lease_id: Id,
        worker_id: str,
        lease_ms: int | None = None,
        now: datetime | None = None,
    ) -> Lease:
        return services.heartbeat_lease(
            using=self.using,
            task_id=task_id,
            lease_id=lease_id,
            worker_id=worker_id,
            lease_ms=self.default_lease_ms if lease_ms is None else lease_ms,
            now=now,
        )

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
        return services.pause_task(
            using=self.using,
            task_id=task_id,
            lease_id=lease_id,
            worker_id=worker_id,
            status=status,
            reason=reason,
            blocked_by=blocked_by,
            input_requests=input_requests,
            now=now,
        )

    def resume_task(
        self,
        *,
        task_id: Id,
        input: Json = UNSET,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Task:
        """Paused -> queued; ``input`` (optional) replaces the task's input."""
        return services.resume_task(
            using=self.using, task_id=task_id, input=input, reason=reason, now=now
        )

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
        return services.complete_task(
            using=self.using,
            task_id=task_id,
            lease_id=lease_id,
            worker_id=worker_id,
            output=output,
            metadata=metadata,
            next_context=next_context,
            next_context_label=next_context_label,
            client_token=client_token,
            now=now,
        )

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
        return services.fail_task(
            using=self.using,
            task_id=task_id,
            lease_id=lease_id,
            worker_id=worker_id,
            error=error,
            metadata=metadata,
            retry=retry,
            client_token=client_token,
            now=now,
        )

    def release_task(
        self,
        *,
        task_id: Id,
        lease_id: Id,
        worker_id: str,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Task:
        return services.release_task(
            using=self.using,
            task_id=task_id,
            lease_id=lease_id,
            worker_id=worker_id,
            reason=reason,
            now=now,
        )

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
        return services.report_progress(
            using=self.using,
            task_id=task_id,
            lease_id=lease_id,
            worker_id=worker_id,
            progress=progress,
            message=message,
            now=now,
        )

    def cancel_task(
        self, *, task_id: Id, reason: str | None = None, now: datetime | None = None
    ) -> Task:
        return services.cancel_task(using=self.using, task_id=task_id, reason=reason, now=now)

    def retry_task(
        self,
        *,
        task_id: Id,
        cascade: bool = True,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Task:
        return services.retry_task(
            using=self.using, task_id=task_id, cascade=cascade, reason=reason, now=now
        )

    def copy_run(
        self, *, run_id: Id, reason: str | None = None, now: datetime | None = None
    ) -> Run:
        return services.copy_run(using=self.using, run_id=run_id, reason=reason, now=now)

    def list_stuck_tasks(
        self, *, running_longer_than_ms: int | None = None, now: datetime | None = None
    ) -> list[Task]:
        return selectors.list_stuck_tasks(
            using=self.using, running_longer_than_ms=running_longer_than_ms, now=now
        )

    def explain_task(self, *, task_id: Id, now: datetime | None = None) -> list[Blocker]:
        return selectors.explain_task(using=self.using, task_id=task_id, now=now)

    def get_task(self, *, task_id: Id) -> Task | None:
        return selectors.get_task(using=self.using, task_id=task_id)

    def list_run_tasks(self, *, run_id: Id) -> list[Task]:
        return selectors.list_run_tasks(using=self.using, run_id=run_id)

    def list_pending_tasks(
        self,
        *,
        run_id: Id | None = None,
        kinds: Iterable[str] | None = None,
        ready_by: datetime | None = None,
        limit: int | None = None,
    ) -> list[Task]:
        return selectors.list_pending_tasks(
            using=self.using, run_id=run_id, kinds=kinds, ready_by=ready_by, limit=limit
        )

    def expire_leases(self, *, now: datetime | None = None) -> ExpireResult:
        return services.expire_leases(using=self.using, now=now)

    def list_dead_tasks(
        self,
        *,
        run_id: Id | None = None,
        kinds: Iterable[str] | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Task]:
        return selectors.list_dead_tasks(
            using=self.using, run_id=run_id, kinds=kinds, limit=limit, offset=offset
        )

    def requeue_dead_task(
        self,
        *,
        task_id: Id,
        reset_attempts: bool = True,
        not_before: datetime | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Task:
        return services.requeue_dead_task(
            using=self.using,
            task_id=task_id,
            reset_attempts=reset_attempts,
            not_before=not_before,
            reason=reason,
            now=now,
        )

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
        return services.append_context_snapshot(
            using=self.using,
            run_id=run_id,
            payload=payload,
            scope=scope,
            label=label,
            task_id=task_id,
            parent_snapshot_id=parent_snapshot_id,
            id=id,
            now=now,
        )

    def get_current_context_snapshot(self, *, run_id: Id) -> ContextSnapshot | None:
        return selectors.get_current_context_snapshot(using=self.using, run_id=run_id)

    def list_run_events(self, *, run_id: Id) -> list[Event]:
        return selectors.list_run_events(using=self.using, run_id=run_id)

    def list_events_since(
        self,
        *,
        after_id: int | None = None,
        run_id: Id | None = None,
        event_types: Iterable[str] | None = None,
        limit: int | None = None,
    ) -> EventPage:
        return selectors.list_events_since(
            using=self.using, after_id=after_id, run_id=run_id, event_types=event_types, limit=limit
        )

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Everything inside commits or rolls back as one unit; signals fire after commit."""
        with db_transaction.atomic(using=self.using):
            yield

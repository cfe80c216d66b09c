"""What a handler receives."""

from __future__ import annotations

import threading
from functools import cached_property
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    from ..models import Lease, Run, Task
    from ..orchestrator import Orchestrator


_NOT_LOADED: Any = object()


class HandlerContext:
    """The claimed task and the means to talk about it.

    ``cancelled`` is set when the worker stops, the task or its run is cancelled (from any
    process: the heartbeat's lease check tells), the lease is lost, or ``timeout_ms`` passes.
    A handler that runs long should check it and return early.
    """

    def __init__(
        self,
        *,
        orchestrator: Orchestrator,
        task: Task,
        run: Run,
        lease: Lease,
        worker_id: str,
        lease_ms: int,
        context: Any = _NOT_LOADED,
    ) -> None:
        self.orchestrator = orchestrator
        self.task = task
        self.run = run
        self.lease = lease
        self.worker_id = worker_id
        self.lease_ms = lease_ms
        if context is not _NOT_LOADED:  # a remote claim brings its context along
            self.__dict__["context"] = context
        self.cancelled = threading.Event()
        self.cancel_reason: str | None = None

    @property
    def input(self) -> Any:
        return self.task.input

    @cached_property
    def context(self) -> Any:
        """The payload of the run's current context snapshot when the task was claimed (what
        upstream tasks passed on with ``next_context``), loaded on first use. The snapshot
        the task was enqueued with is ``task.context_snapshot_id``."""
        from ..models import ContextSnapshot

        snapshot_id = self.run.current_context_snapshot_id
        if snapshot_id is None:
            return None
        payload = (
            ContextSnapshot.objects.using(self.orchestrator.using)
            .filter(pk=snapshot_id)
            .values_list("payload", flat=True)
            .first()
        )
        return payload

    @cached_property
    def input_responses(self) -> dict[str, Any]:
        """What the MCP client answered to the input this task asked for, ``{key: response}``
        (``Paused("waiting_input", input_requests=...)``, docs/mcp-tasks.md); empty until it
        answered. Read on first use, through the orchestrator's ``get_task`` (so a remote
        worker reads it over the API)."""
        task = self.orchestrator.get_task(task_id=self.task.id)
        return task.input_responses if task is not None else {}

    def _ids(self) -> dict[str, Any]:
        return {"task_id": self.task.id, "lease_id": self.lease.id, "worker_id": self.worker_id}

    def heartbeat(self) -> None:
        """Extend the lease now (the worker also does this on its own)."""
        self.orchestrator.heartbeat_lease(**self._ids(), lease_ms=self.lease_ms)

    def report_progress(self, progress: float, message: str | None = None) -> None:
        """Record progress (0.0 to 1.0) and an optional message on the task."""
        self.orchestrator.report_progress(**self._ids(), progress=progress, message=message)

    def cancel(self, reason: str) -> None:
        if not self.cancelled.is_set():
            self.cancel_reason = reason
            self.cancelled.set()

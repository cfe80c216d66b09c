"""Running one claimed task in a worker slot: the handler in a thread of its own, heartbeats
with the worker's lease length, ``timeout_ms`` and the drain deadline enforced, and the outcome
mapped to a transition and reported. A local worker's completions are handed in to its
claimer, which writes them with its next claim (loop.py); ``settle`` then logs and counts
them as ``_report`` would have."""

from __future__ import annotations

import logging
import queue
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone

from ..exceptions import (
    InvalidTransitionError,
    LeaseConflictError,
    LeaseExpiredError,
    ParallelMcpError,
    RecordNotFoundError,
    ValidationError,
)
from ..results import Claim, RemoteClaim
from .context import HandlerContext
from .environment import LocalEnvironment, RemoteEnvironment
from .registry import HandlerRegistry
from .results import Completed, Failed, Paused, Released, as_outcome

logger = logging.getLogger("parallel_mcp.worker")
# Heartbeats: -v 3 only (see management/arguments.py configure_logging).
trace = logging.getLogger("parallel_mcp.worker.trace")

LOST_LEASE = (LeaseConflictError, LeaseExpiredError, RecordNotFoundError)


@dataclass
class WorkerStats:
    claimed: int = 0
    completed: int = 0
    failed: int = 0
    paused: int = 0
    released: int = 0
    lost: int = 0
    counts_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, name: str) -> None:
        with self.counts_lock:
            setattr(self, name, getattr(self, name) + 1)


@dataclass(frozen=True)
class Finished:
    """A plain completion a slot handed in: ``item`` holds ``complete_task``'s arguments (with
    the client token that makes a retried write harmless)."""

    task: Any
    ids: dict[str, Any]
    item: dict[str, Any]
    started: float


class HandlerThread:
    """The thread a slot runs its handlers in, kept from one task to the next (starting a
    thread per task cost ~50 us of CPU, a hand-over ~10). A handler the slot stops waiting for
    (a timeout, a lost lease, a stop) keeps it: the slot then starts another, and this one
    ends when that handler returns."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name=name, daemon=True).start()

    def run(self, call: Callable[[], None]) -> None:
        self._calls.put(call)

    def retire(self) -> None:
        """End the thread once its current call, if any, has returned."""
        self._calls.put(None)

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            call()


class TaskRunner:
    """What a slot does with a claim. ``hard_stop`` and ``drain_deadline`` are the worker's
    stop state: give up at once, or release what still runs at that ``time.monotonic()``.
    ``hand_in`` takes a plain completion for the claimer to write (local workers); without
    it the slot writes its completion itself."""

    def __init__(
        self,
        *,
        orchestrator: Any,
        env: LocalEnvironment | RemoteEnvironment,
        registry: HandlerRegistry,
        worker_id: str,
        lease_ms: int,
        db_retry_attempts: int,
        stats: WorkerStats,
        hard_stop: threading.Event,
        drain_deadline: Callable[[], float | None],
        hand_in: Callable[[Finished], None] | None = None,
    ) -> None:
        self.orchestrator = orchestrator
        self.env = env
        self.registry = registry
        self.worker_id = worker_id
        self.lease_ms = lease_ms
        self.heartbeat_interval = lease_ms / 3 / 1000
        self.db_retry_attempts = db_retry_attempts
        self.stats = stats
        self.hard_stop = hard_stop
        self.drain_deadline = drain_deadline
        self.hand_in = hand_in
        self._slot = threading.local()  # each slot's HandlerThread

    def release_unstarted(self, claim: Claim) -> None:
        """A claim the worker stopped before any slot started it goes back to the queue."""
        if self.hard_stop.is_set():
            return  # giving up at once: its lease expires normally
        ids = {"task_id": claim.task.id, "lease_id": claim.lease.id, "worker_id": self.worker_id}
        reason = "worker stopped before starting it"
        released = self._report(
            "release", lambda: self.orchestrator.release_task(**ids, reason=reason)
        )
        self._count(released, "released")

    def execute(self, claim: Claim) -> None:
        """Run the handler of a claimed task, watch it and report how it ended."""
        task, orch = claim.task, self.orchestrator
        ids = {"task_id": task.id, "lease_id": claim.lease.id, "worker_id": self.worker_id}
        function = self.registry.get(task.kind)
        if function is None:  # cannot happen: we only claim our kinds; give it back anyway
            self._report("release", lambda: orch.release_task(**ids, reason="no handler"))
            return
        try:
            if task.status != "running":  # local claims start the task themselves
                self.env.retry(
                    lambda: orch.mark_task_running(**ids),
                    what="mark running",
                    attempts=self.db_retry_attempts,
                )
        except InvalidTransitionError:
            pass  # a retried call that had already gone through
        except LOST_LEASE as exc:
            logger.info("task %s: lease lost before start (%s)", task.id, exc)
            self.stats.add("lost")
            return
        ctx = HandlerContext(
            orchestrator=orch,
            task=task,
            run=claim.run,
            lease=claim.lease,
            worker_id=self.worker_id,
            lease_ms=self.lease_ms,
            **({"context": claim.context} if isinstance(claim, RemoteClaim) else {}),
        )
        outcome_box: dict[str, Any] = {}
        done = threading.Event()

        def call_handler() -> None:
            try:
                outcome_box["value"] = function(ctx)
            except BaseException as exc:  # noqa: BLE001 - reported as the task's failure
                outcome_box["error"] = exc
                outcome_box["traceback"] = traceback.format_exc()
            finally:
                self.env.close_thread()
                done.set()

        started = time.monotonic()
        deadline = started + task.timeout_ms / 1000 if task.timeout_ms else None
        handlers = self._handler_thread()
        handlers.run(call_handler)
        try:
            self._watch(claim, ctx, ids, outcome_box, done, started, deadline)
        finally:
            if not done.is_set():  # given up on: the handler still runs in that thread
                handlers.retire()
                self._slot.handlers = None

    def _handler_thread(self) -> HandlerThread:
        handlers = getattr(self._slot, "handlers", None)
        if handlers is None:
            handlers = HandlerThread(f"pmcp-handler-{threading.current_thread().name}")
            self._slot.handlers = handlers
        return handlers

    def close_slot(self) -> None:
        """The calling slot is done: its handler thread ends."""
        handlers = getattr(self._slot, "handlers", None)
        if handlers is not None:
            handlers.retire()
            self._slot.handlers = None

    def _watch(
        self,
        claim: Claim,
        ctx: HandlerContext,
        ids: dict[str, Any],
        outcome_box: dict[str, Any],
        done: threading.Event,
        started: float,
        deadline: float | None,
    ) -> None:
        """Heartbeats, ``timeout_ms`` and the stop while the handler runs, then its outcome."""
        task, orch = claim.task, self.orchestrator
        next_heartbeat = started + self.heartbeat_interval
        while not done.wait(self._tick(next_heartbeat, deadline)):
            now = time.monotonic()
            if self.hard_stop.is_set():
                ctx.cancel("worker stopped")
                return  # the lease expires normally
            drain_deadline = self.drain_deadline()
            if drain_deadline is not None and now >= drain_deadline:
                ctx.cancel("worker stopped")
                reason = "worker stopped before the task finished"
                released = self._report(
                    "release", lambda r=reason: orch.release_task(**ids, reason=r)
                )
                if released:
                    _log_done(task, "released", started, reason)
                self._count(released, "released")
                return
            if deadline is not None and now >= deadline:
                ctx.cancel("timeout")
                error = f"TimeoutError: task exceeded timeout_ms={task.timeout_ms}"
                logger.warning("task %s (%s): %s", task.id, task.kind, error)
                failed = self._report(
                    "fail",
                    lambda e=error: orch.fail_task(
                        **ids,
                        error=e,
                        retry=task.max_attempts is not None,
                        client_token=f"{claim.lease.id}:failed",
                    ),
                )
                _log_failure(task, started, error, failed)
                self._count(failed, "failed")
                return
            if now >= next_heartbeat:
                try:
                    lease = self.env.retry(
                        lambda: orch.heartbeat_lease(**ids, lease_ms=self.lease_ms),
                        what="heartbeat",
                        attempts=self.db_retry_attempts,
                    )
                    trace.debug("task %s: heartbeat, lease until %s", task.id, lease.expires_at)
                except LOST_LEASE as exc:
                    ctx.cancel(f"lease lost: {exc.code}")
                    logger.info("task %s: %s; handler told to stop", task.id, exc)
                    self.stats.add("lost")
                    return
                except Exception:
                    logger.exception("task %s: heartbeat failed", task.id)
                next_heartbeat = now + self.heartbeat_interval
        self._finish(claim, ids, outcome_box, started)

    def _tick(self, next_heartbeat: float, deadline: float | None) -> float:
        now = time.monotonic()
        target = next_heartbeat if deadline is None else min(next_heartbeat, deadline)
        return max(0.0, min(target - now, 0.1))

    def _finish(
        self, claim: Claim, ids: dict[str, Any], box: dict[str, Any], started: float
    ) -> None:
        task, orch = claim.task, self.orchestrator
        if "error" in box:
            exc = box["error"]
            error = f"{type(exc).__name__}: {exc}"
            logger.error("task %s (%s) raised:\n%s", task.id, task.kind, box["traceback"])
            failed = self._report(
                "fail",
                lambda: orch.fail_task(
                    **ids,
                    error=error,
                    retry=task.max_attempts is not None,
                    client_token=f"{claim.lease.id}:failed",
                ),
            )
            _log_failure(task, started, error, failed)
            self._count(failed, "failed")
            return
        try:
            outcome = as_outcome(box.get("value"))
        except Exception as exc:  # noqa: BLE001
            outcome = Failed(error=f"{type(exc).__name__}: {exc}")
        if isinstance(outcome, Completed):
            item = {
                **ids,
                "output": outcome.output,
                "metadata": outcome.metadata,
                "next_context": outcome.next_context,
                "next_context_label": outcome.next_context_label,
                "client_token": f"{claim.lease.id}:completed",
            }
            if self.hand_in is not None:
                self.hand_in(Finished(task=task, ids=ids, item=item, started=started))
            elif self._report("complete", lambda: orch.complete_task(**item), ids):
                self._completed(task, started)
        elif isinstance(outcome, Failed):
            failed = self._report(
                "fail",
                lambda: orch.fail_task(
                    **ids,
                    error=outcome.error,
                    retry=outcome.retry,
                    metadata=outcome.metadata,
                    client_token=f"{claim.lease.id}:failed",
                ),
                ids,
            )
            _log_failure(task, started, outcome.error, failed)
            self._count(failed, "failed")
        elif isinstance(outcome, Paused):
            paused = self._report(
                "pause",
                lambda: orch.pause_task(
                    **ids,
                    status=outcome.status,
                    reason=outcome.reason,
                    blocked_by=outcome.blocked_by,
                    input_requests=outcome.input_requests,
                ),
                ids,
            )
            if paused:
                _log_done(task, f"paused ({outcome.status})", started, outcome.reason)
            self._count(paused, "paused")
        elif isinstance(outcome, Released):
            released = self._report(
                "release", lambda: orch.release_task(**ids, reason=outcome.reason), ids
            )
            if released:
                _log_done(task, "released", started, outcome.reason)
            self._count(released, "released")

    def settle(self, finished: Sequence[Finished], results: Sequence[Any]) -> None:
        """What the claimer's write returned for the completions handed in (per item, the
        task or the exception), logged and counted as ``_report`` would have."""
        for entry, result in zip(finished, results, strict=True):
            if isinstance(result, Exception):
                self._refused("complete", result, entry.ids)
            else:
                self._completed(entry.task, entry.started)

    def _completed(self, task: Any, started: float) -> None:
        _log_done(task, "completed", started)
        self.stats.add("completed")

    def _count(self, result: Any, name: str) -> None:
        """Count an outcome that went through (``_report`` returned the task); one that did not
        was counted by ``_refused`` as what it became instead (lost, or failed)."""
        if result is not None:
            self.stats.add(name)

    def _report(self, what: str, call: Any, ids: dict[str, Any] | None = None) -> Any:
        """Send an outcome and return what the call returned (the task, for the per-task log
        lines), or None when it did not go through: a lost lease or a refused result is
        logged, never raised."""
        try:
            return self.env.retry(call, what=what, attempts=self.db_retry_attempts)
        except Exception as exc:  # noqa: BLE001 - every failure is logged for what it is
            self._refused(what, exc, ids)
        return None

    def _refused(self, what: str, exc: Exception, ids: dict[str, Any] | None) -> None:
        if isinstance(exc, LOST_LEASE):
            logger.info("could not %s: %s", what, exc)
            self.stats.add("lost")
        elif isinstance(exc, ValidationError):
            logger.error("handler result refused (%s): %s", what, exc)
            if ids is not None:
                # Unstorable result (non-JSON output, bad pause status, empty error, …): fail
                # the task with the reason rather than leave it to its lease.
                message = f"InvalidResult: {exc}"
                failed = self._report(
                    "fail with the refusal",
                    lambda: self.orchestrator.fail_task(**ids, error=message),
                )
                self._count(failed, "failed")  # the task failed: not paused, nor completed
        elif isinstance(exc, ParallelMcpError):
            logger.warning("could not %s: %s", what, exc)
        else:
            logger.error("could not %s after retries", what, exc_info=exc)


def _log_done(task: Any, what: str, started: float, reason: str | None = None) -> None:
    """The per-task line at ``-v 2``: claimed work ended as ``what``, after how long."""
    logger.debug(
        "task %s (%s) %s after %.3fs%s",
        task.id,
        task.kind,
        what,
        time.monotonic() - started,
        f": {reason}" if reason else "",
    )


def _log_failure(task: Any, started: float, error: str, result: Any) -> None:
    """A failure's line at ``-v 2``, saying whether it is retried (and when) or final."""
    if result is None:
        return  # not recorded: _report has said why
    if result.status == "queued":
        delay = 0
        if result.not_before is not None:
            delay = max(0, round((result.not_before - timezone.now()).total_seconds() * 1000))
        what = f"failed, retried in {delay} ms (attempt {task.attempt_count} of "
        what += f"{task.max_attempts or 'unlimited'})"
    else:
        what = "failed, dead-lettered" if result.dead else "failed"
    _log_done(task, what, started, error)

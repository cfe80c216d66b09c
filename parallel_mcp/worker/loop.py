"""The worker: one claimer per process feeding its free slots.

The claimer (the thread that calls ``run``) knows how many slots are free. When some are, it
claims up to that many tasks (at most ``claim_batch``) of the kinds it has handlers for, in one
call, straight into ``running``, and puts them on a queue; each slot thread takes a claim from
the queue, runs the handler in a thread of its own, heartbeats with the worker's own lease
length, enforces ``timeout_ms``, reports the outcome (completions that finish together are
group-committed), and then counts itself free again, which wakes the claimer. With nothing to
claim, the claimer waits for a wake-up (a freed slot, LISTEN/NOTIFY or SQLite's
``data_version``) or its polling backoff. Stopping drains: no more claims, running tasks get
until the drain timeout, and claims no slot has started go back to the queue."""

from __future__ import annotations

import logging
import os
import queue
import random
import signal
import socket
import threading
import time
import traceback
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from django.utils import timezone

from ..conf import app_settings
from ..contract.limits import MAX_CLAIM_BATCH
from ..exceptions import (
    InvalidTransitionError,
    LeaseConflictError,
    LeaseExpiredError,
    ParallelMcpError,
    RecordNotFoundError,
    ValidationError,
)
from ..ids import new_id
from ..orchestrator import Orchestrator
from ..results import Claim, RemoteClaim
from .batching import CompletionBatcher
from .context import HandlerContext
from .environment import LocalEnvironment, environment_for
from .presence import PresenceReporter
from .registry import HandlerRegistry
from .registry import registry as default_registry
from .results import Completed, Failed, Paused, Released, as_outcome
from .wakeup import idle_wait

logger = logging.getLogger("parallel_mcp.worker")
# Heartbeats: -v 3 only (see management/arguments.py configure_logging).
trace = logging.getLogger("parallel_mcp.worker.trace")

LOST_LEASE = (LeaseConflictError, LeaseExpiredError, RecordNotFoundError)

# pmcp_worker's defaults (measured: docs/workers.md, "Sizing --concurrency").
DEFAULT_CONCURRENCY = 8
DEFAULT_CLAIM_BATCH = 16


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


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


class Worker:
    def __init__(
        self,
        *,
        orchestrator: Orchestrator | None = None,
        registry: HandlerRegistry | None = None,
        concurrency: int = DEFAULT_CONCURRENCY,
        kinds: list[str] | None = None,
        worker_id: str | None = None,
        lease_ms: int | None = None,
        drain_timeout_ms: int = 30_000,
        burst: bool = False,
        poll_min_ms: int = 50,
        poll_max_ms: int = 1_000,
        db_retry_attempts: int = 5,
        listen: bool = True,
        claim_batch: int = DEFAULT_CLAIM_BATCH,
        presence_interval_ms: int | None = None,
    ) -> None:
        self.orchestrator = orchestrator or Orchestrator()
        self.env = environment_for(self.orchestrator)
        self.registry = registry if registry is not None else default_registry
        self.lease_ms = lease_ms if lease_ms is not None else self.orchestrator.default_lease_ms
        _require_positive(self.lease_ms, "lease_ms")
        _require_positive(concurrency, "concurrency")
        if not isinstance(drain_timeout_ms, int) or drain_timeout_ms < 0:
            raise ValidationError(f"drain_timeout_ms must be >= 0, got {drain_timeout_ms!r}.")
        self.concurrency = concurrency
        self.kinds = self._resolve_kinds(kinds)
        self.worker_id = worker_id or default_worker_id()
        self.drain_timeout = drain_timeout_ms / 1000
        self.burst = burst
        self.poll_min = poll_min_ms / 1000
        self.poll_max = max(poll_max_ms, poll_min_ms) / 1000
        self.db_retry_attempts = db_retry_attempts
        self.listen = listen
        _require_positive(claim_batch, "claim_batch")
        # Never more claims in one call than slots are free (nor than one call may make).
        self.claim_batch = min(claim_batch, concurrency, MAX_CLAIM_BATCH)
        # Local workers group-commit completions; remote ones complete one by one.
        self._completer = None if self.env.remote else CompletionBatcher(self._write_completions)
        self.heartbeat_interval = self.lease_ms / 3 / 1000
        self.stats = WorkerStats()
        self.exit_code = 0
        if presence_interval_ms is None:
            presence_interval_ms = app_settings.WORKER_PRESENCE_INTERVAL_MS
        _require_positive(presence_interval_ms, "presence_interval_ms")
        self.presence = PresenceReporter(
            env=self.env,
            fields={
                "process_id": new_id(),  # this run of this process
                "worker_id": self.worker_id,
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "kinds": self.kinds,
                "concurrency": concurrency,
                "interval_ms": presence_interval_ms,
            },
            interval_ms=presence_interval_ms,
        )

        self._stopping = threading.Event()  # drain: stop claiming
        self._hard_stop = threading.Event()  # give up on everything at once
        self._drain_deadline: float | None = None
        self._signals_seen = 0
        # The claimer hands claims to the slots through this queue (None ends a slot) and
        # counts the slots that hold no claim; a slot freed, new work or a stop wakes it.
        self._handoff: queue.SimpleQueue[Claim | None] = queue.SimpleQueue()
        self._free = concurrency
        self._free_lock = threading.Lock()
        self._wake = threading.Event()

    # -- configuration ----------------------------------------------------------------------
    def _resolve_kinds(self, kinds: list[str] | None) -> list[str]:
        available = self.registry.kinds()
        if not available:
            raise ValidationError(
                "No task handlers are registered: add @handler functions to a pmcp_handlers "
                "module of an installed app, or PARALLEL_MCP['HANDLERS']."
            )
        if not kinds:
            return available
        unknown = sorted(set(kinds) - set(available))
        if unknown:
            raise ValidationError(
                f"No handler for kind(s) {', '.join(unknown)}; "
                f"registered kinds: {', '.join(available)}."
            )
        return sorted(set(kinds))

    # -- public control -----------------------------------------------------------------------
    def request_stop(self) -> None:
        """Stop claiming and drain; a second request gives up at once."""
        if self._stopping.is_set():
            self._hard_stop.set()
        else:
            self._drain_deadline = time.monotonic() + self.drain_timeout
            self._stopping.set()
        self._wake.set()

    def install_signal_handlers(self) -> None:
        """SIGTERM/SIGINT drain; a second one exits the process at once (exit code 1);
        leases of tasks still running then expire normally."""

        def handle(signum: int, frame: Any) -> None:
            self._signals_seen += 1
            if self._signals_seen == 1:
                logger.info(
                    "received %s: draining (up to %.1fs); send again to exit now",
                    signal.Signals(signum).name,
                    self.drain_timeout,
                )
                self.request_stop()
            else:
                logger.warning("received %s again: exiting now", signal.Signals(signum).name)
                os._exit(1)

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    def run(self) -> int:
        """Claim and run tasks until stopped (or, with ``burst``, out of work)."""
        logger.info(
            "worker %s started: %d slot(s), kinds %s, lease %d ms, heartbeat every %.1fs",
            self.worker_id,
            self.concurrency,
            ",".join(self.kinds),
            self.lease_ms,
            self.heartbeat_interval,
        )
        self.presence.start()
        listener_stop = threading.Event()
        if self.listen:
            self.env.start_listener(self._wake.set, listener_stop)
        slots = [
            threading.Thread(target=self._slot, name=f"pmcp-slot-{index}", daemon=True)
            for index in range(self.concurrency)
        ]
        for thread in slots:
            thread.start()
        try:
            self._claim_until_stopped()
        finally:
            # Slots still running a task drain it; claims still queued are released (they
            # are ahead of the None that ends each slot).
            self._stopping.set()
            for _ in slots:
                self._handoff.put(None)
            for thread in slots:
                while thread.is_alive():
                    thread.join(0.1)  # in short steps: signals are handled in this thread
            listener_stop.set()
            self.env.close_thread()
            self.presence.stop()
        logger.info("worker %s stopped: %s", self.worker_id, self._summary())
        return self.exit_code

    def _summary(self) -> str:
        s = self.stats
        return (
            f"claimed {s.claimed}, completed {s.completed}, failed {s.failed}, "
            f"paused {s.paused}, released {s.released}, lost {s.lost}"
        )

    # -- the claimer --------------------------------------------------------------------------
    def _claim_until_stopped(self) -> None:
        # Listening workers are woken by their listener (PostgreSQL NOTIFY, the SQLite
        # watcher); otherwise the claimer checks SQLite's data_version itself while idle.
        detector = None if self.listen else self.env.change_detector()
        idle_rounds = 0  # looks in a row that found less than they asked for
        while True:
            self._wake.clear()  # before reading the state: any later change sets it again
            if self._stopping.is_set():
                return
            with self._free_lock:
                free = self._free
            if free == 0:
                self._wake.wait(1.0)  # a slot frees itself, or a stop
                continue
            wanted = min(free, self.claim_batch)
            try:
                claims = self._claim(wanted, check_first=idle_rounds > 0)
            except Exception:
                if self.burst:
                    # A burst run must not report success when it could not even look.
                    logger.exception("claim failed; --burst gives up with exit code 1")
                    self.exit_code = 1
                    return
                logger.exception("claim failed; retrying after a pause")
                idle_rounds += 1
                idle_wait(
                    seconds=self.poll_max, wake=self._wake, stop=self._stopping, detector=None
                )
                continue
            if claims:
                with self._free_lock:
                    self._free -= len(claims)
                for claim in claims:
                    self._handoff.put(claim)
            if len(claims) == wanted:
                idle_rounds = 0
                continue
            if not claims and self.burst and free == self.concurrency:
                # Nothing was running during this look, so no finishing task can have made
                # more work claimable since: there is nothing left to do.
                logger.info("burst: nothing claimable, stopping")
                return
            idle_rounds = idle_rounds + 1 if not claims else 1
            delay = min(self.poll_max, self.poll_min * 2 ** min(idle_rounds - 1, 16))
            idle_wait(
                seconds=delay * random.uniform(0.75, 1.25),
                wake=self._wake,
                stop=self._stopping,
                detector=detector,
            )

    def _claim(self, limit: int, *, check_first: bool) -> list[Claim]:
        """One call that claims up to ``limit`` tasks of our kinds straight into running.
        ``check_first``: the last look came up short, so a read-only look goes first (idle
        workers stay off SQLite's write lock and PostgreSQL's claim index locks)."""
        if check_first and not self.env.retry(
            lambda: self.env.anything_ready(self.kinds),
            what="readiness check",
            attempts=self.db_retry_attempts,
        ):
            return []
        token = f"claim:{uuid.uuid4()}"  # a retry after a lost reply replays this claim
        orch = self.orchestrator

        def call() -> Sequence[Claim | None]:
            if limit == 1:
                return [
                    orch.claim_next_task(
                        worker_id=self.worker_id,
                        lease_ms=self.lease_ms,
                        kinds=self.kinds,
                        client_token=token,
                        start=True,
                    )
                ]
            return orch.claim_next_tasks(
                worker_id=self.worker_id,
                limit=limit,
                lease_ms=self.lease_ms,
                kinds=self.kinds,
                client_token=token,
                start=True,
            )

        found = self.env.retry(call, what="claim", attempts=self.db_retry_attempts)
        claims = [claim for claim in found if claim is not None]
        for claim in claims:
            self.stats.add("claimed")
            task = claim.task
            logger.debug(
                "task %s (%s) claimed: attempt %d of %s, run %s",
                task.id,
                task.kind,
                task.attempt_count,
                task.max_attempts or "unlimited",
                task.run_id,
            )
        return claims

    # -- one slot ---------------------------------------------------------------------------
    def _slot(self) -> None:
        try:
            while (claim := self._handoff.get()) is not None:
                try:
                    if self._stopping.is_set():
                        self._release_unstarted(claim)
                    else:
                        self._execute(claim)
                except Exception:
                    logger.exception("task %s: unexpected worker error", claim.task.id)
                finally:
                    with self._free_lock:
                        self._free += 1
                    self._wake.set()
        finally:
            self.env.close_thread()

    def _release_unstarted(self, claim: Claim) -> None:
        """A claim the worker stopped before any slot started it goes back to the queue."""
        if self._hard_stop.is_set():
            return  # giving up at once: its lease expires normally
        ids = {"task_id": claim.task.id, "lease_id": claim.lease.id, "worker_id": self.worker_id}
        reason = "worker stopped before starting it"
        self._report("release", lambda: self.orchestrator.release_task(**ids, reason=reason))
        self.stats.add("released")

    # -- one task ---------------------------------------------------------------------------
    def _execute(self, claim: Claim) -> None:
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
        runner = threading.Thread(target=call_handler, name=f"pmcp-task-{task.id}", daemon=True)
        runner.start()
        next_heartbeat = started + self.heartbeat_interval
        while not done.wait(self._tick(next_heartbeat, deadline)):
            now = time.monotonic()
            if self._hard_stop.is_set():
                ctx.cancel("worker stopped")
                return  # the lease expires normally
            if self._drain_deadline is not None and now >= self._drain_deadline:
                ctx.cancel("worker stopped")
                reason = "worker stopped before the task finished"
                if self._report("release", lambda r=reason: orch.release_task(**ids, reason=r)):
                    _log_done(task, "released", started, reason)
                self.stats.add("released")
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
                self.stats.add("failed")
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
            self.stats.add("failed")
            return
        try:
            outcome = as_outcome(box.get("value"))
        except Exception as exc:  # noqa: BLE001
            outcome = Failed(error=f"{type(exc).__name__}: {exc}")
        if (
            isinstance(outcome, Completed)
            and self._completer is not None
            and outcome.metadata is None
            and outcome.next_context is None
        ):
            item = {**ids, "output": outcome.output, "client_token": f"{claim.lease.id}:completed"}
            if self._report("complete", lambda: self._submit_completion(item), ids):
                _log_done(task, "completed", started)
                self.stats.add("completed")
        elif isinstance(outcome, Completed):
            ok = self._report(
                "complete",
                lambda: orch.complete_task(
                    **ids,
                    output=outcome.output,
                    metadata=outcome.metadata,
                    next_context=outcome.next_context,
                    next_context_label=outcome.next_context_label,
                    client_token=f"{claim.lease.id}:completed",
                ),
                ids,
            )
            if not ok:
                return
            _log_done(task, "completed", started)
            self.stats.add("completed")
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
            self.stats.add("failed")
        elif isinstance(outcome, Paused):
            paused = self._report(
                "pause",
                lambda: orch.pause_task(
                    **ids,
                    status=outcome.status,
                    reason=outcome.reason,
                    blocked_by=outcome.blocked_by,
                ),
                ids,
            )
            if paused:
                _log_done(task, f"paused ({outcome.status})", started, outcome.reason)
            self.stats.add("paused")
        elif isinstance(outcome, Released):
            released = self._report(
                "release", lambda: orch.release_task(**ids, reason=outcome.reason), ids
            )
            if released:
                _log_done(task, "released", started, outcome.reason)
            self.stats.add("released")

    def _submit_completion(self, item: dict[str, Any]) -> Any:
        assert self._completer is not None  # called only when completions are batched
        result = self._completer.submit(item)
        if isinstance(result, Exception):
            raise result  # this item's own refusal, reported like a single call's
        return result

    def _write_completions(self, items: Any) -> Any:
        """One transaction for every completion queued meanwhile (see batching.py); each
        item carries its client token, so a retried completion never applies twice."""
        # No retry here: each submitter retries its own completion (``_report``).
        if len(items) == 1:
            try:
                return [self.orchestrator.complete_task(**items[0])]
            except ParallelMcpError as exc:
                return [exc]
        assert isinstance(self.env, LocalEnvironment)  # only local workers batch completions
        return self.env.complete_tasks(self.worker_id, items)

    def _report(self, what: str, call: Any, ids: dict[str, Any] | None = None) -> Any:
        """Send an outcome and return what the call returned (the task, for the per-task log
        lines), or None when it did not go through: a lost lease or a refused result is
        logged, never raised."""
        try:
            return self.env.retry(call, what=what, attempts=self.db_retry_attempts)
        except LOST_LEASE as exc:
            logger.info("could not %s: %s", what, exc)
            self.stats.add("lost")
        except ValidationError as exc:
            logger.error("handler result refused (%s): %s", what, exc)
            if ids is not None:
                # Unstorable result (non-JSON output, bad pause status, empty error, …): fail
                # the task with the reason rather than leave it to its lease.
                message = f"InvalidResult: {exc}"
                self._report(
                    "fail with the refusal",
                    lambda: self.orchestrator.fail_task(**ids, error=message),
                )
        except ParallelMcpError as exc:
            logger.warning("could not %s: %s", what, exc)
        except Exception:
            logger.exception("could not %s after retries", what)
        return None


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


def _require_positive(value: Any, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValidationError(f"{name} must be a positive integer, got {value!r}.")

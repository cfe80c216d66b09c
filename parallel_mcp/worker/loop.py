"""The worker: one claimer per process feeding its free slots.

The claimer (the thread that calls ``run``) knows how many slots are free. When some are, it
claims up to that many tasks (at most ``claim_batch``) of the kinds it has handlers for, in one
call, straight into ``running``, and puts them on a queue; each slot thread takes a claim from
the queue and runs it (execution.py: the handler in a thread of its own, heartbeats, timeouts,
the outcome reported), then counts itself free again, which wakes the claimer. A local
worker's slot hands its completion in to the claimer instead of writing it: the claimer writes
the completions handed in since its last write and the claims for the free slots in one
transaction (``services.complete_and_claim``), so a task costs one commit, shared by every
task of the cycle. A run whose row another transaction held is counted by delta row; the
claimer leaves its fold to its next write, which counts the run in place when it gets the row
(absorbing those rows), and folds what is left itself once ``FOLD_GRACE_MS`` has passed, or at
once when a look comes up short (then it looks again), so it never waits for work or stops with
counts to fold. A capped run's fold hands out the slots the write freed: it is due at once,
right after the cycle's claims went to the slots (``Folds.due``). With nothing to claim, the
claimer waits for a wake-up (a freed slot, LISTEN/NOTIFY or SQLite's ``data_version``) or its
polling backoff. Stopping drains: no more claims, running tasks get until the drain timeout
(the claimer writes their completions until the last slot has exited), and claims no slot has
started go back to the queue."""

from __future__ import annotations

import logging
import os
import queue
import random
import signal
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from ..conf import app_settings
from ..contract.limits import MAX_CLAIM_BATCH
from ..exceptions import (
    ValidationError,
)
from ..ids import new_id
from ..orchestrator import Orchestrator
from ..results import Claim
from ..services.write import Folds
from .environment import LocalEnvironment, environment_for
from .execution import Finished, TaskRunner, WorkerStats
from .expiry import run_expiry_loop
from .presence import PresenceReporter
from .registry import HandlerRegistry
from .registry import registry as default_registry
from .wakeup import idle_wait

logger = logging.getLogger("parallel_mcp.worker")

# pmcp_worker's defaults (measured: docs/workers.md, "Sizing --concurrency").
DEFAULT_CONCURRENCY = 8
DEFAULT_CLAIM_BATCH = 16
# Completions one write carries at most (more wait for the next).
MAX_COMPLETION_BATCH = 100
# How long the claimer waits for busy slots to finish before it writes for the free ones:
# slots that finish within this of each other share a transaction (measured: a no-op burn-down
# with 8 slots writes ~7 tasks per cycle instead of ~4; bench/FINDINGS.md).
GATHER_MS = 1
# How long the run counters a write left to fold (delta rows) may wait for the claimer's next
# writes, which may count them in place, before the claimer folds them in a transaction of its
# own (bench/FINDINGS.md, "one task at a time": a fold after every contended cycle cost a fifth
# of the CPU per task with four one-slot processes).
FOLD_GRACE_MS = 20


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


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
        expire_leases: bool = True,
        lease_expiry_interval_ms: int | None = None,
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

        # A local worker expires lapsed leases (any worker's) every interval: the tasks of a
        # worker killed mid-task are retried without a pmcp_expire_leases loop. A remote one
        # cannot (expiry is not an API operation); None: off.
        if lease_expiry_interval_ms is None:
            lease_expiry_interval_ms = app_settings.WORKER_LEASE_EXPIRY_INTERVAL_MS
        if lease_expiry_interval_ms is not None:
            _require_positive(lease_expiry_interval_ms, "lease_expiry_interval_ms")
        self.lease_expiry_interval_ms: int | None = (
            lease_expiry_interval_ms if expire_leases and not self.env.remote else None
        )

        self._stopping = threading.Event()  # drain: stop claiming
        self._hard_stop = threading.Event()  # give up on everything at once
        self._drain_deadline: float | None = None
        self.runner = TaskRunner(
            orchestrator=self.orchestrator,
            env=self.env,
            registry=self.registry,
            worker_id=self.worker_id,
            lease_ms=self.lease_ms,
            db_retry_attempts=db_retry_attempts,
            stats=self.stats,
            hard_stop=self._hard_stop,
            drain_deadline=lambda: self._drain_deadline,
            hand_in=None if self.env.remote else self._hand_in,
        )
        self.heartbeat_interval = self.runner.heartbeat_interval
        self._signals_seen = 0
        # The claimer hands claims to the slots through this queue (None ends a slot) and
        # counts the slots that hold no claim; a slot freed, new work or a stop wakes it.
        self._handoff: queue.SimpleQueue[Claim | None] = queue.SimpleQueue()
        self._free = concurrency
        self._free_lock = threading.Lock()
        self._wake = threading.Event()
        # Completions the slots handed in, for the claimer's next write (under _free_lock).
        self._finished: list[Finished] = []
        # Runs whose delta rows this claimer's writes left for it to fold (claimer only).
        self._folds = Folds()
        self._folds_since = 0.0  # time.monotonic() when _folds last became non-empty

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
        expiry_stop = threading.Event()
        expiry = self._start_lease_expiry(expiry_stop)
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
            if not self._stopping.is_set():  # --burst ended, or the claimer failed
                self.request_stop()
            for _ in slots:
                self._handoff.put(None)
            self._drain(slots)
            self._fold()
            expiry_stop.set()
            if expiry is not None:
                expiry.join()
            listener_stop.set()
            self.env.close_thread()
            self.presence.stop()
        logger.info("worker %s stopped: %s", self.worker_id, self._summary())
        return self.exit_code

    def _start_lease_expiry(self, stop: threading.Event) -> threading.Thread | None:
        interval = self.lease_expiry_interval_ms
        if interval is None:
            return None

        def target() -> None:
            try:
                run_expiry_loop(self.orchestrator, interval_ms=interval, stop=stop)
            finally:
                self.env.close_thread()

        thread = threading.Thread(target=target, name="pmcp-lease-expiry", daemon=True)
        thread.start()
        return thread

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
            if self._folds and not self._fold_due_in():
                self._fold()  # no write of ours counted them in place in time
            self._gather()
            with self._free_lock:
                free = self._free
                finished = self._take_finished()
            if free == 0 and not finished:
                # A slot frees itself, or a stop; counts left to fold are folded meanwhile
                # once they are due.
                if not (self._folds and self._wake.wait(self._fold_due_in())):
                    self._fold()
                    self._wake.wait(1.0)
                continue
            wanted = min(free, self.claim_batch)
            try:
                claims = self._cycle(finished, wanted, check_first=idle_rounds > 0)
            except Exception as exc:
                refusal = self.env.refusal(exc)
                if refusal is not None:
                    logger.error(
                        "the API refused this worker's claim: %s; stopping with exit code 1 "
                        "(check the token, its permissions and --api)",
                        refusal,
                    )
                    self.exit_code = 1
                    return
                if self.burst:
                    # A burst run must not report success when it could not even look.
                    logger.exception("claim failed; --burst gives up with exit code 1")
                    self.exit_code = 1
                    return
                logger.exception("claim failed; retrying after a pause")
                idle_rounds += 1
                self._fold()
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
            if finished or self._folds:
                # What these completions made ready (dependents, a capped run's free slots)
                # became claimable when they committed, after this cycle's claim, or does when
                # their fold commits (it hands out the slots of a capped run): look again.
                self._fold()
                idle_rounds = 1
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

    def _gather(self) -> None:
        """Some slots are free while others still run: give those a moment (``GATHER_MS``)
        to finish too, so that one write carries their completions and claims as well."""
        with self._free_lock:
            if not 0 < self._free < self.concurrency:
                return
        until = time.monotonic() + GATHER_MS / 1000
        while (left := until - time.monotonic()) > 0 and not self._stopping.is_set():
            self._wake.clear()
            with self._free_lock:
                if self._free == self.concurrency:
                    return
            self._wake.wait(left)
        self._wake.clear()

    def _hand_in(self, finished: Finished) -> None:
        """A slot's completion, for the claimer's next write (the slot then frees itself and
        wakes the claimer)."""
        with self._free_lock:
            self._finished.append(finished)

    def _take_finished(self) -> list[Finished]:
        """The completions handed in so far, at most one write's worth (hold _free_lock)."""
        taken = self._finished[:MAX_COMPLETION_BATCH]
        del self._finished[:MAX_COMPLETION_BATCH]
        return taken

    def _drain(self, slots: list[threading.Thread]) -> None:
        """Write the completions of the slots still draining until the last has exited."""
        while True:
            alive = any(thread.is_alive() for thread in slots)
            with self._free_lock:
                finished = self._take_finished()
            if finished:
                try:
                    self._cycle(finished, 0, check_first=False)
                except Exception:
                    logger.exception("could not write completions while stopping")
            elif not alive:
                return
            else:
                self._wake.wait(0.1)  # in short steps: signals are handled in this thread
                self._wake.clear()

    def _cycle(self, finished: list[Finished], limit: int, *, check_first: bool) -> list[Claim]:
        """One write: the completions handed in and up to ``limit`` claims. Without
        completions to write, ``check_first`` (the last look came up short) makes a read-only
        look go first, so idle workers stay off SQLite's write lock and PostgreSQL's claim
        index locks."""
        if not finished:
            return self._claim(limit, check_first=check_first) if limit else []
        assert isinstance(self.env, LocalEnvironment)  # only local slots hand completions in
        env = self.env
        items = [entry.item for entry in finished]
        token = f"claim:{uuid.uuid4()}"  # a retry after a lost reply replays the claims

        def call() -> tuple[list[Any], list[Claim]]:
            return env.complete_and_claim(
                worker_id=self.worker_id,
                items=items,
                limit=limit,
                lease_ms=self.lease_ms,
                kinds=self.kinds,
                client_token=token,
                folds=self._folds,
            )

        had_folds = bool(self._folds)
        try:
            # Each item carries its client token: a retried write never applies one twice.
            results, claims = env.retry(
                call, what="complete and claim", attempts=self.db_retry_attempts
            )
        except Exception as exc:
            self.runner.settle(finished, [exc] * len(finished))
            raise
        if self._folds and not had_folds:
            self._folds_since = time.monotonic()
        self.runner.settle(finished, results)
        return self._took(claims)

    def _fold_due_in(self) -> float:
        """Seconds until the counts left to fold are due (0: due now)."""
        if self._folds.due:  # a capped run's freed slots wait for its fold
            return 0.0
        return max(0.0, self._folds_since + FOLD_GRACE_MS / 1000 - time.monotonic())

    def _fold(self) -> None:
        """Fold the runs this claimer's writes counted by delta row and no later write of its
        own counted in place. A fold that fails is left to the lease-expiry pass (which folds
        delta rows older than a second)."""
        if not self._folds:
            return
        assert isinstance(self.env, LocalEnvironment)  # only local cycles leave folds
        env = self.env
        run_ids = sorted(self._folds)
        self._folds.clear()
        try:
            self.env.retry(
                lambda: env.fold_runs(run_ids),
                what="fold run counters",
                attempts=self.db_retry_attempts,
            )
        except Exception:
            logger.exception("could not fold the counters of %d run(s)", len(run_ids))

    def _claim(self, limit: int, *, check_first: bool) -> list[Claim]:
        """One call that claims up to ``limit`` tasks of our kinds straight into running."""
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
        return self._took([claim for claim in found if claim is not None])

    def _took(self, claims: list[Claim]) -> list[Claim]:
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
                        self.runner.release_unstarted(claim)
                    else:
                        self.runner.execute(claim)
                except Exception:
                    logger.exception("task %s: unexpected worker error", claim.task.id)
                finally:
                    with self._free_lock:
                        self._free += 1
                    self._wake.set()
        finally:
            self.runner.close_slot()
            self.env.close_thread()


def _require_positive(value: Any, name: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValidationError(f"{name} must be a positive integer, got {value!r}.")

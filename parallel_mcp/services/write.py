"""The unit every write goes through.

``write(using=…, now=…)`` opens one transaction; inside it a service locks the run (always the
run before its tasks), applies guarded updates, and records events and counter changes on the
``Write``. On exit the run counters and derived status are written, the event rows appended
(with a ``run.status.changed`` event when the status moved) and, after commit only, the
``event_recorded`` signal is sent.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db import connections, transaction
from django.db.models import Q

from ..actors import current_principal
from ..exceptions import RecordNotFoundError
from ..models import Event, Run, Task
from ..signals import event_recorded
from ..states import derive_run_status
from .gate import write_transaction

# Writers hold this advisory lock in shared mode from their first event insert until commit;
# readers of the event feed take it exclusively for an instant, so on PostgreSQL they never
# see a later event id while an earlier one is still uncommitted (see docs/events.md).
EVENT_FENCE_LOCK_KEY = 0x706D6370  # "pmcp"

# Channel of the NOTIFY that wakes idle workers (parallel_mcp.worker.wakeup listens).
WAKE_CHANNEL = "parallel_mcp"

COUNTER_FIELDS = ("active", "waiting", "stuck", "completed", "failed", "cancelled", "inflight")


class Write:
    def __init__(self, *, using: str, now: datetime) -> None:
        self.using = using
        self.now = now
        self.actor = current_principal()  # recorded on every event of this write
        self.events: list[Event] = []
        self.locked_runs: dict[UUID, Run] = {}
        self.deltas: dict[UUID, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.touched_runs: set[UUID] = set()
        self.work_ready = False
        self.changed_runs: set[UUID] = set()

    # -- locking ---------------------------------------------------------------------------
    def lock_run(self, run_id: UUID) -> Run:
        """The run row, locked for this transaction (PostgreSQL) — always before its tasks."""
        run = self.locked_runs.get(run_id)
        if run is None:
            run = (
                Run.objects.using(self.using)
                .select_for_update(no_key=True)
                .filter(pk=run_id)
                .first()
            )
            if run is None:
                raise RecordNotFoundError(f"Run {run_id} does not exist.", run_id=run_id)
            self.locked_runs[run_id] = run
        return run

    def lock_run_of_task(self, task_id: UUID) -> tuple[Run, Task]:
        """Lock the task's run, then read the task (run before task, always)."""
        run = (
            Run.objects.using(self.using)
            .select_for_update(no_key=True)
            .filter(pk__in=Task.objects.using(self.using).filter(pk=task_id).values("run_id"))
            .first()
        )
        if run is None:
            raise RecordNotFoundError(f"Task {task_id} does not exist.", task_id=task_id)
        self.locked_runs.setdefault(run.pk, run)
        task = Task.objects.using(self.using).select_for_update(no_key=True).get(pk=task_id)
        return self.locked_runs[run.pk], task

    # -- recording ---------------------------------------------------------------------------
    def event(
        self,
        event_type: str,
        *,
        run_id: UUID,
        task_id: UUID | None = None,
        attempt_id: UUID | None = None,
        payload: dict[str, Any] | None = None,
    ) -> None:
        self.events.append(
            Event(
                run_id=run_id,
                task_id=task_id,
                attempt_id=attempt_id,
                event_type=event_type,
                payload=payload or {},
                created_at=self.now,
                actor=self.actor,
            )
        )

    def count(self, run_id: UUID, **deltas: int) -> None:
        """Move tasks between the run's counters (the run must be locked)."""
        assert run_id in self.locked_runs, "lock the run before changing its counters"
        for name, delta in deltas.items():
            if name != "total" and name not in COUNTER_FIELDS:
                raise KeyError(name)
            self.deltas[run_id][name] += delta

    def move(self, run_id: UUID, source: str, target: str) -> None:
        if source != target:
            self.count(run_id, **{source: -1, target: +1})

    def ready(self, run_id: UUID | None = None) -> None:
        """Some task (of ``run_id``) may have become claimable: wake idle workers after
        commit, and hand free max_parallel slots to ready tasks."""
        self.work_ready = True
        if run_id is not None:
            self.changed_runs.add(run_id)

    def touch(self, run_id: UUID) -> None:
        """Bump the run's updated_at even if no counter changes."""
        self.touched_runs.add(run_id)

    # -- flushing ----------------------------------------------------------------------------
    def flush(self) -> None:
        for run_id in sorted(set(self.deltas) | self.touched_runs | self.changed_runs):
            run = self.locked_runs[run_id]
            self._apply_run(run, self.deltas.get(run_id, {}))
            if run.max_parallel is not None:
                self._hand_out_slots(run)
        if self.events:
            self._insert_events()
        if self.work_ready and connections[self.using].vendor == "postgresql":
            # NOTIFY is transactional: delivered on commit, dropped on rollback.
            with connections[self.using].cursor() as cursor:
                cursor.execute("SELECT pg_notify(%s, '')", [WAKE_CHANNEL])

    def _apply_run(self, run: Run, deltas: dict[str, int]) -> None:
        if run.max_parallel is None:
            deltas = {name: delta for name, delta in deltas.items() if name != "inflight"}
        for name, delta in deltas.items():
            if delta:
                attribute = f"tasks_{name}"
                setattr(run, attribute, getattr(run, attribute) + delta)
        old_status = run.status
        new_status = derive_run_status(
            cancel_requested=run.cancel_requested_at is not None, counts=run.counts
        )
        run.status = new_status
        run.updated_at = self.now
        fields = ["status", "updated_at", *(f"tasks_{name}" for name in deltas)]
        Run.objects.using(self.using).filter(pk=run.pk).update(
            **{name: getattr(run, name) for name in fields}
        )
        if new_status != old_status:
            self.event(
                "run.status.changed",
                run_id=run.pk,
                payload={"from": str(old_status), "to": str(new_status)},
            )

    def _hand_out_slots(self, run: Run) -> None:
        """Keep ``inflight + claimable queued tasks <= max_parallel`` for the run, the free
        slots going to its best ready tasks that are due (priority, then age). Claims then
        need no run lock: each takes a slot that was handed out here, under the run lock.

        A holder a claim has locked right now is skipped (SKIP LOCKED), never waited for: that
        claim holds the task and waits for this transaction's run lock. It counts as in flight.
        """
        assert run.max_parallel is not None  # flush() hands out slots for such runs only
        ready = Task.objects.using(self.using).filter(
            run_id=run.pk, status="queued", unmet_dependencies=0
        )
        holders = set(ready.filter(claimable=True).values_list("id", flat=True))
        lockable = (
            set(
                ready.filter(pk__in=holders)
                .select_for_update(skip_locked=True, no_key=True)
                .values_list("id", flat=True)
            )
            if holders
            else set()
        )
        being_claimed = holders - lockable
        free = max(0, run.max_parallel - run.tasks_inflight - len(being_claimed))
        due = ready.exclude(pk__in=being_claimed).filter(
            Q(not_before__isnull=True) | Q(not_before__lte=self.now)
        )
        best = set(
            due.order_by("-priority", "created_at", "id").values_list("id", flat=True)[:free]
        )
        demote = lockable - best
        promote = best - holders
        if demote:
            Task.objects.using(self.using).filter(pk__in=demote).update(claimable=False)
        if promote:
            Task.objects.using(self.using).filter(pk__in=promote).update(claimable=True)
            self.work_ready = True

    def _insert_events(self) -> None:
        connection = connections[self.using]
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_advisory_xact_lock_shared(%s)", [EVENT_FENCE_LOCK_KEY])
        Event.objects.using(self.using).bulk_create(self.events)
        if event_recorded.receivers:
            events = list(self.events)
            transaction.on_commit(lambda: send_event_signals(events), using=self.using)


def send_event_signals(events: list[Event]) -> None:
    # send_robust: a receiver's exception is logged by django.dispatch and never propagates.
    for event in events:
        event_recorded.send_robust(sender=Event, event=event)


@contextmanager
def write(*, using: str, now: datetime) -> Iterator[Write]:
    with write_transaction(using):
        unit = Write(using=using, now=now)
        yield unit
        unit.flush()

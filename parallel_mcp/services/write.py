"""The unit every write goes through: one transaction, static SQL, its events.

How it works, and why (run counters apart, lock order): docs/internals.md, "The write unit".
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Iterator, Sequence
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from functools import cache
from typing import Any
from uuid import UUID

from django.db import connections, transaction
from django.db.models import Model

from ..actors import current_principal
from ..exceptions import RecordNotFoundError
from ..models import Event, Run, RunDelta, Task
from ..models.run_deltas import DELTA_COUNTERS
from ..models.tasks import CLAIM_ORDER_SQL
from ..signals import event_recorded
from ..states import TaskStatus, derive_run_status
from .chain import WAKE, WAKE_CHANNEL, Deferred, Main
from .chain import statements as chained
from .dialect import (
    Dialect,
    columns,
    dialect_for,
    field_assignments,
    instances,
    typed_columns,
)
from .gate import write_transaction
from .statements import Later, Result, Rows, Statements

# The event fence: writers hold it shared from their event insert until commit, readers of the
# event feed exclusively for an instant (docs/events.md).
EVENT_FENCE_LOCK_KEY = 0x706D6370  # "pmcp"

# SQLite's default limit on a statement's parameters (SQLITE_MAX_VARIABLE_NUMBER, 3.32+):
# multi-row INSERTs are cut into statements below it.
MAX_PARAMETERS = 32_766

# An event row's columns (see Dialect.rows).
EVENT_COLUMNS = typed_columns(
    Event, ("run_id", "task_id", "attempt_id", "event_type", "payload", "created_at", "actor")
)

# A run's writer lock (PostgreSQL), a two-key advisory lock: completions hold it shared, writes
# that lock the run row exclusively (docs/internals.md, "The writer lock and the lock order").
RUN_LOCK_NAMESPACE = 0x706D6372  # "pmcr"
RUN_LOCK_KEY = "hashtext(CAST({} AS text))"

# CTEs that delete the delta rows of the runs of a ``locked`` CTE before them and sum them per
# run (``sums``); DELTA_SUMS selects the sums, in DELTA_COUNTERS' order.
FOLD_DELTAS = (
    "folded AS (DELETE FROM pmcp_run_delta WHERE run_id IN (SELECT id FROM locked) RETURNING "
    f"run_id, {', '.join(DELTA_COUNTERS)}), sums AS (SELECT run_id, "
    f"{', '.join(f'SUM({name})::integer AS {name}' for name in DELTA_COUNTERS)} "
    "FROM folded GROUP BY run_id)"
)
DELTA_SUMS = ", ".join(f"sums.{name}" for name in DELTA_COUNTERS)

# A guard statement's first term where its runs' writer locks ride in its statement
# (``Write.send_guard``): a one-time filter, evaluated before the statement reads a row.
HELD = "(SELECT count(*) FROM gates) >= 0 AND "

# A delta row's columns (see Dialect.rows); the counters in DELTA_COUNTERS' order.
DELTA_COLUMNS = typed_columns(RunDelta, ("run_id", *DELTA_COUNTERS, "created_at"))


@dataclass
class RunLocks:
    """The results of ``Write.send_lock_runs``, read by ``Write.adopt_runs``."""

    runs: Rows | None  # per run: see the statement's ``shape``
    # "rows" (SQLite), "gated" (a write, PostgreSQL), "counting" (a completion, PostgreSQL)
    # or "folded" (a fold)
    shape: str
    folded: Result | None = None  # a write's absorbed delta rows (PostgreSQL)
    rows: tuple[str, list[Any], bool] | None = None  # a completion's (send_guard)


@dataclass
class PendingEvent:
    event_type: str
    run_id: UUID
    task_id: UUID | None
    attempt_id: UUID | None
    payload: dict[str, Any] = field(default_factory=dict)


class Write:
    def __init__(
        self,
        *,
        using: str,
        now: datetime,
        db: Statements,
        outermost: bool,
        lock: tuple[str, list[Any]] | None = None,
    ) -> None:
        self.using = using
        self.now = now
        self.db = db
        self.d: Dialect = dialect_for(using)
        self.outermost = outermost
        self.lock = lock  # taken by the write's first statement (``write(lock=…)``)
        self.counted_runs: set[UUID] = set()  # runs counted by delta row (writer lock shared)
        self.late_runs: set[UUID] = set()  # runs a context move locks late (lock_late_runs)
        self.folds_due: list[UUID] = []  # runs to fold after the commit
        # Counted runs with max_parallel: their fold hands out the slots this write freed
        # (``Folds.due``).
        self.capped_counted: set[UUID] = set()
        self.moved: dict[UUID, set[str]] = defaultdict(set)  # counter columns to write per run
        self.actor = current_principal()  # recorded on every event of this write
        self.events: list[PendingEvent] = []
        self.locked_runs: dict[UUID, Run] = {}
        self.deltas: dict[UUID, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.touched_runs: set[UUID] = set()
        self.work_ready = False
        self.changed_runs: set[UUID] = set()
        self.context_moved: set[UUID] = set()  # runs whose current snapshot this write moves
        self.deferred: list[Deferred] = []
        # Rows to insert with the flush, one multi-row INSERT per table: (table, columns).
        self.rows: dict[tuple[str, tuple[tuple[str, str], ...]], list[Sequence[Any]]] = {}

    # -- locking ---------------------------------------------------------------------------
    def send_lock_runs(
        self,
        run_ids: Sequence[UUID] = (),
        *,
        of_tasks: Sequence[UUID] = (),
        counters_only: bool = False,
        moves_context: bool = False,
    ) -> RunLocks:
        """Queue the statements that lock runs (by id, or the runs of ``of_tasks``), in id
        order, before any task; ``adopt_runs`` reads their results. ``counters_only``: the
        caller changes nothing of these runs but their counters (and ``updated_at``, and their
        context when ``moves_context``): where the dialect counts apart, the guard's statement
        takes them (``send_guard``). A ``max_parallel`` run's slots are handed out with its
        counters."""
        d = self.d
        if of_tasks:
            in_sql, params = d.uuids(of_tasks)
            where = f"id IN (SELECT run_id FROM pmcp_task WHERE id {in_sql})"
        else:
            in_sql, params = d.uuids(run_ids)
            where = f"id {in_sql}"
        if not d.defers_counters:
            # SQLite: the database's write lock already serializes every write.
            return RunLocks(
                self.db.send(
                    f"SELECT {columns(Run)} FROM pmcp_run WHERE {where} ORDER BY id{d.lock_rows}",
                    params,
                ),
                "rows",
            )
        if counters_only and self.outermost:
            # Nothing sent yet: the writer locks and the rows ride in the guard's statement
            # (``send_guard``). Counting apart needs a commit of its own before the fold: an
            # outermost write only.
            return RunLocks(None, "counting", rows=(where, params, moves_context))
        # The writer locks first, exclusive, in key order, then the row locks, in id order.
        key = RUN_LOCK_KEY.format("id")
        runs = self.db.send(
            f"WITH gates AS MATERIALIZED (SELECT id, pg_advisory_xact_lock(%s, {key}) IS NULL "
            f"FROM (SELECT id FROM pmcp_run WHERE {where} ORDER BY {key}, id) AS r), "
            f"locked AS MATERIALIZED (SELECT {columns(Run)} FROM pmcp_run "
            f"WHERE id IN (SELECT id FROM gates) ORDER BY id{d.lock_rows}) "
            f"SELECT true, locked.id, NULL, {columns(Run, 'locked.')} FROM locked",
            [RUN_LOCK_NAMESPACE, *params],
        )
        # A statement of its own, so that its snapshot is taken once the locks are held: it
        # then sees every delta row a committed completion of the run left.
        folded = self.db.send(
            f"DELETE FROM pmcp_run_delta WHERE run_id IN (SELECT id FROM pmcp_run WHERE "
            f"{where}) RETURNING run_id, {', '.join(DELTA_COUNTERS)}",
            params,
        )
        return RunLocks(runs, "gated", folded)

    def held(self, locks: RunLocks) -> str:
        """The term (with its ``AND``) that each data-modifying statement of a guard puts
        first in its ``WHERE``, so that it runs only once the writer locks of ``locks`` are
        held (``send_guard``); "" where no lock rides in the guard's statement."""
        return HELD if locks.shape == "counting" else ""

    def send_guard(
        self, locks: RunLocks, guard: Sequence[tuple[str, str]], params: list[Any], rows: str
    ) -> Rows:
        """Send a guard: ``guard`` its statements in order, each (a name, its SQL, the
        ``held`` term first in its ``WHERE``), with ``params``, and ``rows`` the SELECT of
        what it returns over them; the runs' rows come back through ``locks``. A completion's
        carries its runs' locks (docs/internals.md, "A guard's statement")."""
        term = self.held(locks)
        assert all(term in sql for _, sql in guard), "each guard statement waits for the locks"
        if locks.rows is None:
            if len(guard) == 1:
                return self.db.send(guard[0][1], params)
            ctes = ", ".join(f"{name} AS ({sql})" for name, sql in guard)
            return self.db.send(f"WITH {ctes} {rows}", params)
        where, run_params, moves_context = locks.rows
        key = RUN_LOCK_KEY.format("id")
        alone = " AND (SELECT COUNT(*) FROM runs) = 1" if moves_context else ""
        ctes = "".join(f"{name} AS ({sql}), " for name, sql in guard)
        result = self.db.send(
            f"WITH gates AS MATERIALIZED (SELECT id, pg_advisory_xact_lock_shared(%s, {key}) "
            f"IS NULL FROM (SELECT id FROM pmcp_run WHERE {where} ORDER BY {key}, id) AS r), "
            f"{ctes}guarded AS MATERIALIZED ({rows}), "
            "runs AS MATERIALIZED (SELECT id, max_parallel FROM pmcp_run "
            "WHERE (SELECT count(*) FROM guarded) >= 0 AND id IN (SELECT id FROM gates)), "
            f"locked AS MATERIALIZED (SELECT {columns(Run)} FROM pmcp_run WHERE id IN "
            f"(SELECT id FROM runs){alone} ORDER BY id{self.d.skip_locked}), "
            f"{FOLD_DELTAS}, counted AS (SELECT locked.id IS NOT NULL, runs.id, "
            f"runs.max_parallel IS NOT NULL, {columns(Run, 'locked.')}, {DELTA_SUMS} "
            "FROM runs LEFT JOIN locked ON locked.id = runs.id "
            "LEFT JOIN sums ON sums.run_id = runs.id) "
            "SELECT counted.*, guarded.* FROM counted FULL JOIN guarded ON false",
            [RUN_LOCK_NAMESPACE, *run_params, *params],
        )
        # Each row a run's (see adopt_runs) or, its run id NULL, one of the guard's.
        width = 3 + len(Run._meta.concrete_fields) + len(DELTA_COUNTERS)
        fetched = cache(result.fetchall)
        locks.runs = Later(lambda: [row[:width] for row in fetched() if row[1] is not None])
        return Later(lambda: [row[width:] for row in fetched() if row[1] is None])

    def send_fold_locks(self, run_ids: Sequence[UUID], *, sync_off: bool) -> RunLocks:
        """A fold's (or a context move's late) statement (PostgreSQL): the rows locked in id
        order, never the writer locks, their delta rows deleted and summed (missing those
        committed meanwhile: their completions' own folds come after); ``sync_off``: its
        commit made asynchronous."""
        where, params = self.d.uuids(run_ids)
        sync = " AND set_config('synchronous_commit', 'off', true) IS NOT NULL" if sync_off else ""
        runs = self.db.send(
            f"WITH locked AS MATERIALIZED (SELECT {columns(Run)} FROM pmcp_run "
            f"WHERE id {where}{sync} ORDER BY id{self.d.lock_rows}), "
            f"{FOLD_DELTAS} SELECT {columns(Run, 'locked.')}, {DELTA_SUMS} "
            "FROM locked LEFT JOIN sums ON sums.run_id = locked.id ORDER BY locked.id",
            params,
        )
        return RunLocks(runs, "folded")

    def adopt_runs(self, locks: RunLocks) -> None:
        assert locks.runs is not None, "a completion's runs come back with its guard"
        rows = locks.runs.fetchall()
        folded: dict[UUID, dict[str, int]] = {}
        width = len(DELTA_COUNTERS)
        if locks.shape in ("gated", "counting"):
            # (row locked, run id, capped (counting), the run's columns if locked[, its delta
            # sums])
            late = locks.rows is not None and locks.rows[2]
            for row_locked, run_id, capped, *_ in rows:
                if row_locked:
                    continue
                (self.late_runs if late else self.counted_runs).add(run_id)
                if capped and not late:
                    self.capped_counted.add(run_id)
            rows = [row[3:] for row in rows if row[0]]
        if locks.shape in ("counting", "folded"):
            for row in rows:
                if row[-width] is not None:
                    folded[row[0]] = dict(zip(DELTA_COUNTERS, row[-width:], strict=True))
            rows = [row[:-width] for row in rows]
        for run in instances(Run, self.using, rows):
            self.locked_runs.setdefault(run.pk, run)
        if locks.folded is not None:
            for run_id, *values in locks.folded.fetchall():
                sums = folded.setdefault(run_id, dict.fromkeys(DELTA_COUNTERS, 0))
                for name, value in zip(DELTA_COUNTERS, values, strict=True):
                    sums[name] += value
        for run_id in sorted(folded):
            self._fold(self.locked_runs[run_id], folded[run_id])

    def lock_late_runs(self) -> None:
        """Wait for the runs a context move did not get in its first round trip: one more."""
        if self.late_runs:
            run_ids = sorted(self.late_runs)
            self.late_runs.clear()
            with self.db.batch():
                locks = self.send_fold_locks(run_ids, sync_off=False)
            self.adopt_runs(locks)

    def lock_run(self, run_id: UUID) -> Run:
        """The run row, locked for this transaction — always before its tasks."""
        run = self.locked_runs.get(run_id)
        if run is None:
            assert run_id not in self.counted_runs, "a counted run cannot be locked after"
            with self.db.batch():
                locks = self.send_lock_runs([run_id])
            self.adopt_runs(locks)
            run = self.locked_runs.get(run_id)
            if run is None:
                raise RecordNotFoundError(f"Run {run_id} does not exist.", run_id=run_id)
        return run

    def lock_run_of_task(self, task_id: UUID) -> tuple[Run, Task]:
        """Lock the task's run, then the task (run before task, always)."""
        with self.db.batch():
            runs = self.send_lock_runs(of_tasks=[task_id])
            task_rows = self.db.send(
                f"SELECT {columns(Task)} FROM pmcp_task WHERE id = %s{self.d.lock_rows}",
                [self.d.uuid(task_id)],
            )
        self.adopt_runs(runs)
        tasks = instances(Task, self.using, task_rows.fetchall())
        if not tasks or tasks[0].run_id not in self.locked_runs:
            raise RecordNotFoundError(f"Task {task_id} does not exist.", task_id=task_id)
        return self.locked_runs[tasks[0].run_id], tasks[0]

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
        self.events.append(PendingEvent(event_type, run_id, task_id, attempt_id, payload or {}))

    def count(self, run_id: UUID, **deltas: int) -> None:
        """Move tasks between the run's counters (the run must be locked, or counted)."""
        assert run_id in self.locked_runs or run_id in self.counted_runs, (
            "lock the run before changing its counters"
        )
        for name, delta in deltas.items():
            if name not in DELTA_COUNTERS:
                raise KeyError(name)
            self.deltas[run_id][name] += delta

    def move(self, run_id: UUID, source: str, target: str, count: int = 1) -> None:
        if source != target:
            self.count(run_id, **{source: -count, target: +count})

    def ready(self, run_id: UUID) -> None:
        """Some task of ``run_id`` may have become claimable: wake idle workers after commit,
        and hand free max_parallel slots to ready tasks."""
        self.work_ready = True
        self.changed_runs.add(run_id)

    def touch(self, run_id: UUID) -> None:
        """Bump the run's updated_at even if no counter changes."""
        self.touched_runs.add(run_id)

    def update(self, model: type[Model], ids: Sequence[UUID], **fields: Any) -> None:
        """``fields`` written on the rows ``ids`` of ``model`` (no guard: for rows this write
        has locked or owns, e.g. counters and flags beside a guarded transition)."""
        assignments, params = field_assignments(model, self.using, fields)
        in_sql, in_params = self.d.uuids(ids)
        self.db.send(
            f"UPDATE {model._meta.db_table} SET {assignments} WHERE id {in_sql}",
            [*params, *in_params],
        )

    def defer(self, sql: str, params: list[Any], *, wakes: bool = False) -> None:
        """A write whose result nobody reads: sent with the flush, in its batch, chained with
        the others on PostgreSQL (chain.py: it must read no table the write's other deferred
        statements change). ``wakes``: wake idle workers when it changed a row."""
        self.deferred.append(Deferred(sql, params, wakes))

    def insert(self, table: str, row_columns: tuple[tuple[str, str], ...], *rows: Sequence[Any]):
        """Rows inserted with the flush, with the other rows of their table in one statement
        (``row_columns`` as for ``Dialect.rows``, values adapted by the caller)."""
        self.rows.setdefault((table, row_columns), []).extend(rows)

    def insert_saved(self, instance: Model) -> None:
        """A saved instance (every concrete field set: ``saved_instance``) inserted with the
        flush, as by ``insert``."""
        self.insert(*self._saved_row(instance))

    def insert_new(self, instance: Model) -> bool:
        """A saved instance whose id the caller chose, inserted now unless the id is taken;
        whether it was. ``ON CONFLICT (id) DO NOTHING``: a twin inserting the same id at the
        same moment waits for it and is then skipped, never an IntegrityError (any other
        constraint still raises)."""
        table, row_columns, row = self._saved_row(instance)
        names, source, params = next(self._chunks(row_columns, [row]))
        inserted = self.db.send(
            f"INSERT INTO {table} ({names}) {source} ON CONFLICT (id) DO NOTHING RETURNING id",
            params,
        )
        return bool(inserted.fetchall())

    def _saved_row(self, instance: Model) -> tuple[str, tuple[tuple[str, str], ...], list[Any]]:
        model = type(instance)
        row_columns = typed_columns(model)
        fields = model._meta.concrete_fields
        values = [instance.__dict__[field.attname] for field in fields]
        row = [self.d.adapt(kind, v) for (_, kind), v in zip(row_columns, values, strict=True)]
        return model._meta.db_table, row_columns, row

    def move_context(self, run: Run, snapshot_id: UUID) -> None:
        """The run's current context snapshot becomes ``snapshot_id`` (written by the run's
        update in the flush)."""
        run.current_context_snapshot_id = snapshot_id
        self.context_moved.add(run.pk)
        self.touch(run.pk)

    # -- flushing ----------------------------------------------------------------------------
    def flush(self) -> None:
        run_ids = sorted(set(self.deltas) | self.touched_runs | self.changed_runs)
        runs = [self.locked_runs[run_id] for run_id in run_ids if run_id in self.locked_runs]
        updates = []
        for run in runs:
            self._fold(run, self.deltas.get(run.pk, {}))
            updates.append(self._run_update(run))
            if run.max_parallel is not None:
                # After this write's own statements: the hand-out counts what they changed.
                self.defer(*hand_out_sql(self.d, run.pk, run.max_parallel, self.now))
        when = self.d.when(self.now)
        for run_id in run_ids:
            if run_id not in self.locked_runs:
                assert run_id in self.counted_runs, "lock the run before changing it"
                deltas = self.deltas.get(run_id, {})
                row = [deltas.get(name, 0) for name in DELTA_COUNTERS]
                self.insert(RunDelta._meta.db_table, DELTA_COLUMNS, [run_id, *row, when])
                self.folds_due.append(run_id)
        commit = self.outermost and self.d.vendor == "postgresql"
        deferred = [*self._rows(), *self.deferred, *(Deferred(*update) for update in updates)]
        self.deferred.clear()
        mains = self._events() if self.events else []
        notify = self.work_ready and self.d.vendor == "postgresql"
        with self.db.batch():
            # Rows, deferred statements and run updates chained (chain.py), the first events'
            # insert ending the chain; NOTIFY is transactional: delivered on commit.
            sent = chained(self.d, deferred, notify=notify, main=mains[0] if mains else None)
            results = [self.db.send(sql, params) for sql, params in sent]
            events = results[-1:] if mains else []
            events += [self.db.send(*main.render()) for main in mains[1:]]
            if commit:
                # The COMMIT rides in the batch: one round trip for the lot. Django's own
                # commit at the end of the atomic block then finds nothing left to do.
                self.db.connection.connection.commit()
        if mains and event_recorded.receivers:
            self._signal(events)

    def _rows(self) -> list[Deferred]:
        """The rows inserted with the flush, one statement per table (and per chunk)."""
        statements = [
            Deferred(f"INSERT INTO {table} ({names}) {source}", params)
            for (table, row_columns), rows in self.rows.items()
            for names, source, params in self._chunks(row_columns, rows)
        ]
        self.rows.clear()
        return statements

    def _chunks(
        self, row_columns: tuple[tuple[str, str], ...], rows: Sequence[Sequence[Any]]
    ) -> Iterator[tuple[str, str, list[Any]]]:
        """An insert's rows in chunks below the parameter limit: per chunk the column list,
        the rows' source (``Dialect.rows``) and its parameters."""
        names = ", ".join(name for name, _ in row_columns)
        per_statement = MAX_PARAMETERS // len(row_columns)
        for start in range(0, len(rows), per_statement):
            yield names, *self.d.rows(row_columns, rows[start : start + per_statement])

    def _fold(self, run: Run, deltas: dict[str, int]) -> None:
        """Add counter changes to a locked run (a delta row's, or this write's own), derive
        its status, and record ``run.status.changed`` when it moved: the one place counters
        and status are applied, written by ``_run_update`` at the flush."""
        for name, delta in deltas.items():
            if delta:
                attribute = f"tasks_{name}"
                setattr(run, attribute, getattr(run, attribute) + delta)
                self.moved[run.pk].add(attribute)
        old_status = run.status
        new_status = derive_run_status(
            cancel_requested=run.cancel_requested_at is not None, counts=run.counts
        )
        run.status = new_status
        run.updated_at = self.now
        self.touched_runs.add(run.pk)
        if new_status != old_status:
            self.event(
                "run.status.changed",
                run_id=run.pk,
                payload={"from": str(old_status), "to": str(new_status)},
            )

    def _run_update(self, run: Run) -> tuple[str, list[Any]]:
        assignments = ["status = %s", "updated_at = %s"]
        params: list[Any] = [str(run.status), self.d.when(self.now)]
        for attribute in sorted(self.moved.get(run.pk, ())):
            assignments.append(f"{attribute} = %s")
            params.append(getattr(run, attribute))
        if run.pk in self.context_moved:
            assignments.append("current_context_snapshot_id = %s")
            params.append(self.d.uuid(run.current_context_snapshot_id))
        params.append(self.d.uuid(run.pk))
        return f"UPDATE pmcp_run SET {', '.join(assignments)} WHERE id = %s", params

    def _events(self) -> list[Main]:
        """The events' insert (one statement per chunk of rows). On PostgreSQL each is gated
        by the event-feed fence, taken after every row lock of this write and before the
        first event id is drawn: a one-time filter runs before any row is numbered."""
        d = self.d
        fence = "pg_advisory_xact_lock_shared(%s)" if d.vendor == "postgresql" else ""
        returning = " RETURNING id" if event_recorded.receivers else ""
        when = d.when(self.now)
        rows = [
            (
                d.uuid(event.run_id),
                d.uuid(event.task_id),
                d.uuid(event.attempt_id),
                event.event_type,
                event.payload,
                when,
                self.actor,
            )
            for event in self.events
        ]
        mains = []
        for names, source, params in self._chunks(EVENT_COLUMNS, rows):
            if fence:
                source = f"SELECT * FROM ({source}) AS e WHERE {{gate}} IS NOT NULL"
            sql = f"INSERT INTO pmcp_event ({names}) {source}{returning}"
            mains.append(Main(sql, params, fence, [EVENT_FENCE_LOCK_KEY] if fence else []))
        return mains

    def _signal(self, results: list[Result]) -> None:
        # The rows are inserted in order (VALUES, or jsonb_to_recordset's array order).
        ids = sorted(row[0] for result in results for row in result.fetchall())
        events = [
            Event(
                id=event_id,
                run_id=event.run_id,
                task_id=event.task_id,
                attempt_id=event.attempt_id,
                event_type=event.event_type,
                payload=event.payload,
                created_at=self.now,
                actor=self.actor,
            )
            for event_id, event in zip(ids, self.events, strict=True)
        ]
        transaction.on_commit(lambda: send_event_signals(events), using=self.using)


def hand_out_sql(d: Dialect, run_id: UUID, max_parallel: int, now: datetime) -> tuple[str, list]:
    """The slot hand-out of a ``max_parallel`` run, one statement sent under the run's lock:
    keep ``in flight + claimable ready tasks <= max_parallel``, the free slots going to the
    run's best ready tasks that are due (docs/internals.md, "The slot hand-out")."""
    run = d.uuid(run_id)
    when = d.when(now)
    # Literal conditions, never a parameter for claimable (a partial index's, see docs).
    holding = f"run_id = %s AND {d.claim_ready}"
    waiting = f"run_id = %s AND {d.slot_waiting}"
    due = "(not_before IS NULL OR not_before <= %s)"
    order = CLAIM_ORDER_SQL
    # A (run, status) range each, never ``status IN (…)`` (docs/internals.md).
    count = "(SELECT COUNT(*) FROM pmcp_task WHERE run_id = %s AND status = '{}')"
    in_flight_sql = f"({count.format(TaskStatus.LEASED)} + {count.format(TaskStatus.RUNNING)})"
    others = (
        f"SELECT id, priority, created_at FROM pmcp_task WHERE {waiting} AND {due} "
        f"ORDER BY {order} LIMIT %s"
    )
    if d.vendor == "postgresql":
        sql = (
            f"WITH holders AS (SELECT id FROM pmcp_task WHERE {holding}), "
            "lockable AS (SELECT id, priority, created_at, not_before FROM pmcp_task "
            f"WHERE {holding}{d.skip_locked}), "
            "best AS (SELECT id FROM (SELECT id, priority, created_at FROM lockable "
            f"WHERE {due} UNION ALL ({others})) AS c ORDER BY {order} "
            f"LIMIT GREATEST(0, %s - {in_flight_sql} - (SELECT COUNT(*) FROM holders) "
            "+ (SELECT COUNT(*) FROM lockable))), "
            # An array of ids: each looked up by its key, whatever the holders' number.
            "moved AS (UPDATE pmcp_task SET claimable = (id IN (SELECT id FROM best)) "
            "WHERE id = ANY(ARRAY(SELECT id FROM lockable UNION ALL SELECT id FROM best)) "
            "AND claimable <> (id IN (SELECT id FROM best)) RETURNING claimable) "
            f"{WAKE} WHERE EXISTS (SELECT 1 FROM moved WHERE claimable)"
        )
        params = [run, run, when, run, when, max_parallel, max_parallel, run, run, WAKE_CHANNEL]
        return sql, params
    # SQLite: this write holds the database's only write lock, nothing is being claimed.
    sql = (
        "WITH holders AS (SELECT id, priority, created_at, not_before FROM pmcp_task "
        f"WHERE {holding}), "
        "best AS MATERIALIZED (SELECT id FROM (SELECT id, priority, created_at FROM holders "
        f"WHERE {due} UNION ALL SELECT * FROM ({others})) ORDER BY {order} "
        f"LIMIT max(0, %s - {in_flight_sql})) "
        "UPDATE pmcp_task SET claimable = (id IN best) "
        "WHERE id IN (SELECT id FROM holders UNION ALL SELECT id FROM best) "
        "AND claimable <> (id IN best)"
    )
    params = [run, when, run, when, max_parallel, max_parallel, run, run]
    return sql, params


def send_event_signals(events: list[Event]) -> None:
    # send_robust: a receiver's exception is logged by django.dispatch and never propagates.
    for event in events:
        event_recorded.send_robust(sender=Event, event=event)


class Folds(set[UUID]):
    """The runs whose delta rows a caller folds itself, later (``write(folds=…)``: the
    worker's cycle), and, in ``capped``, which of them have ``max_parallel``: their fold hands
    out the slots the write freed, so it is ``due`` at once."""

    def __init__(self, runs: Iterable[UUID] = ()) -> None:
        super().__init__(runs)
        self.capped: set[UUID] = set()

    @property
    def due(self) -> bool:
        return not self.capped.isdisjoint(self)

    def clear(self) -> None:
        super().clear()
        self.capped.clear()


@contextmanager
def write(
    *,
    using: str,
    now: datetime,
    folds: Folds | None = None,
    lock: tuple[str, list[Any]] | None = None,
) -> Iterator[Write]:
    """The write unit (see docs/internals.md). ``lock``: a lock (a select item calling a lock
    function, and its parameters) taken by the write's first statement."""
    connection = connections[using]
    outermost = not connection.in_atomic_block
    # The prelude's settings last to the end of the transaction: only one of our own.
    settings = dialect_for(using).write_prelude if outermost else ""
    items = [item for item in (settings, lock[0] if lock else "") if item]
    prelude = (f"SELECT {', '.join(items)}", lock[1] if lock else []) if items else None
    with (
        write_transaction(using),
        closing(Statements(connection, prelude, outermost=outermost)) as db,
    ):
        unit = Write(using=using, now=now, db=db, outermost=outermost, lock=lock)
        yield unit
        unit.flush()
    if folds is not None:  # the caller folds later; a write that locked a run absorbed its rows
        folds.difference_update(unit.locked_runs)
        folds.update(unit.folds_due)
        folds.capped.update(unit.capped_counted)
    elif unit.folds_due:
        # Committed: fold before the call returns, so its caller reads exact counters.
        fold_runs(using=using, run_ids=unit.folds_due, now=now)


def fold_runs(*, using: str, run_ids: Sequence[UUID], now: datetime) -> None:
    """Fold the runs' delta rows into their counters, one run per transaction, as every write
    that locks a run does; its commit is asynchronous (docs/internals.md, docs/lifecycle.md)."""
    for run_id in sorted(set(run_ids)):
        with write(using=using, now=now) as w:
            w.adopt_runs(w.send_fold_locks([run_id], sync_off=w.outermost))

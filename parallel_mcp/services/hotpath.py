"""Static SQL for the hot path: claim (one or a batch, optionally straight into ``running``),
complete and heartbeat.

The ORM versions in ``leases.py`` / ``outcomes.py`` stay the reference and handle every
uncommon case; the functions here cover the common one in a few prepared statements per
vendor and return ``None`` (after rolling back) when the case is not theirs:

- a run with ``max_parallel`` (slot hand-out lives in ``write.py``),
- a completion with ``metadata``/``next_context``, of a task that blocks others
  (``pause_task(blocked_by=…)``), or one whose fence check fails (the ORM path then raises
  the precise error, or replays a client token).

Every write here is still one transaction that appends its events, keeps the run counters
and the dependents' ``unmet_dependencies`` exact, and takes the PostgreSQL event fence right
before the event insert. Everything that needs no lock (ids, timestamps, JSON, SQL text) is
prepared before the transaction starts, so on SQLite the write lock is held for the
statements alone.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connections, transaction
from django.db.models import Model, Q
from django.db.models.fields.related import RelatedField
from django.db.models.sql import Query

from ..actors import current_principal
from ..ids import new_id
from ..models import Attempt, Event, Lease, Task
from ..models.tasks import CLAIM_READY
from ..signals import event_recorded
from ..states import TaskCounts, derive_run_status
from .gate import write_transaction
from .statements import statements
from .write import EVENT_FENCE_LOCK_KEY, WAKE_CHANNEL, send_event_signals

# _claim_rows builds these positionally.
assert [f.attname for f in Attempt._meta.concrete_fields] == [
    "id", "run_id", "task_id", "worker_id", "status", "leased_at", "started_at", "ended_at",
    "lease_expires_at", "error", "output", "metadata",
]  # fmt: skip
assert [f.attname for f in Lease._meta.concrete_fields] == [
    "id", "run_id", "task_id", "attempt_id", "worker_id", "status", "acquired_at", "expires_at",
    "heartbeat_at", "released_at", "client_token", "principal",
]  # fmt: skip


class NotHandled(Exception):
    """Roll back: this case belongs to the ORM path."""


# -- per-vendor plumbing ------------------------------------------------------------------------


@dataclass(frozen=True)
class Dialect:
    vendor: str
    uuid: Callable[[UUID | None], Any]
    when: Callable[[datetime | None], Any]
    json_cast: str  # placeholder for a JSON parameter
    lock_candidates: str  # suffix of the candidate SELECT
    claim_ready: str  # CLAIM_READY, the claim index's predicate, as this Django writes it

    def in_list(self, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """``IN (...)`` for a list of parameters (``= ANY`` keeps PostgreSQL's plan cached)."""
        if self.vendor == "postgresql":
            return "= ANY(%s)", [list(values)]
        return f"IN ({', '.join(['%s'] * len(values))})", list(values)


@cache
def dialect(vendor: str, using: str) -> Dialect | None:
    connection = connections[using]
    if vendor == "sqlite":
        import sqlite3

        if sqlite3.sqlite_version_info < (3, 35, 0):  # no RETURNING before 3.35
            return None
        adapt = connection.ops.adapt_datetimefield_value
        if _utc_text_timestamps(connection):
            # What Django's adapter returns for an aware datetime (naive UTC, str()), without
            # its per-call settings look-ups; our timestamps are always aware.
            def adapt(value: datetime | None) -> str | None:
                if value is None:
                    return None
                return str(value.astimezone(UTC).replace(tzinfo=None))

        return Dialect(
            vendor=vendor,
            uuid=lambda value: value.hex if value is not None else None,
            when=adapt,
            json_cast="%s",
            lock_candidates="",
            claim_ready=literal_condition(connection, CLAIM_READY),
        )
    if vendor == "postgresql":
        return Dialect(
            vendor=vendor,
            uuid=lambda value: value,
            when=lambda value: value,
            json_cast="%s::jsonb",
            lock_candidates=" FOR NO KEY UPDATE SKIP LOCKED",
            claim_ready=literal_condition(connection, CLAIM_READY),
        )
    return None


def dialect_for(using: str) -> Dialect | None:
    return dialect(connections[using].vendor, using)


def literal_condition(connection: Any, condition: Q) -> str:
    """``condition`` (on Task) as SQL with its values written in, as Django writes a partial
    index's predicate: a static query that repeats an index's condition this way matches it
    term by term. Values, not parameters: PostgreSQL cannot prove a partial index from a
    parameter in a generic plan, and SQLite re-prepares a statement for every new value of a
    parameter its choice of index depends on."""
    query = Query(model=Task, alias_cols=False)
    compiler = query.get_compiler(connection=connection)
    sql, params = query.build_where(condition).as_sql(compiler, connection)
    quote = connection.schema_editor().quote_value
    return sql % tuple(quote(param) for param in params)


def _utc_text_timestamps(connection: Any) -> bool:
    """SQLite stores naive UTC text timestamps (USE_TZ on, no per-database TIME_ZONE)."""
    return bool(settings.USE_TZ) and connection.settings_dict.get("TIME_ZONE") is None


def _json(value: Any) -> str | None:
    # JSONField stores Python None as SQL NULL.
    return None if value is None else json.dumps(value)


@cache
def _columns(model: type[Model], prefix: str = "") -> str:
    names = []
    for field in model._meta.concrete_fields:
        assert field.column is not None  # a concrete field is one with a column
        names.append(prefix + field.column)
    return ", ".join(names)


@cache
def _attnames(model: type[Model]) -> tuple[str, ...]:
    """The concrete fields' attnames, in column order: ``from_db`` names what it is given."""
    return tuple(field.attname for field in model._meta.concrete_fields)


@cache
def _converters(model: type[Model], using: str) -> list[tuple[int, Callable[[Any], Any]]]:
    """Per column that needs one, a function turning the value read back into what Django's
    compiler would produce (its backend and field converters, or a faster equivalent for
    SQLite's text timestamps and hex UUIDs)."""
    connection = connections[using]
    table = model._meta.db_table
    fast_sqlite = connection.vendor == "sqlite" and _utc_text_timestamps(connection)
    result: list[tuple[int, Callable[[Any], Any]]] = []
    for index, field in enumerate(model._meta.concrete_fields):
        kind = (
            field.target_field if isinstance(field, RelatedField) else field
        ).get_internal_type()
        if fast_sqlite and kind == "DateTimeField":
            result.append((index, _sqlite_datetime))
            continue
        if fast_sqlite and kind == "UUIDField":
            result.append((index, _sqlite_uuid))
            continue
        column = field.get_col(table)
        chain = connection.ops.get_db_converters(column) + column.get_db_converters(connection)
        if chain:
            result.append((index, _chained(chain, column, connection)))
    return result


def _chained(chain: list[Any], column: Any, connection: Any) -> Callable[[Any], Any]:
    def convert(value: Any) -> Any:
        for converter in chain:
            value = converter(value, column, connection)
        return value

    return convert


def _sqlite_datetime(value: Any) -> datetime | None:
    # Stored as naive UTC text ("YYYY-MM-DD HH:MM:SS[.ffffff]") when USE_TZ is on.
    if value is None or isinstance(value, datetime):
        return value if value is None or value.tzinfo else value.replace(tzinfo=UTC)
    return datetime.fromisoformat(value).replace(tzinfo=UTC)


def _sqlite_uuid(value: Any) -> UUID | None:
    return None if value is None else UUID(value)


def _instances(model: type[Model], using: str, rows: Sequence[Sequence[Any]]) -> list[Any]:
    converters = _converters(model, using)
    instances = []
    for row in rows:
        values = list(row)
        for index, convert in converters:
            values[index] = convert(values[index])
        instances.append(model.from_db(using, _attnames(model), values))
    return instances


# -- events ---------------------------------------------------------------------------------------


@dataclass
class PendingEvent:
    event_type: str
    run_id: UUID
    task_id: UUID | None
    attempt_id: UUID | None
    payload: dict[str, Any]


def _insert_events(cursor: Any, d: Dialect, using: str, events: list[PendingEvent], now) -> None:
    if d.vendor == "postgresql":
        # The event-feed fence (see write.py): taken after every row lock of this write.
        cursor.execute("SELECT pg_advisory_xact_lock_shared(%s)", [EVENT_FENCE_LOCK_KEY])
    want_ids = bool(event_recorded.receivers)
    actor = current_principal()
    row = f"(%s, %s, %s, %s, {d.json_cast}, %s, %s)"
    params: list[Any] = []
    for event in events:
        params += [
            d.uuid(event.run_id),
            d.uuid(event.task_id),
            d.uuid(event.attempt_id),
            event.event_type,
            json.dumps(event.payload),
            d.when(now),
            actor,
        ]
    cursor.execute(
        "INSERT INTO pmcp_event (run_id, task_id, attempt_id, event_type, payload, created_at, "
        f"actor) VALUES {', '.join([row] * len(events))}" + (" RETURNING id" if want_ids else ""),
        params,
    )
    if want_ids:
        ids = [row[0] for row in cursor.fetchall()]
        # SQLite and PostgreSQL return the rows of a multi-row VALUES in order.
        saved = [
            Event(
                id=event_id,
                run_id=event.run_id,
                task_id=event.task_id,
                attempt_id=event.attempt_id,
                event_type=event.event_type,
                payload=event.payload,
                created_at=now,
                actor=actor,
            )
            for event_id, event in zip(sorted(ids), events, strict=True)
        ]
        transaction.on_commit(lambda: send_event_signals(saved), using=using)


_RUN_COUNTERS = (
    "status, cancel_requested_at, tasks_total, tasks_active, tasks_waiting, tasks_stuck, "
    "tasks_completed, tasks_failed, tasks_cancelled"
)


def _principal_fence(principal: str | None) -> tuple[str, list[Any]]:
    if principal is None:
        return "", []
    return " AND lease_principal = %s", [principal]


def _status_change(
    row: Sequence[Any], run_id: UUID, events: list[PendingEvent], **deltas: int
) -> str | None:
    """The run status implied by ``row`` (id, ``_RUN_COUNTERS``) with ``deltas`` applied to its
    counters, when it differs from the stored one (recording ``run.status.changed``)."""
    _, old_status, cancel_requested_at, *values = row
    counts = dict(
        zip(
            ("total", "active", "waiting", "stuck", "completed", "failed", "cancelled"),
            values,
            strict=True,
        )
    )
    for name, delta in deltas.items():
        counts[name] += delta
    new_status = str(
        derive_run_status(
            cancel_requested=cancel_requested_at is not None, counts=TaskCounts(**counts)
        )
    )
    if new_status == old_status:
        return None
    events.append(
        PendingEvent(
            "run.status.changed", run_id, None, None, {"from": old_status, "to": new_status}
        )
    )
    return new_status


# -- enqueue one task -----------------------------------------------------------------------------

_TERMINAL_RUN = "('completed', 'failed', 'cancelled')"


def enqueue_one(*, using: str, run_id: UUID, spec: dict[str, Any], now: datetime) -> Task | None:
    """Insert one validated task without dependencies, explicit id or snapshot into a run
    without max_parallel; None (after rolling back) when the ORM path must do it, which then
    also raises the precise error (unknown or terminal run, duplicate key)."""
    d = dialect_for(using)
    if d is None:
        return None
    when = d.when(now)
    run = d.uuid(run_id)
    task_id = new_id()
    connection = connections[using]
    try:
        with write_transaction(using), statements(connection) as db:
            with db.batch():
                # The run first (lock order run -> task), counting the new task in.
                counted = db.send(
                    "UPDATE pmcp_run SET tasks_total = tasks_total + 1, "
                    "tasks_active = tasks_active + 1, updated_at = %s "
                    f"WHERE id = %s AND status NOT IN {_TERMINAL_RUN} AND max_parallel IS NULL "
                    f"RETURNING id, {_RUN_COUNTERS}",
                    [when, run],
                )
                inserted = db.send(
                    "INSERT INTO pmcp_task (id, run_id, key, kind, status, priority, "
                    "max_attempts, attempt_count, retry_delay_ms, retry_backoff, "
                    "retry_max_delay_ms, timeout_ms, not_before, input, metadata, progress, "
                    "context_snapshot_id, dead, claimable, pending_blockers, blocks_others, "
                    "unmet_dependencies, failed_dependencies, created_at, updated_at) "
                    "SELECT %s, id, %s, %s, 'queued', %s, %s, 0, %s, %s, %s, %s, %s, "
                    f"{d.json_cast}, {d.json_cast}, 0.0, current_context_snapshot_id, "
                    "%s, %s, 0, %s, 0, 0, %s, %s FROM pmcp_run "
                    f"WHERE id = %s AND status NOT IN {_TERMINAL_RUN} AND max_parallel IS NULL "
                    f"RETURNING {_columns(Task)}",
                    [
                        d.uuid(task_id),
                        spec["key"],
                        spec["kind"],
                        spec["priority"],
                        spec["max_attempts"],
                        spec["retry_delay_ms"],
                        spec["retry_backoff"],
                        spec["retry_max_delay_ms"],
                        spec["timeout_ms"],
                        d.when(spec["not_before"]),
                        _json(spec["input"]),
                        _json(spec["metadata"]),
                        False,
                        True,
                        False,
                        when,
                        when,
                        run,
                    ],
                )
            row = counted.fetchone()
            rows = inserted.fetchall()
            if row is None or not rows:
                raise NotHandled
            task = _instances(Task, using, rows)[0]
            events = [
                PendingEvent(
                    "task.enqueued",
                    run_id,
                    task.pk,
                    None,
                    {
                        "kind": task.kind,
                        "key": task.key,
                        "priority": task.priority,
                        "depends_on": [],
                        "not_before": task.not_before.isoformat() if task.not_before else None,
                    },
                )
            ]
            with db.batch():
                new_status = _status_change(row, run_id, events)  # counters already written
                if new_status is not None:
                    db.send("UPDATE pmcp_run SET status = %s WHERE id = %s", [new_status, run])
                _insert_events(db, d, using, events, now)
                if d.vendor == "postgresql":
                    db.send("SELECT pg_notify(%s, '')", [WAKE_CHANNEL])
    except NotHandled:
        return None
    task._depends_on_cache = []
    return task

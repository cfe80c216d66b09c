"""What the write path's static SQL needs to know of each database, in one place: values
adapted, the constructs that differ, rows read back into instances (docs/internals.md).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from functools import cache
from typing import Any
from uuid import UUID

from django.conf import settings
from django.db import connections
from django.db.models import Field, Model, Q
from django.db.models.base import ModelState
from django.db.models.fields.related import RelatedField
from django.db.models.sql import Query

from ..models import Task
from ..models.tasks import CLAIM_READY, SLOT_WAITING

SQLITE_MINIMUM = (3, 35, 0)  # UPDATE … RETURNING


class UnsupportedDatabase(Exception):
    """A database parallel_mcp cannot write to (system check E004 says so at start-up)."""


@dataclass(frozen=True)
class Dialect:
    vendor: str
    uuid: Callable[[UUID | None], Any]
    when: Callable[[datetime | None], Any]
    json_cast: str  # placeholder for a JSON parameter
    lock_rows: str  # suffix of a SELECT that locks the rows it reads (runs, then tasks)
    skip_locked: str  # suffix of the claim's candidate SELECT: never wait for another claim
    claim_ready: str  # CLAIM_READY, the claim index's predicate, as this Django writes it
    slot_waiting: str  # SLOT_WAITING, likewise
    same: str  # equality that holds for two NULLs
    timestamp: str  # placeholder for a datetime parameter where no column types it
    # Whether a write whose only effect on a run is its counters leaves them in a delta row
    # (docs/lifecycle.md): not where one writer at a time pays a second durable commit.
    defers_counters: bool
    # Whether data-modifying statements may be sub-statements (CTEs) of one statement, so
    # that statements in a row go as one (chain.py, the guards that record client tokens).
    chains: bool
    # Selected first in an outermost write's transaction, with its lock if it has one
    # (``write(lock=…)``); "" for none. PostgreSQL: keep the generic plans (docs/internals.md).
    write_prelude: str

    def adapt(self, kind: str, value: Any) -> Any:
        """A value for a column of PostgreSQL type ``kind``, as ``rows`` takes it."""
        if kind == "uuid":
            return self.uuid(value)
        if kind == "timestamptz":
            return self.when(value)
        return value

    def in_list(self, values: Sequence[Any]) -> tuple[str, list[Any]]:
        """``IN (...)`` for a list of parameters (``= ANY`` keeps PostgreSQL's plan cached)."""
        if self.vendor == "postgresql":
            return "= ANY(%s)", [list(values)]
        return f"IN ({', '.join(['%s'] * len(values))})", list(values)

    def uuids(self, values: Sequence[UUID]) -> tuple[str, list[Any]]:
        if self.vendor == "postgresql":
            return "= ANY(%s)", [uuid_array(values)]
        return self.in_list([self.uuid(value) for value in values])

    def uuid_pairs(
        self, first: str, second: str, pairs: Sequence[tuple[UUID, UUID]]
    ) -> tuple[str, list[Any]]:
        """``(first, second)`` is one of ``pairs`` (distinct first values); on PostgreSQL as
        arrays, one statement text whatever their number."""
        if self.vendor == "postgresql":
            firsts = uuid_array([a for a, _ in pairs])
            seconds = uuid_array([b for _, b in pairs])
            position = f"array_position(%s::uuid[], {first})"  # the pair's own second value
            return f"{first} = ANY(%s) AND {second} = (%s::uuid[])[{position}]", [
                firsts, seconds, firsts
            ]  # fmt: skip
        # SQLite finds a row value by no index of one column: the first values find the rows.
        ids_sql, ids = self.uuids([a for a, _ in pairs])
        values = ", ".join(["(%s, %s)"] * len(pairs))
        params = [value for a, b in pairs for value in (self.uuid(a), self.uuid(b))]
        return f"{first} {ids_sql} AND ({first}, {second}) IN (VALUES {values})", [*ids, *params]

    def rows(
        self, columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]
    ) -> tuple[str, list[Any]]:
        """Rows for ``INSERT INTO t (<the columns' names>) <source>``: ``columns`` are (name,
        PostgreSQL type) pairs, a row's values adapted by ``uuid`` and ``when`` except for
        ``jsonb`` columns, which take the Python value. On PostgreSQL one JSON parameter
        (``jsonb_to_recordset``), elsewhere ``VALUES (…), (…)``."""
        if self.vendor == "postgresql":
            names = [name for name, _ in columns]
            definition = ", ".join(f"{name} {kind}" for name, kind in columns)
            document = json.dumps(
                [dict(zip(names, row, strict=True)) for row in _as_text(columns, rows)],
                default=str,
            )
            return f"SELECT * FROM jsonb_to_recordset(%s::jsonb) AS v({definition})", [document]
        json_columns = [index for index, (_, kind) in enumerate(columns) if kind == "jsonb"]
        params: list[Any] = []
        for row in rows:
            values = list(row)
            for index in json_columns:
                values[index] = json_param(values[index])
            params += values
        row_sql = "(" + ", ".join(["%s"] * len(columns)) + ")"
        return "VALUES " + ", ".join([row_sql] * len(rows)), params

    def by_id(
        self, ids: Sequence[UUID], values: Sequence[Any], placeholder: str = "%s"
    ) -> tuple[str, list[Any]]:
        """A value per row of a multi-row UPDATE: one parameter when they are all alike,
        else ``CASE id WHEN … THEN … END``."""
        if len(set(map(repr, values))) <= 1:
            return placeholder, [values[0] if values else None]
        cases = " ".join([f"WHEN %s THEN {placeholder}"] * len(ids))
        params = [
            p for key, value in zip(ids, values, strict=True) for p in (self.uuid(key), value)
        ]
        return f"(CASE id {cases} END)", params


# Django's field types as PostgreSQL names them (the column types of ``Dialect.rows``).
PG_TYPES = {
    "UUIDField": "uuid",
    "CharField": "text",
    "TextField": "text",
    "IntegerField": "integer",
    "PositiveIntegerField": "integer",
    "BigIntegerField": "bigint",
    "FloatField": "double precision",
    "BooleanField": "boolean",
    "DateTimeField": "timestamptz",
    "JSONField": "jsonb",
}


@cache
def typed_columns(
    model: type[Model], attnames: tuple[str, ...] | None = None
) -> tuple[tuple[str, str], ...]:
    """(column, PostgreSQL type) of ``model``'s fields of ``attnames`` (default: every
    concrete field, in order), as ``Dialect.rows`` takes them."""
    meta = model._meta
    fields: Sequence[Any] = (
        meta.concrete_fields if attnames is None else [meta.get_field(a) for a in attnames]
    )
    return tuple((str(field.column), PG_TYPES[_internal_type(field)]) for field in fields)


def _internal_type(field: Any) -> str:
    """A field's internal type; a foreign key's is its target's."""
    return (field.target_field if isinstance(field, RelatedField) else field).get_internal_type()


def uuid_array(values: Sequence[UUID]) -> str:
    """A ``uuid[]`` parameter for PostgreSQL, as the array's text, which psycopg sends untyped
    and the server reads as the ``uuid[]`` its place needs (``= ANY(%s)``, ``%s::uuid[]``)."""
    return "{" + ",".join([_uuid_text(value) or "NULL" for value in values]) + "}"


def _uuid_text(value: UUID | str | None) -> str | None:
    """A UUID as PostgreSQL reads it from text (an array's, a JSON document's): its 32 hex
    digits. A str is parsed first, so it can never be array or JSON syntax."""
    if isinstance(value, UUID):
        return value.hex
    return None if value is None else UUID(str(value)).hex


def _as_text(
    columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]
) -> Sequence[Sequence[Any]]:
    """The rows with their ``uuid`` and ``timestamptz`` columns' values as text, before
    ``json.dumps`` (each distinct timestamp converted once); ``jsonb`` values are left to it."""
    uuids = [index for index, (_, kind) in enumerate(columns) if kind == "uuid"]
    times = [index for index, (_, kind) in enumerate(columns) if kind == "timestamptz"]
    if not uuids and not times:
        return rows
    texts: dict[datetime, str] = {}
    result = []
    for row in rows:
        values = list(row)
        for index in uuids:
            values[index] = _uuid_text(values[index])
        for index in times:
            value = values[index]
            if isinstance(value, datetime):
                text = texts.get(value)
                if text is None:
                    text = texts[value] = str(value)
                values[index] = text
        result.append(values)
    return result


@cache
def _dialect(vendor: str, using: str) -> Dialect:
    connection = connections[using]
    if vendor == "sqlite":
        import sqlite3

        if sqlite3.sqlite_version_info < SQLITE_MINIMUM:
            raise UnsupportedDatabase(
                f"parallel_mcp needs SQLite {'.'.join(map(str, SQLITE_MINIMUM))} or newer, "
                f"this Python has {sqlite3.sqlite_version}."
            )
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
            lock_rows="",  # BEGIN IMMEDIATE already holds the database's write lock
            skip_locked="",
            claim_ready=literal_condition(connection, CLAIM_READY),
            slot_waiting=literal_condition(connection, SLOT_WAITING),
            same="IS",
            timestamp="%s",
            defers_counters=False,
            chains=False,
            write_prelude="",
        )
    if vendor == "postgresql":
        return Dialect(
            vendor=vendor,
            uuid=lambda value: value,
            when=lambda value: value,
            json_cast="%s::jsonb",
            lock_rows=" FOR NO KEY UPDATE",
            skip_locked=" FOR NO KEY UPDATE SKIP LOCKED",
            claim_ready=literal_condition(connection, CLAIM_READY),
            slot_waiting=literal_condition(connection, SLOT_WAITING),
            same="IS NOT DISTINCT FROM",
            timestamp="%s::timestamptz",
            defers_counters=True,
            chains=True,
            # Generic plans, kept, that find rows by key (docs/internals.md, "Generic plans").
            write_prelude="set_config('plan_cache_mode', 'force_generic_plan', true), "
            "set_config('enable_seqscan', 'off', true)",
        )
    raise UnsupportedDatabase(f"parallel_mcp supports SQLite and PostgreSQL, not {vendor}.")


def dialect_for(using: str) -> Dialect:
    return _dialect(connections[using].vendor, using)


def literal_condition(connection: Any, condition: Q) -> str:
    """``condition`` (on Task) as SQL with its values written in, as Django writes a partial
    index's predicate, so that a query repeating it matches the index (docs/internals.md)."""
    query = Query(model=Task, alias_cols=False)
    compiler = query.get_compiler(connection=connection)
    sql, params = query.build_where(condition).as_sql(compiler, connection)
    quote = connection.schema_editor().quote_value
    return sql % tuple(quote(param) for param in params)


def _utc_text_timestamps(connection: Any) -> bool:
    """SQLite stores naive UTC text timestamps (USE_TZ on, no per-database TIME_ZONE)."""
    return bool(settings.USE_TZ) and connection.settings_dict.get("TIME_ZONE") is None


def field_assignments(
    model: type[Model], using: str, fields: dict[str, Any]
) -> tuple[str, list[Any]]:
    """``column = %s, …`` and its parameters for model field values, prepared as Django
    prepares them for a save (enum members as their plain values)."""
    connection = connections[using]
    parts, params = [], []
    for name, value in fields.items():
        field = model._meta.get_field(name)
        assert isinstance(field, Field) and field.column is not None
        parts.append(f"{field.column} = %s")
        plain = str(value) if isinstance(value, StrEnum) else value
        params.append(field.get_db_prep_save(plain, connection))
    return ", ".join(parts), params


def json_param(value: Any) -> str | None:
    """A JSONField's value as a parameter (Python None is SQL NULL, as Django stores it)."""
    return None if value is None else json.dumps(value)


# -- rows back into model instances -------------------------------------------------------------


@cache
def _fields(model: type[Model], only: tuple[str, ...] | None) -> list[Any]:
    """The concrete fields in column order (``only``: those of these attnames)."""
    fields = model._meta.concrete_fields
    return [field for field in fields if only is None or field.attname in only]


@cache
def columns(model: type[Model], prefix: str = "", only: tuple[str, ...] | None = None) -> str:
    """The columns of ``model``'s concrete fields (``only``: of these attnames), for rows
    that ``instances`` turns back into instances (with ``only``: the other fields deferred,
    as ``QuerySet.only`` leaves them)."""
    return ", ".join(prefix + str(field.column) for field in _fields(model, only))


@cache
def _attnames(model: type[Model], only: tuple[str, ...] | None) -> tuple[str, ...]:
    return tuple(field.attname for field in _fields(model, only))


@cache
def _converters(
    model: type[Model], using: str, only: tuple[str, ...] | None = None
) -> list[tuple[int, Callable[[Any], Any]]]:
    """Per column that needs one, a function turning the value read back into what Django's
    compiler would produce (its backend and field converters, or a faster equivalent for
    SQLite's text timestamps and hex UUIDs)."""
    connection = connections[using]
    table = model._meta.db_table
    fast: dict[str, Callable[[Any], Any]] = {}
    if connection.vendor == "sqlite" and _utc_text_timestamps(connection):
        fast = {"DateTimeField": _sqlite_datetime, "UUIDField": _sqlite_uuid}
    result: list[tuple[int, Callable[[Any], Any]]] = []
    for index, field in enumerate(_fields(model, only)):
        kind = _internal_type(field)
        if kind in fast:
            result.append((index, fast[kind]))
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


def saved_instance(model: type[Model], using: str, values: dict[str, Any]) -> Any:
    """A saved instance from every concrete field's attname -> value, built without
    ``Model.__init__``: marked saved like ``from_db``'s, but no init signal is sent."""
    instance = model.__new__(model)
    instance.__dict__.update(values)
    state = ModelState()
    state.adding = False
    state.db = using
    instance._state = state
    return instance


def instances(
    model: type[Model],
    using: str,
    rows: Sequence[Sequence[Any]],
    only: tuple[str, ...] | None = None,
) -> list[Any]:
    """Saved model instances from rows of ``columns(model, only=only)``, built as
    ``saved_instance`` builds them: what ``from_db`` gives."""
    converters = _converters(model, using, only)
    names = _attnames(model, only)
    result = []
    for row in rows:
        values = list(row)
        for index, convert in converters:
            values[index] = convert(values[index])
        result.append(saved_instance(model, using, dict(zip(names, values, strict=True))))
    return result

"""Sending the write unit's static SQL with as little overhead as possible: the DB-API cursor
directly, pipelined on PostgreSQL (``batch()``), unless queries are logged or wrapped
(docs/internals.md, "Sending statements").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC
from functools import lru_cache
from typing import Any, Protocol

# A statement sent before the first one (SQL, parameters).
Prelude = tuple[str, Sequence[Any]]

_IDLE = 0  # psycopg.pq.TransactionStatus.IDLE, without importing psycopg on SQLite


@lru_cache(maxsize=1024)
def _qmark(sql: str) -> str:
    return sql.replace("%s", "?")  # the hot path's statements hold no literal '%'


def _timestamp_loader(connection: Any) -> tuple[int, Any] | None:
    """(oid, loader) for ``timestamptz`` to register on this connection's cursors, or None:
    psycopg's own (20 times faster than Django's), where both give the same UTC datetimes."""
    import psycopg
    from psycopg.pq import Format

    raw = connection.connection
    if connection.timezone is not UTC or raw.info.timezone is not UTC:
        return None
    oid = psycopg.postgres.types["timestamptz"].oid
    return oid, psycopg.adapters.get_loader(oid, Format.TEXT)


@dataclass(slots=True)
class Result:
    _cursor: Any
    _errors: Any

    def fetchone(self) -> Any:
        with self._errors:
            return self._cursor.fetchone()

    def fetchall(self) -> list[Any]:
        with self._errors:
            return self._cursor.fetchall()


class Rows(Protocol):
    def fetchall(self) -> list[Any]: ...


@dataclass(slots=True)
class Later:
    """Rows worked out when they are read, after the batch that sent their statement (one
    statement's rows parted between two readers: ``Write.send_guard``)."""

    fetchall: Callable[[], list[Any]]


class Statements:
    def __init__(self, connection: Any, prelude: Prelude | None, *, outermost: bool) -> None:
        self.connection = connection
        self._prelude = prelude  # sent before the first statement, in its batch
        self.outermost = outermost  # the write's transaction is this atomic block's own
        self.vendor = connection.vendor
        self.logged = bool(connection.queries_logged or connection.execute_wrappers)
        self._errors = connection.wrap_database_errors
        self._cursors: list[Any] = []
        self._pipelined = False
        self._loader: tuple[int, Any] | None = None
        self._begun = False  # this sender sent the transaction's BEGIN (``_begin_in_batch``)
        if not self.logged:
            connection.ensure_connection()
            if self.vendor == "postgresql":
                self._loader = _timestamp_loader(connection)

    def _new_cursor(self) -> Any:
        if self.logged:
            cursor = self.connection.cursor()
        elif self.vendor == "postgresql":
            import psycopg

            cursor = psycopg.Cursor(self.connection.connection)
            if self._loader is not None:
                cursor.adapters.register_loader(*self._loader)
        else:
            import sqlite3

            # A plain cursor: Django's SQLite cursor class rewrites placeholders on every call.
            cursor = sqlite3.Cursor(self.connection.connection)
        self._cursors.append(cursor)
        return cursor

    def send(self, sql: str, params: Sequence[Any]) -> Result:
        """Execute (or, inside ``batch()`` on PostgreSQL, queue) one statement."""
        if self._prelude is not None:
            prelude, self._prelude = self._prelude, None
            self.send(*prelude)
        cursor = self._new_cursor()
        if self.logged:
            cursor.execute(sql, params)
        else:
            with self._errors:
                cursor.execute(_qmark(sql) if self.vendor == "sqlite" else sql, params)
        return Result(cursor, self._errors)

    @contextmanager
    def batch(self) -> Iterator[None]:
        if self.logged or self.vendor != "postgresql" or self._pipelined:
            yield
            return
        self._pipelined = True
        raw = self.connection.connection
        begin = self._begin_in_batch(raw)
        try:
            with self._errors, raw.pipeline():
                if begin:
                    cursor = self._new_cursor()
                    cursor.execute(b"BEGIN", prepare=False)
                yield
        finally:
            self._pipelined = False

    def _begin_in_batch(self, raw: Any) -> bool:
        """Whether this batch sends the transaction's ``BEGIN`` itself, as its first statement,
        psycopg switched to autocommit (psycopg would send it alone and wait for its reply; see
        docs/internals.md, "Sending statements")."""
        if self._begun or not self.outermost or raw.autocommit:
            return False
        if raw.isolation_level is not None or raw.read_only is not None or raw.deferrable:
            return False
        if raw.info.transaction_status != _IDLE:
            return False
        raw.autocommit = True  # idle and outside a pipeline: no statement is sent for it
        self._begun = True
        return True

    def close(self) -> None:
        for cursor in self._cursors:
            cursor.close()
        self._cursors.clear()
        if self._begun:
            raw = self.connection.connection
            if raw is not None and not raw.closed and raw.info.transaction_status == _IDLE:
                raw.autocommit = False  # committed: back to what Django set

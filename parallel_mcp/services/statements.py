"""Sending the write unit's static SQL (see write.py) with as little overhead as possible.

- The DB-API cursor under Django's is used directly: no per-call placeholder rewriting or
  debug bookkeeping. Errors are still Django's (``IntegrityError``, ``OperationalError``…).
- On PostgreSQL the cursor binds parameters on the server (so psycopg can prepare repeated
  statements when the database's ``OPTIONS["prepare_threshold"]`` allows it; Django leaves it
  off for connection poolers), and ``batch()`` pipelines the statements sent inside it: one
  network round trip for the lot instead of one each. Their results are read after the block.
- On PostgreSQL its cursors read ``timestamptz`` with psycopg's own loader (C in
  ``psycopg[binary]``) wherever that gives what Django's gives (``_timestamp_loader``).
- When queries are logged or wrapped (``DEBUG``, the test suite's query counting,
  ``connection.execute_wrapper`` instrumentation), Django's own cursor is used and nothing is
  pipelined, so every statement is seen.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1024)
def _qmark(sql: str) -> str:
    return sql.replace("%s", "?")  # the hot path's statements hold no literal '%'


def _timestamp_loader(connection: Any) -> tuple[int, Any] | None:
    """(oid, loader) for ``timestamptz`` to register on this connection's cursors, or None.

    Django's loader parses every timestamp in Python, then sets the connection's time zone;
    psycopg's default loader (C in ``psycopg[binary]``) parses 20 times faster and sets the
    session's zone, which is the same ``datetime.timezone.utc`` when Django's zone is UTC and
    so is the session's (Django sets it at connect; USE_TZ without a per-database TIME_ZONE).
    Django's took 7 % of a worker's cycle in a profile (bench/FINDINGS.md,
    "Issue 15: the worker's CPU per task")."""
    import psycopg
    from psycopg.pq import Format

    raw = connection.connection
    if connection.timezone is not UTC or raw.info.timezone is not UTC:
        return None
    oid = psycopg.postgres.types["timestamptz"].oid
    return oid, psycopg.adapters.get_loader(oid, Format.TEXT)


class Result:
    __slots__ = ("_cursor", "_errors")

    def __init__(self, cursor: Any, errors: Any) -> None:
        self._cursor = cursor
        self._errors = errors

    def fetchone(self) -> Any:
        with self._errors:
            return self._cursor.fetchone()

    def fetchall(self) -> list[Any]:
        with self._errors:
            return self._cursor.fetchall()

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount


class Statements:
    def __init__(self, connection: Any) -> None:
        self.connection = connection
        self.vendor = connection.vendor
        self.logged = bool(connection.queries_logged or connection.execute_wrappers)
        self._errors = connection.wrap_database_errors
        self._cursors: list[Any] = []
        self._pipelined = False
        self._last: Result | None = None
        self._loader: tuple[int, Any] | None = None
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
        cursor = self._new_cursor()
        if self.logged:
            cursor.execute(sql, params)
        else:
            with self._errors:
                cursor.execute(_qmark(sql) if self.vendor == "sqlite" else sql, params)
        self._last = Result(cursor, self._errors)
        return self._last

    # The DB-API style, for statements whose result is read at once.
    def execute(self, sql: str, params: Sequence[Any]) -> None:
        self.send(sql, params)

    def fetchone(self) -> Any:
        return self._last.fetchone()  # type: ignore[union-attr]

    def fetchall(self) -> list[Any]:
        return self._last.fetchall()  # type: ignore[union-attr]

    @property
    def rowcount(self) -> int:
        return self._last.rowcount  # type: ignore[union-attr]

    @contextmanager
    def batch(self) -> Iterator[None]:
        if self.logged or self.vendor != "postgresql" or self._pipelined:
            yield
            return
        self._pipelined = True
        try:
            with self._errors, self.connection.connection.pipeline():
                yield
        finally:
            self._pipelined = False

    def close(self) -> None:
        for cursor in self._cursors:
            cursor.close()
        self._cursors.clear()


@contextmanager
def statements(connection: Any) -> Iterator[Statements]:
    sender = Statements(connection)
    try:
        yield sender
    finally:
        sender.close()

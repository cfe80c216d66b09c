"""Sending the write unit's static SQL (see write.py) with as little overhead as possible.

- The DB-API cursor under Django's is used directly: no per-call placeholder rewriting or
  debug bookkeeping. Errors are still Django's (``IntegrityError``, ``OperationalError``…).
- On PostgreSQL the cursor binds parameters on the server (so psycopg can prepare repeated
  statements when the database's ``OPTIONS["prepare_threshold"]`` allows it; Django leaves it
  off for connection poolers), and ``batch()`` pipelines the statements sent inside it: one
  network round trip for the lot instead of one each. Their results are read after the block.
- When queries are logged or wrapped (``DEBUG``, the test suite's query counting,
  ``connection.execute_wrapper`` instrumentation), Django's own cursor is used and nothing is
  pipelined, so every statement is seen.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1024)
def _qmark(sql: str) -> str:
    return sql.replace("%s", "?")  # the hot path's statements hold no literal '%'


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
    def __init__(self, connection: Any, prelude: str = "") -> None:
        self.connection = connection
        self._prelude = prelude  # sent before the first statement, in its batch
        self.vendor = connection.vendor
        self.logged = bool(connection.queries_logged or connection.execute_wrappers)
        self._errors = connection.wrap_database_errors
        self._cursors: list[Any] = []
        self._pipelined = False
        self._last: Result | None = None
        if not self.logged:
            connection.ensure_connection()

    def _new_cursor(self) -> Any:
        if self.logged:
            cursor = self.connection.cursor()
        elif self.vendor == "postgresql":
            import psycopg

            cursor = psycopg.Cursor(self.connection.connection)
        else:
            import sqlite3

            # A plain cursor: Django's SQLite cursor class rewrites placeholders on every call.
            cursor = sqlite3.Cursor(self.connection.connection)
        self._cursors.append(cursor)
        return cursor

    def send(self, sql: str, params: Sequence[Any]) -> Result:
        """Execute (or, inside ``batch()`` on PostgreSQL, queue) one statement."""
        if self._prelude:
            prelude, self._prelude = self._prelude, ""
            self.send(prelude, [])
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
def statements(connection: Any, prelude: str = "") -> Iterator[Statements]:
    sender = Statements(connection, prelude)
    try:
        yield sender
    finally:
        sender.close()

"""Sending the write unit's static SQL (see write.py) with as little overhead as possible.

- The DB-API cursor under Django's is used directly: no per-call placeholder rewriting or
  debug bookkeeping. Errors are still Django's (``IntegrityError``, ``OperationalError``…).
- On PostgreSQL the cursor binds parameters on the server (so psycopg can prepare repeated
  statements when the database's ``OPTIONS["prepare_threshold"]`` allows it; Django leaves it
  off for connection poolers), and ``batch()`` pipelines the statements sent inside it: one
  network round trip for the lot instead of one each. Their results are read after the block.
- On PostgreSQL its cursors read ``timestamptz`` with psycopg's own loader (C in
  ``psycopg[binary]``) wherever that gives what Django's gives (``_timestamp_loader``).
- An outermost write's first batch on PostgreSQL carries its ``BEGIN`` (``_begin_in_batch``):
  psycopg would send it alone before the batch and wait for its reply, a round trip of its own.
- When queries are logged or wrapped (``DEBUG``, the test suite's query counting,
  ``connection.execute_wrapper`` instrumentation), Django's own cursor is used and nothing is
  pipelined, so every statement is seen.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
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


class Rows(Protocol):
    def fetchall(self) -> list[Any]: ...


class Later:
    """Rows worked out when they are read, after the batch that sent their statement (one
    statement's rows parted between two readers: ``Write.send_guard``)."""

    __slots__ = ("fetchall",)

    def __init__(self, fetchall: Callable[[], list[Any]]) -> None:
        self.fetchall = fetchall


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
        """Whether this batch sends the transaction's ``BEGIN`` itself, as its first statement.

        psycopg begins a transaction at the first statement, and in a pipeline it sends the
        ``BEGIN`` with a sync and waits for the reply before going on: a round trip of its
        own, the first of every write. So an outermost write whose transaction has not begun
        (psycopg idle, nothing sent yet) switches psycopg to autocommit, which Django's
        transaction does not see, and queues a plain ``BEGIN`` ahead of the batch's
        statements: the server runs them in that transaction all the same, and the write's
        ``commit()`` ends it. ``close`` switches autocommit back once the transaction has
        ended; after an error the transaction is still open, and Django's rollback at the end
        of its atomic block ends it (and sets autocommit itself). Only for psycopg's default
        ``BEGIN`` (no isolation level, read-only or deferrable option of its own)."""
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

"""Write transactions, and on SQLite a gate in front of them: a thread lock plus an ``flock``,
which wake the next waiter at once where SQLite's busy handler sleeps (docs/performance.md,
"SQLite: a gate in front of the write lock"; docs/internals.md).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections, transaction
from django.db.backends.sqlite3.base import DatabaseWrapper as SQLiteDatabaseWrapper

logger = logging.getLogger("parallel_mcp")

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows: threads of one process only
    fcntl = None  # type: ignore[assignment]


class SqliteWriteGate:
    def __init__(self, database_path: str) -> None:
        self.path = f"{database_path}.pmcp-lock"
        self._thread_lock = threading.Lock()
        self._fd: int | None = None
        self._pid = 0
        if hasattr(os, "register_at_fork"):
            # A child forked while another thread held the gate must not inherit it held.
            os.register_at_fork(after_in_child=self._after_fork)

    def _after_fork(self) -> None:
        self._thread_lock = threading.Lock()
        if self._fd is not None:
            # The parent's descriptor shares its flock: the child opens its own.
            try:
                os.close(self._fd)
            except OSError:  # pragma: no cover - already closed
                pass
        self._fd = None
        self._pid = 0

    def _descriptor(self) -> int | None:
        if fcntl is None:
            return None
        # flock belongs to the open file description, which a forked child shares with its
        # parent: reopen after a fork so parent and child exclude each other.
        if self._pid != os.getpid():
            self._pid = os.getpid()
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            except OSError as exc:
                # A read-only directory: SQLite's busy handler alone still keeps writes right.
                logger.warning("no SQLite write gate (%s): %s", self.path, exc)
                self._fd = None
        return self._fd

    @contextmanager
    def held(self) -> Iterator[None]:
        with self._thread_lock:
            fd = self._descriptor()
            if fd is None:
                yield
                return
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)


_gates: dict[str, SqliteWriteGate | None] = {}
_gates_lock = threading.Lock()


def _gate_for(using: str) -> SqliteWriteGate | None:
    connection = connections[using]
    if not isinstance(connection, SQLiteDatabaseWrapper):  # vendor "sqlite" (and SpatiaLite)
        return None
    name = str(connection.settings_dict.get("NAME") or "")
    gate = _gates.get(name, False)
    if gate is False:
        with _gates_lock:
            in_memory = connection.is_in_memory_db() or not name
            gate = None if in_memory else SqliteWriteGate(os.path.abspath(name))
            _gates[name] = gate
    return gate  # type: ignore[return-value]


def write_transaction(using: str) -> Any:
    """``transaction.atomic(using)``, behind the SQLite write gate when it is outermost (inside
    a caller's transaction the connection may hold SQLite's lock: waiting could deadlock)."""
    gate = None if connections[using].in_atomic_block else _gate_for(using)
    if gate is None:
        return transaction.atomic(using=using)
    return _gated(gate, using)


@contextmanager
def _gated(gate: SqliteWriteGate, using: str) -> Iterator[None]:
    with gate.held(), transaction.atomic(using=using):
        yield

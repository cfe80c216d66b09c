"""Holding a run's (or a task's) row lock in another transaction (PostgreSQL): the contention
under which a completion counts its run by delta row instead of in place (services/write.py);
and probing which rows a blocked write holds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import DatabaseError, connection, connections, transaction
from django.db.models import Model

from parallel_mcp.models import Run


class RunLockHolder(threading.Thread):
    """Holds ``SELECT … FOR NO KEY UPDATE`` on a run (or a row of ``model``), or what ``take()``
    locks, in a transaction of its own, until ``release`` is set or ``until()`` (polled from
    its own connection) is true; then rolls back."""

    def __init__(
        self,
        run_id: Any,
        until: Callable[[], bool] | None = None,
        model: type[Model] = Run,
        take: Callable[[], Any] | None = None,
    ) -> None:
        super().__init__(daemon=True)
        self.model = model
        self.run_id = run_id
        self.until = until
        self.take = take or (
            lambda: self.model.objects.select_for_update(no_key=True).get(pk=self.run_id)
        )
        self.holding = threading.Event()
        self.release = threading.Event()

    def run(self) -> None:
        try:
            with transaction.atomic():
                self.take()
                self.holding.set()
                deadline = time.monotonic() + 30
                while not self.release.wait(0.01) and time.monotonic() < deadline:
                    if self.until is not None and self._polled():
                        break
                transaction.set_rollback(True)
        finally:
            connections.close_all()

    def _polled(self) -> bool:
        # Inside the locking transaction: READ COMMITTED, each read sees the latest commits.
        return bool(self.until and self.until())


@contextmanager
def run_row_held(
    run_id: Any, until: Callable[[], bool] | None = None, model: type[Model] = Run
) -> Iterator[RunLockHolder]:
    """The run's row (or ``model``'s) locked by another transaction for the duration of the
    block (or until ``until()`` holds)."""
    with _holding(RunLockHolder(run_id, until, model)) as holder:
        yield holder


def held(take: Callable[[], Any]) -> Any:
    """What ``take()`` locks, held by another transaction for the duration of the block, then
    rolled back."""
    return _holding(RunLockHolder(None, take=take))


@contextmanager
def _holding(holder: RunLockHolder) -> Iterator[RunLockHolder]:
    holder.start()
    assert holder.holding.wait(10), "could not take the lock"
    try:
        yield holder
    finally:
        holder.release.set()
        holder.join(30)


def writer_lock_held(run_id: Any) -> Any:
    """The run's writer lock (services/write.py), held exclusively by another transaction, as
    a write that locks the run row holds it."""
    from parallel_mcp.services.write import RUN_LOCK_KEY, RUN_LOCK_NAMESPACE

    def take() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT pg_advisory_xact_lock(%s, {RUN_LOCK_KEY.format('%s')})",
                [RUN_LOCK_NAMESPACE, str(run_id)],
            )

    return held(take)


def wait_for_a_lock_wait(timeout: float = 10) -> None:
    """Return once some other session of this database waits for a lock."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database() AND pid <> pg_backend_pid()"
            )
            if cursor.fetchone()[0]:
                return
        time.sleep(0.01)
    raise AssertionError("no session waited for a lock")


def row_free(model: type[Model], pk: Any) -> bool:
    """Whether no other transaction holds a lock on the row that ``FOR NO KEY UPDATE``
    conflicts with (asked with NOWAIT: never waits)."""
    try:
        with transaction.atomic():
            model.objects.select_for_update(no_key=True, nowait=True).get(pk=pk)
    except DatabaseError:  # could not obtain lock
        return False
    return True

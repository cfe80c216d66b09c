"""Holding a run's row lock in another transaction (PostgreSQL): the contention under which a
completion counts its run by delta row instead of in place (services/write.py)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from django.db import connections, transaction

from parallel_mcp.models import Run


class RunLockHolder(threading.Thread):
    """Holds ``SELECT … FOR NO KEY UPDATE`` on a run in a transaction of its own, until
    ``release`` is set or ``until()`` (polled from its own connection) is true."""

    def __init__(self, run_id: Any, until: Callable[[], bool] | None = None) -> None:
        super().__init__(daemon=True)
        self.run_id = run_id
        self.until = until
        self.holding = threading.Event()
        self.release = threading.Event()

    def run(self) -> None:
        try:
            with transaction.atomic():
                Run.objects.select_for_update(no_key=True).get(pk=self.run_id)
                self.holding.set()
                deadline = time.monotonic() + 30
                while not self.release.wait(0.01) and time.monotonic() < deadline:
                    if self.until is not None and self._polled():
                        break
        finally:
            connections.close_all()

    def _polled(self) -> bool:
        # Inside the locking transaction: READ COMMITTED, each read sees the latest commits.
        return bool(self.until and self.until())


@contextmanager
def run_row_held(run_id: Any, until: Callable[[], bool] | None = None) -> Iterator[RunLockHolder]:
    """The run's row locked by another transaction for the duration of the block (or until
    ``until()`` holds)."""
    holder = RunLockHolder(run_id, until)
    holder.start()
    assert holder.holding.wait(10), "could not lock the run"
    try:
        yield holder
    finally:
        holder.release.set()
        holder.join(30)

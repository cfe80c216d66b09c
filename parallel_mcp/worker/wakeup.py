"""Waking idle workers promptly when work appears, without hammering the database.

- PostgreSQL: writes that make a task ready send ``NOTIFY parallel_mcp`` in their transaction
  (delivered on commit); a listener thread per worker turns it into a wake-up.
- SQLite: ``PRAGMA data_version`` changes whenever another connection commits; checking it
  costs no I/O, so a watcher thread per worker checks it often and wakes the worker's claimer
  only when something changed (the claimer checks it itself when the worker does not listen).
Polling with backoff still runs underneath, so a missed notification only delays work.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from django.db import connections

from ..services.write import WAKE_CHANNEL as CHANNEL

logger = logging.getLogger("parallel_mcp.worker")


class PostgresListener(threading.Thread):
    def __init__(self, *, using: str, on_notify: Callable[[], None], stop: threading.Event) -> None:
        super().__init__(name="pmcp-listen", daemon=True)
        self.using = using
        self.on_notify = on_notify
        self.stop = stop

    def run(self) -> None:
        import psycopg

        params = connections[self.using].get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        backoff = 0.5
        while not self.stop.is_set():
            try:
                with psycopg.connect(**params, autocommit=True) as conn:
                    conn.execute(f"LISTEN {CHANNEL}")
                    backoff = 0.5
                    while not self.stop.is_set():
                        for _ in conn.notifies(timeout=0.5, stop_after=1):
                            self.on_notify()
            except Exception as exc:  # noqa: BLE001 - keep listening; polling covers the gap
                if self.stop.is_set():
                    return
                logger.warning("LISTEN connection lost (%s); polling until it is back", exc)
                self.stop.wait(backoff)
                backoff = min(backoff * 2, 10.0)


class SqliteWatcher(threading.Thread):
    """One thread per worker checks ``PRAGMA data_version`` and wakes the worker's claimer when
    another connection committed: an idle worker costs one cheap read every ``every`` seconds
    however many slots it has."""

    def __init__(
        self,
        *,
        using: str,
        on_change: Callable[[], None],
        stop: threading.Event,
        every: float = 0.025,
    ) -> None:
        super().__init__(name="pmcp-watch", daemon=True)
        self.using = using
        self.on_change = on_change
        self.stop = stop
        self.every = every

    def run(self) -> None:
        detector = SqliteChangeDetector(self.using)
        try:
            while not self.stop.wait(self.every):
                try:
                    if detector.changed():
                        self.on_change()
                except Exception as exc:  # noqa: BLE001 - polling covers the gap
                    logger.warning("checking the database for changes failed: %s", exc)
                    connections[self.using].close()
                    self.stop.wait(1.0)
        finally:
            connections.close_all()


class SqliteChangeDetector:
    """Per-thread view of ``PRAGMA data_version``: True when another connection committed."""

    def __init__(self, using: str) -> None:
        self.using = using
        self._last: int | None = None

    def changed(self) -> bool:
        with connections[self.using].cursor() as cursor:
            cursor.execute("PRAGMA data_version")
            version = cursor.fetchone()[0]
        changed = self._last is not None and version != self._last
        self._last = version
        return changed


def idle_wait(
    *,
    seconds: float,
    wake: threading.Event,
    stop: threading.Event,
    detector: SqliteChangeDetector | None,
    check_every: float = 0.025,
) -> None:
    """Sleep up to ``seconds``; return early on a wake-up, a stop, or a database change."""
    deadline = time.monotonic() + seconds
    while not stop.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        # Without a detector only the wake event (set on work and on stop) ends the wait early.
        if wake.wait(remaining if detector is None else min(check_every, remaining)):
            wake.clear()
            return
        if detector is not None and detector.changed():
            return

"""What the Worker loop needs besides the orchestrator calls, for each way of reaching the
orchestrator: the database directly (local) or the HTTP API (remote)."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from django.db import connections

from .dbretry import with_db_retry
from .wakeup import PostgresListener, SqliteChangeDetector, SqliteWatcher

logger = logging.getLogger("parallel_mcp.worker")

T = TypeVar("T")


class LocalEnvironment:
    """Workers with database access: DB-hiccup retries, a read-only readiness look before a
    claim, LISTEN/NOTIFY (PostgreSQL) or data_version (SQLite) wake-ups."""

    remote = False

    def __init__(self, orchestrator: Any) -> None:
        self.orchestrator = orchestrator
        self.using = orchestrator.using

    def retry(self, call: Callable[[], T], *, what: str, attempts: int) -> T:
        return with_db_retry(call, what=what, using=self.using, attempts=attempts)

    def complete_and_claim(self, **kwargs: Any) -> tuple[list[Any], list[Any]]:
        """The worker's cycle: its slots' completions and claims straight into running, in
        one transaction (``services.complete_and_claim``)."""
        from ..services import complete_and_claim

        return complete_and_claim(using=self.using, start=True, **kwargs)

    def fold_runs(self, run_ids: list[Any]) -> None:
        """Fold the runs' delta rows (what ``complete_and_claim(folds=…)`` left to fold)."""
        from django.utils import timezone

        from ..services.write import fold_runs

        fold_runs(using=self.using, run_ids=run_ids, now=timezone.now())

    def report_presence(self, fields: dict[str, Any]) -> Any:
        from ..services import record_worker_presence

        return self.retry(
            lambda: record_worker_presence(using=self.using, **fields),
            what="presence report",
            attempts=3,
        )

    def remove_presence(self, process_id: Any) -> Any:
        from ..services import remove_worker_presence

        return self.retry(
            lambda: remove_worker_presence(using=self.using, process_id=process_id),
            what="presence removal",
            attempts=3,
        )

    def anything_ready(self, kinds: list[str]) -> bool:
        from django.utils import timezone

        from ..services.claim import anything_ready

        return anything_ready(self.using, now=timezone.now(), kinds=kinds)

    def start_listener(self, on_notify: Callable[[], None], stop: threading.Event) -> None:
        vendor = connections[self.using].vendor
        if vendor == "postgresql":
            PostgresListener(using=self.using, on_notify=on_notify, stop=stop).start()
        elif vendor == "sqlite":
            SqliteWatcher(using=self.using, on_change=on_notify, stop=stop).start()

    def change_detector(self) -> SqliteChangeDetector | None:
        if connections[self.using].vendor == "sqlite":
            return SqliteChangeDetector(self.using)
        return None

    def close_thread(self) -> None:
        connections.close_all()

    def refusal(self, exc: BaseException) -> str | None:
        """A database worker has no credential to be refused: every error may pass."""
        return None


class RemoteEnvironment:
    """Workers without database access, through ``parallel_mcp.api``: retries on timeouts,
    connection errors, 5xx and 429 (waiting at least the server's ``Retry-After``); polling
    only (the claim call is the readiness check)."""

    remote = True

    def __init__(self, orchestrator: Any) -> None:
        self.orchestrator = orchestrator

    def retry(self, call: Callable[[], T], *, what: str, attempts: int) -> T:
        from .transport import RemoteTransientError

        delay = 0.2
        for attempt in range(1, attempts + 1):
            try:
                return call()
            except RemoteTransientError as exc:
                if attempt == attempts:
                    raise
                wait = max(delay * random.uniform(0.5, 1.5), exc.retry_after or 0.0)
                logger.warning(
                    "API hiccup during %s (%s); retry %d of %d in %.1fs",
                    what,
                    exc,
                    attempt,
                    attempts - 1,
                    wait,
                )
                time.sleep(wait)
                delay = min(delay * 2, 5.0)
        raise AssertionError("unreachable")  # pragma: no cover

    def report_presence(self, fields: dict[str, Any]) -> Any:
        return self.retry(
            lambda: self.orchestrator.record_worker_presence(**fields),
            what="presence report",
            attempts=3,
        )

    def remove_presence(self, process_id: Any) -> Any:
        return self.retry(
            lambda: self.orchestrator.remove_worker_presence(process_id=process_id),
            what="presence removal",
            attempts=3,
        )

    def anything_ready(self, kinds: list[str]) -> bool:
        return True

    def refusal(self, exc: BaseException) -> str | None:
        """What the API said, when ``exc`` means it will refuse every call of this worker as
        configured (a refused token or permission, a worker id its token may not use, an
        unknown endpoint, a redirect): retrying cannot help and, with a bad token, each try
        counts toward the API's per-address limit that locks out every client behind the same
        address. None for anything else (transient errors are retried)."""
        from ..exceptions import PermissionDeniedError
        from .transport import RemoteError, RemoteTransientError

        if isinstance(exc, RemoteTransientError):
            return None
        if isinstance(exc, RemoteError | PermissionDeniedError):
            status = exc.details.get("status")
            return f"{exc} (HTTP {status})" if status else str(exc)
        return None

    def start_listener(self, on_notify: Callable[[], None], stop: threading.Event) -> None:
        return None

    def change_detector(self) -> None:
        return None

    def close_thread(self) -> None:
        """Nothing to close per thread: the orchestrator's one connection pool serves every
        thread, and keeps its keep-alive connections for the next task."""
        return None


def environment_for(orchestrator: Any) -> LocalEnvironment | RemoteEnvironment:
    # Decided without importing the remote client, which needs the `remote` extra.
    from ..orchestrator import Orchestrator

    if isinstance(orchestrator, Orchestrator):
        return LocalEnvironment(orchestrator)
    return RemoteEnvironment(orchestrator)

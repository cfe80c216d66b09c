"""Surviving database hiccups: a dropped connection or "database is locked" is retried a few
times with backoff and a log line, never by dying. Callers make retried writes idempotent
(client tokens), so a retry after a lost reply never applies a result twice."""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable
from typing import TypeVar

from django.db import InterfaceError, OperationalError, connections

logger = logging.getLogger("parallel_mcp.worker")

T = TypeVar("T")

TRANSIENT_ERRORS = (OperationalError, InterfaceError)


def with_db_retry(
    call: Callable[[], T], *, what: str, using: str, attempts: int = 5, first_delay: float = 0.05
) -> T:
    delay = first_delay
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except TRANSIENT_ERRORS as exc:
            if attempt == attempts:
                raise
            logger.warning(
                "database hiccup during %s (%s: %s); retry %d of %d in %.2fs",
                what,
                type(exc).__name__,
                exc,
                attempt,
                attempts - 1,
                delay,
            )
            _reset_connection(using)
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, 2.0)
    raise AssertionError("unreachable")  # pragma: no cover


def _reset_connection(using: str) -> None:
    connection = connections[using]
    if connection.in_atomic_block:
        return  # the caller's transaction owns the connection
    try:
        connection.close()
    except Exception:  # noqa: BLE001 - a broken connection may fail to close; drop it anyway
        connection.connection = None

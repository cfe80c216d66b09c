"""The lease-expiry loop: requeue or dead-letter tasks whose worker stopped heart-beating."""

from __future__ import annotations

import logging
import threading

from ..orchestrator import Orchestrator
from .dbretry import with_db_retry

logger = logging.getLogger("parallel_mcp.worker")


def expire_once(orchestrator: Orchestrator) -> list:
    """One pass; the ids of the tasks whose lease it expired (the caller reports them)."""
    result = with_db_retry(
        orchestrator.expire_leases, what="expire leases", using=orchestrator.using
    )
    return list(result.expired_task_ids)


def run_expiry_loop(orchestrator: Orchestrator, *, interval_ms: int, stop: threading.Event) -> int:
    """Expire leases every ``interval_ms`` until ``stop`` is set; returns how many expired."""
    logger.info(
        "lease expiry started: a pass every %d ms on database %r", interval_ms, orchestrator.using
    )
    total = 0
    while not stop.is_set():
        try:
            expired = expire_once(orchestrator)
            if expired:
                logger.info("expired %d lease(s): %s", len(expired), ", ".join(map(str, expired)))
            total += len(expired)
        except Exception:
            logger.exception("lease expiry failed; trying again in %d ms", interval_ms)
        stop.wait(interval_ms / 1000)
    return total

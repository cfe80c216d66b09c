"""Folding the delta rows that a crash left behind (see ``write.fold_runs``), run by the
lease-expiry maintenance (docs/lifecycle.md, "Run counters on PostgreSQL").
"""

from __future__ import annotations

from datetime import datetime, timedelta

from ..models import RunDelta
from .dialect import dialect_for
from .write import fold_runs

# Rows younger than this are left to the fold of the write that inserted them, which is
# normally done within milliseconds; older ones were left by a crash (or a fold that failed).
FOLD_LAG_MS = 1_000

# Runs folded per maintenance pass (each in one short transaction).
FOLD_BATCH = 500


def fold_lagging_runs(*, using: str, now: datetime) -> list:
    """Fold the runs that have delta rows older than ``FOLD_LAG_MS``; returns their ids."""
    if not dialect_for(using).defers_counters:
        return []  # nothing ever leaves a delta row here
    cutoff = now - timedelta(milliseconds=FOLD_LAG_MS)
    run_ids = sorted(
        set(
            RunDelta.objects.using(using)
            .filter(created_at__lt=cutoff)
            .order_by()
            .values_list("run_id", flat=True)[:FOLD_BATCH]
        )
    )
    if run_ids:
        fold_runs(using=using, run_ids=run_ids, now=now)
    return run_ids

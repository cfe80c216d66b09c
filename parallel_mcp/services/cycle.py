"""A local worker's cycle: the completions of its slots that finished and the claims for its
free slots, in one write, each step written once in complete.py and claim.py
(docs/internals.md, "The worker's cycle").
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from ..contract import arguments as a
from ..contract import limits
from ..exceptions import ParallelMcpError
from ..models import Task
from ..results import Claim
from .claim import claim_request, send_claim, take_claims, token_lock
from .complete import Completion, completions, in_order, send_completions, settle_completions
from .write import Folds, write

# A cycle may claim nothing (its slots are all busy).
CYCLE_LIMIT = a.Integer(0, limits.MAX_CLAIM_BATCH)


def complete_and_claim(
    *,
    using: str,
    worker_id: Any,
    items: Sequence[Mapping[str, Any]],
    limit: Any,
    lease_ms: int,
    kinds: Any = None,
    client_token: str | None = None,
    start: bool = False,
    now: datetime | None = None,
    folds: Folds | None = None,
) -> tuple[list[ParallelMcpError | None], list[Claim]]:
    """``complete_tasks(items)`` and ``claim_next_tasks(limit)`` (``limit`` 0: no claim) in one
    transaction. Returns per item, in order, None (completed, or replayed as completed) or the
    error ``complete_task`` would have raised, and the claims. The completed tasks are not
    read back: the guard returns only what the completion needs (``complete.FINISHED``).
    ``folds``: the runs whose delta rows the caller folds itself, later (``write``; those of
    capped runs are ``due`` at once)."""
    worker = a.NAME.check(worker_id, "worker_id")
    request = claim_request(
        now, worker, lease_ms, kinds, client_token, start, limit=limit, batch=CYCLE_LIMIT
    )
    parsed = completions(items, worker)
    prepared = [item for item in parsed if isinstance(item, Completion)]
    with write(using=using, now=request.now, folds=folds, lock=token_lock(using, request)) as w:
        with w.db.batch():
            completed = send_completions(w, worker, prepared, read_back=False) if prepared else None
            claimed = send_claim(w, request) if request.limit else None
        written = (
            settle_completions(w, worker, prepared, completed) if completed is not None else []
        )
        claims = take_claims(w, request, claimed) if claimed else []
    return [None if isinstance(r, Task) else r for r in in_order(parsed, written)], claims

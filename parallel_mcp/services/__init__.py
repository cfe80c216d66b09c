"""The only code that writes. Each function is one transaction (see ``write.py``)."""

from .context import append_context_snapshot
from .enqueue import enqueue_task
from .leases import (
    claim_next_task,
    expire_leases,
    heartbeat_lease,
    mark_task_running,
    report_progress,
)
from .outcomes import (
    complete_task,
    fail_task,
    pause_task,
    release_task,
    requeue_dead_task,
    resume_task,
)
from .runs import cancel_run, create_run, prune_runs

__all__ = [
    "append_context_snapshot",
    "cancel_run",
    "claim_next_task",
    "complete_task",
    "create_run",
    "enqueue_task",
    "expire_leases",
    "fail_task",
    "heartbeat_lease",
    "mark_task_running",
    "pause_task",
    "prune_runs",
    "release_task",
    "report_progress",
    "requeue_dead_task",
    "resume_task",
]

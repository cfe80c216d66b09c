"""The only code that writes. Each function is one transaction (see ``write.py``)."""

from .claim import claim_next_task, claim_next_tasks
from .complete import complete_task, complete_tasks
from .context import append_context_snapshot
from .cycle import complete_and_claim
from .enqueue import enqueue_task, enqueue_tasks
from .leases import (
    expire_leases,
    heartbeat_lease,
    mark_task_running,
    report_progress,
)
from .operator import cancel_task, copy_run, retry_task
from .outcomes import (
    fail_task,
    pause_task,
    release_task,
    requeue_dead_task,
    resume_task,
)
from .runs import cancel_run, create_run, prune_expired_tool_calls, prune_runs
from .workers import record_worker_presence, remove_worker_presence

__all__ = [
    "append_context_snapshot",
    "cancel_run",
    "cancel_task",
    "claim_next_task",
    "claim_next_tasks",
    "complete_and_claim",
    "complete_task",
    "complete_tasks",
    "copy_run",
    "create_run",
    "enqueue_task",
    "enqueue_tasks",
    "expire_leases",
    "fail_task",
    "heartbeat_lease",
    "mark_task_running",
    "pause_task",
    "prune_expired_tool_calls",
    "prune_runs",
    "record_worker_presence",
    "release_task",
    "remove_worker_presence",
    "report_progress",
    "requeue_dead_task",
    "resume_task",
    "retry_task",
]

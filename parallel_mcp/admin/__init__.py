"""The Django admin of parallel_mcp: see and steer every run.

Importing this package (Django's admin autodiscovery does) registers read-only admins for runs,
tasks, events, context snapshots, attempts, leases and worker processes on
``django.contrib.admin.site``. Rows are never edited here: the actions call the Orchestrator, and
need the ``parallel_mcp.operate_runs`` permission. See docs/admin.md.
"""

from .events import AttemptAdmin, ContextSnapshotAdmin, EventAdmin, LeaseAdmin
from .runs import RunAdmin
from .tasks import TaskAdmin
from .workers import WorkerProcessAdmin

__all__ = [
    "AttemptAdmin",
    "ContextSnapshotAdmin",
    "EventAdmin",
    "LeaseAdmin",
    "RunAdmin",
    "TaskAdmin",
    "WorkerProcessAdmin",
]

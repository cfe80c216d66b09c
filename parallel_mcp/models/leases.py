from __future__ import annotations

from django.db import models

from ..contract.limits import NAME_LENGTH
from ..states import LeaseStatus
from ._fields import status_choices, uuid_pk


class Lease(models.Model):
    """The fencing token a worker presents with every call about a claimed task.

    Read-only: ``pmcp_lease`` is a view of ``pmcp_attempt`` (migration 0013), an attempt's
    lease being its hold on the task: ``id`` and ``attempt_id`` are the attempt's id,
    ``acquired_at`` its ``leased_at``, ``expires_at`` its ``lease_expires_at``,
    ``heartbeat_at`` its last heartbeat or else ``leased_at``, ``released_at`` its
    ``ended_at``, ``status`` its status as ``states.LEASE_STATUS_OF_ATTEMPT`` maps it. Every
    write goes to the attempt row (services/); the view's triggers (migrations 0013, 0015)
    refuse a write that would change it and take a write of what it shows as a no-op, so a
    dump loads back (docs/upgrading.md). A later migration that alters ``pmcp_attempt`` must
    drop the view first and create it again after, with SQLite's triggers (SQLite remakes
    the table for most changes, PostgreSQL refuses to change a column a view reads;
    tests/test_lease_view.py).
    """

    id = uuid_pk()
    run = models.ForeignKey("parallel_mcp.Run", on_delete=models.DO_NOTHING, related_name="+")
    task = models.ForeignKey(
        "parallel_mcp.Task", on_delete=models.DO_NOTHING, related_name="leases", db_index=False
    )
    attempt = models.OneToOneField(
        "parallel_mcp.Attempt", on_delete=models.DO_NOTHING, related_name="lease"
    )
    worker_id = models.CharField(max_length=NAME_LENGTH)
    status = models.CharField(
        max_length=16, choices=status_choices(LeaseStatus), default=LeaseStatus.ACTIVE
    )
    acquired_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    released_at = models.DateTimeField(null=True, blank=True)
    client_token = models.CharField(max_length=NAME_LENGTH, null=True, blank=True)
    # Who took it (parallel_mcp.actors); None for in-process callers.
    principal = models.CharField(max_length=NAME_LENGTH, null=True, blank=True)

    class Meta:
        managed = False
        db_table = "pmcp_lease"
        ordering = ["acquired_at", "id"]

    def __str__(self) -> str:
        return f"Lease {self.id} on task {self.task_id} ({self.status})"

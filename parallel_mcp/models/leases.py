from __future__ import annotations

from django.db import models
from django.db.models import Q

from ..contract.limits import NAME_LENGTH
from ..states import LeaseStatus
from ._fields import status_check, status_choices, uuid_pk


class Lease(models.Model):
    """The fencing token a worker presents with every call about a claimed task."""

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
        db_table = "pmcp_lease"
        ordering = ["acquired_at", "id"]
        indexes = [models.Index(fields=["task", "acquired_at"], name="pmcp_lease_task_idx")]
        constraints = [
            status_check("status", LeaseStatus, "pmcp_lease_status_valid"),
            models.UniqueConstraint(
                fields=["client_token"],
                condition=Q(client_token__isnull=False),
                name="pmcp_lease_client_token_uniq",
            ),
        ]

    def __str__(self) -> str:
        return f"Lease {self.id} on task {self.task_id} ({self.status})"

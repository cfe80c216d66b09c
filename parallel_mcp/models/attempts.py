from __future__ import annotations

from django.db import models
from django.db.models import Q

from ..contract.limits import NAME_LENGTH
from ..states import AttemptStatus
from ._fields import status_check, status_choices, uuid_pk


class Attempt(models.Model):
    """One claim of a task by a worker, from lease to outcome. The row also holds its lease
    (the attempt's hold on the task, same id): ``Lease`` reads it through the view
    ``pmcp_lease`` (models/leases.py), so a claim writes one row and an outcome updates one."""

    id = uuid_pk()
    run = models.ForeignKey("parallel_mcp.Run", on_delete=models.DO_NOTHING, related_name="+")
    task = models.ForeignKey(
        "parallel_mcp.Task", on_delete=models.DO_NOTHING, related_name="attempts", db_index=False
    )
    worker_id = models.CharField(max_length=NAME_LENGTH)
    status = models.CharField(
        max_length=16, choices=status_choices(AttemptStatus), default=AttemptStatus.LEASED
    )
    leased_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    lease_expires_at = models.DateTimeField()
    error = models.TextField(null=True, blank=True)
    output = models.JSONField(null=True, blank=True)
    metadata = models.JSONField(null=True, blank=True)
    # The lease's own columns: its last heartbeat (None before the first), the client token
    # of the claim that took it, and who took it (parallel_mcp.actors; None in-process).
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    client_token = models.CharField(max_length=NAME_LENGTH, null=True, blank=True)
    principal = models.CharField(max_length=NAME_LENGTH, null=True, blank=True)

    class Meta:
        db_table = "pmcp_attempt"
        ordering = ["leased_at", "id"]
        indexes = [models.Index(fields=["task", "leased_at"], name="pmcp_attempt_task_idx")]
        constraints = [
            status_check("status", AttemptStatus, "pmcp_attempt_status_valid"),
            models.UniqueConstraint(
                fields=["client_token"],
                condition=Q(client_token__isnull=False),
                name="pmcp_attempt_client_token_uniq",
            ),
        ]

    def __str__(self) -> str:
        return f"Attempt {self.id} of task {self.task_id} ({self.status})"

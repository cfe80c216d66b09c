from __future__ import annotations

from django.db import models

from ..contract.limits import NAME_LENGTH
from ._fields import status_check, status_choices, uuid_pk

SCOPES = ("run", "task")


class ContextSnapshot(models.Model):
    """An immutable piece of shared context; a run points at its current one."""

    id = uuid_pk()
    run = models.ForeignKey(
        "parallel_mcp.Run",
        on_delete=models.DO_NOTHING,
        related_name="context_snapshots",
        db_index=False,
    )
    task = models.ForeignKey(
        "parallel_mcp.Task", on_delete=models.DO_NOTHING, null=True, blank=True, related_name="+"
    )
    scope = models.CharField(max_length=8, choices=status_choices(SCOPES), default="run")
    parent_snapshot = models.ForeignKey(
        "self", on_delete=models.DO_NOTHING, null=True, blank=True, related_name="+"
    )
    label = models.CharField(max_length=NAME_LENGTH, null=True, blank=True)
    payload = models.JSONField()
    created_at = models.DateTimeField()

    class Meta:
        db_table = "pmcp_context_snapshot"
        ordering = ["created_at", "id"]
        indexes = [models.Index(fields=["run", "created_at"], name="pmcp_snapshot_run_idx")]
        constraints = [status_check("scope", SCOPES, "pmcp_snapshot_scope_valid")]

    def __str__(self) -> str:
        return f"Snapshot {self.label or self.id} of run {self.run_id}"

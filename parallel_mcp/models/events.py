from __future__ import annotations

from django.db import models

from ..contract.limits import EVENT_TYPE_LENGTH, NAME_LENGTH


class Event(models.Model):
    """An append-only audit record, written in the transaction of the change it describes.

    ``id`` increases; ``list_events_since`` pages by it and never skips a committed event.
    """

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(
        "parallel_mcp.Run",
        on_delete=models.DO_NOTHING,
        related_name="events",
        db_index=False,
    )
    task = models.ForeignKey(
        "parallel_mcp.Task",
        on_delete=models.DO_NOTHING,
        null=True,
        blank=True,
        related_name="+",
        db_index=False,
    )
    attempt = models.ForeignKey(
        "parallel_mcp.Attempt",
        on_delete=models.DO_NOTHING,
        null=True,
        blank=True,
        related_name="+",
        db_index=False,
    )
    event_type = models.CharField(max_length=EVENT_TYPE_LENGTH)
    payload = models.JSONField(default=dict)
    created_at = models.DateTimeField()
    # Who acted (parallel_mcp.actors): "token:<prefix>" or "user:<pk>"; None in-process.
    actor = models.CharField(max_length=NAME_LENGTH, null=True, blank=True)

    class Meta:
        db_table = "pmcp_event"
        ordering = ["id"]
        indexes = [
            models.Index(fields=["run", "id"], name="pmcp_event_run_idx"),
            models.Index(fields=["task", "id"], name="pmcp_event_task_idx"),
        ]

    def __str__(self) -> str:
        return f"#{self.id} {self.event_type}"

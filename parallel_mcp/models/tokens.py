from __future__ import annotations

from django.db import models

from ..contract.limits import NAME_LENGTH


class ClientTokenRecord(models.Model):
    """A client token used for ``complete_task``/``fail_task``: replays return the recorded
    result instead of applying the outcome twice."""

    OUTCOMES = [("completed", "completed"), ("failed", "failed")]

    # Looked up by equality only: migration 0009 drops the pattern (LIKE) index Django adds
    # beside a text primary key on PostgreSQL, one index entry less per completion.
    token = models.CharField(max_length=NAME_LENGTH, primary_key=True)
    # Its foreign-key index serves pruning by run; the task's serves the foreign key's check
    # when tasks are deleted.
    run = models.ForeignKey("parallel_mcp.Run", on_delete=models.DO_NOTHING, related_name="+")
    task = models.ForeignKey("parallel_mcp.Task", on_delete=models.DO_NOTHING, related_name="+")
    outcome = models.CharField(max_length=16, choices=OUTCOMES)
    created_at = models.DateTimeField()
    # Who used it (parallel_mcp.actors): a replay by another principal is refused.
    principal = models.CharField(max_length=NAME_LENGTH, null=True, blank=True)

    class Meta:
        db_table = "pmcp_client_token"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(outcome__in=["completed", "failed"]),
                name="pmcp_client_token_outcome_valid",
            )
        ]

    def __str__(self) -> str:
        return f"{self.token} -> {self.outcome} of task {self.task_id}"

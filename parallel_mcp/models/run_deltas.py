from __future__ import annotations

from dataclasses import fields

from django.db import models

from ..states import TaskCounts

# The run counters a delta row moves: ``TaskCounts``' fields, named as in the write's counter
# changes (``Write.count``); the run's own columns are ``tasks_<name>``.
DELTA_COUNTERS = tuple(field.name for field in fields(TaskCounts))


class RunDelta(models.Model):
    """Counter changes of a run not yet added to its row (internal; not public API).

    On PostgreSQL a completion does not lock its run: it inserts one of these in its own
    transaction, and a fold (``services.write.fold_runs``) adds them to the run's counters
    under the run's lock right after the commit (see docs/lifecycle.md, "Run counters").
    """

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(
        "parallel_mcp.Run", on_delete=models.DO_NOTHING, related_name="+", db_index=True
    )
    total = models.IntegerField(default=0)
    active = models.IntegerField(default=0)
    waiting = models.IntegerField(default=0)
    stuck = models.IntegerField(default=0)
    completed = models.IntegerField(default=0)
    failed = models.IntegerField(default=0)
    cancelled = models.IntegerField(default=0)
    created_at = models.DateTimeField()

    class Meta:
        db_table = "pmcp_run_delta"
        default_permissions = ()

    def __str__(self) -> str:
        return f"RunDelta {self.pk} of run {self.run_id}"

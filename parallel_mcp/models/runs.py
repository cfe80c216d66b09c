from __future__ import annotations

from django.db import models

from ..contract.limits import NAME_LENGTH
from ..states import RunStatus, TaskCounts
from ._fields import status_check, status_choices, uuid_pk


class Run(models.Model):
    """A unit of parallel work: a DAG of tasks, its context snapshots and its event log.

    ``status`` is derived from the task counters below, which every task transition keeps
    current in its own transaction, so no operation reads every task of the run.
    """

    id = uuid_pk()
    namespace = models.CharField(max_length=NAME_LENGTH, default="default")
    external_id = models.CharField(max_length=NAME_LENGTH, null=True, blank=True)
    status = models.CharField(
        max_length=16, choices=status_choices(RunStatus), default=RunStatus.PENDING
    )
    metadata = models.JSONField(null=True, blank=True)
    current_context_snapshot = models.ForeignKey(
        "parallel_mcp.ContextSnapshot",
        on_delete=models.DO_NOTHING,
        null=True,
        blank=True,
        related_name="+",
    )
    max_parallel = models.PositiveIntegerField(null=True, blank=True)
    cancel_requested_at = models.DateTimeField(null=True, blank=True)
    cancel_reason = models.TextField(null=True, blank=True)

    tasks_total = models.PositiveIntegerField(default=0)
    tasks_active = models.PositiveIntegerField(default=0)
    tasks_waiting = models.PositiveIntegerField(default=0)
    tasks_stuck = models.PositiveIntegerField(default=0)
    tasks_completed = models.PositiveIntegerField(default=0)
    tasks_failed = models.PositiveIntegerField(default=0)
    tasks_cancelled = models.PositiveIntegerField(default=0)

    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()

    class Meta:
        db_table = "pmcp_run"
        ordering = ["-updated_at", "-id"]
        indexes = [
            models.Index(fields=["namespace", "-updated_at"], name="pmcp_run_ns_updated_idx"),
            models.Index(fields=["-updated_at", "-id"], name="pmcp_run_updated_idx"),
            models.Index(fields=["status", "-updated_at"], name="pmcp_run_status_updated_idx"),
            models.Index(fields=["external_id"], name="pmcp_run_external_id_idx"),
        ]
        constraints = [
            status_check("status", RunStatus, "pmcp_run_status_valid"),
            models.CheckConstraint(
                condition=models.Q(
                    tasks_total=models.F("tasks_active")
                    + models.F("tasks_waiting")
                    + models.F("tasks_stuck")
                    + models.F("tasks_completed")
                    + models.F("tasks_failed")
                    + models.F("tasks_cancelled")
                ),
                name="pmcp_run_counters_add_up",
            ),
            models.CheckConstraint(
                condition=models.Q(max_parallel__isnull=True) | models.Q(max_parallel__gte=1),
                name="pmcp_run_max_parallel_positive",
            ),
        ]
        permissions = [("operate_runs", "Can operate runs (cancel, retry, requeue, prune)")]

    def __str__(self) -> str:
        return f"Run {self.id} ({self.status})"

    @property
    def counts(self) -> TaskCounts:
        return TaskCounts(
            total=self.tasks_total,
            active=self.tasks_active,
            waiting=self.tasks_waiting,
            stuck=self.tasks_stuck,
            completed=self.tasks_completed,
            failed=self.tasks_failed,
            cancelled=self.tasks_cancelled,
        )

    @property
    def progress(self) -> float:
        """Share of tasks that reached a terminal state (0.0 when the run has none)."""
        if not self.tasks_total:
            return 0.0
        done = self.tasks_completed + self.tasks_failed + self.tasks_cancelled
        return done / self.tasks_total

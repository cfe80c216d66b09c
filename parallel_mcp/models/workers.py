from __future__ import annotations

from django.db import models
from django.db.models import Q

from ..contract.limits import HOSTNAME_LENGTH, NAME_LENGTH
from ._fields import uuid_pk


class WorkerProcess(models.Model):
    """A running ``pmcp_worker`` process (local or ``--api``), and the kinds it handles.

    Written only by ``services.workers``: created by the worker's first report, refreshed
    every ``PARALLEL_MCP["WORKER_PRESENCE_INTERVAL_MS"]``, deleted when it stops cleanly. A
    process counts as running while ``expires_at`` is in the future (three intervals after its
    last report), so one killed without a chance to say goodbye stops counting by itself.
    """

    id = uuid_pk()  # chosen by the process at start-up: one row per process run
    worker_id = models.CharField(max_length=NAME_LENGTH)  # the name on its leases (--worker-id)
    hostname = models.CharField(max_length=HOSTNAME_LENGTH)
    pid = models.PositiveIntegerField(null=True, blank=True)
    concurrency = models.PositiveIntegerField(default=1)
    remote = models.BooleanField(default=False)  # works through the HTTP API (--api)
    started_at = models.DateTimeField()
    last_seen_at = models.DateTimeField()
    expires_at = models.DateTimeField()

    # Not a column: the kinds, set by the API's presence view for its answer.
    kind_names: list[str]

    class Meta:
        db_table = "pmcp_worker_process"
        ordering = ["worker_id", "started_at", "id"]
        verbose_name = "worker"
        verbose_name_plural = "workers"
        indexes = [models.Index(fields=["expires_at"], name="pmcp_worker_process_exp_idx")]
        constraints = [
            models.CheckConstraint(
                condition=Q(expires_at__gte=models.F("last_seen_at")),
                name="pmcp_worker_process_expiry_after_seen",
            )
        ]

    def __str__(self) -> str:
        return f"{self.worker_id} ({self.hostname}, pid {self.pid})"


class WorkerProcessKind(models.Model):
    """One task kind a worker process handles (its handlers, or its ``--kinds`` subset)."""

    id = models.BigAutoField(primary_key=True)
    worker_process = models.ForeignKey(
        WorkerProcess, on_delete=models.DO_NOTHING, related_name="kinds", db_index=False
    )
    kind = models.CharField(max_length=200)

    class Meta:
        db_table = "pmcp_worker_process_kind"
        ordering = ["kind"]
        # "Does a running worker handle kind X?" looks the kind up first.
        indexes = [models.Index(fields=["kind"], name="pmcp_worker_kind_idx")]
        constraints = [
            models.UniqueConstraint(
                fields=["worker_process", "kind"], name="pmcp_worker_process_kind_uniq"
            )
        ]

    def __str__(self) -> str:
        return self.kind

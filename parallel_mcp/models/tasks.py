from __future__ import annotations

from datetime import datetime

from django.db import models
from django.db.models import F, Q, Value

from ..contract.limits import NAME_LENGTH, PRIORITY_MAX, PRIORITY_MIN
from ..states import LEASED_TASK_STATUSES, TaskStatus
from ._fields import status_check, status_choices, uuid_pk

# The leased statuses as the lease-expiry index's condition lists them (sorted): SQLite reads a
# partial index only for a query that repeats its condition term by term.
_LEASED = sorted(LEASED_TASK_STATUSES)

# The predicates of the partial indexes on a boolean column. A query uses a partial index only
# when the planner can prove the index's predicate from the query's WHERE; SQLite's prover
# matches it term by term, as text. Django writes ``Q(flag=True)`` on SQLite as a bare
# ``"flag"`` up to 5.2 and as ``"flag" = 1`` from 6.0 on (Django ticket #36492), and an index
# keeps the spelling of the Django that ran its migration: a query written by one version
# against an index created by the other silently scans. ``Value(True)`` is written
# ``"flag" = 1`` (PostgreSQL: ``"flag" = true``) by every version, in the index and in the
# queries alike, so every claim query filters with CLAIM_READY and every dead-letter listing
# with DEAD_LETTERED, never with ``claimable=True`` / ``dead=True``.
CLAIM_READY = Q(status=TaskStatus.QUEUED, unmet_dependencies=0, claimable=Value(True))
# Ready tasks of a max_parallel run that hold no slot (the slot hand-out's other range).
SLOT_WAITING = Q(status=TaskStatus.QUEUED, unmet_dependencies=0, claimable=Value(False))
DEAD_LETTERED = Q(dead=Value(True))

# Claim order: highest priority first, then oldest, the id breaking ties. One definition for
# the claim index, the model's ordering, every claim statement (CLAIM_ORDER_SQL) and the
# order claims are handed back in (claim_order_key).
CLAIM_ORDER = ("-priority", "created_at", "id")
CLAIM_ORDER_SQL = ", ".join(
    f"{name[1:]} DESC" if name.startswith("-") else name for name in CLAIM_ORDER
)


def claim_order_key(task: Task) -> tuple:
    return (-task.priority, task.created_at, task.pk)


def lease_lapsed(now: datetime) -> Q:
    """Leased or running tasks whose lease ran out before ``now`` (the worker stopped
    heart-beating): what expiry requeues or dead-letters and ``pmcp_status`` lists, read
    through the lease-expiry index."""
    return Q(status__in=_LEASED, lease_expires_at__lt=now)


class Task(models.Model):
    """One node of a run's DAG.

    ``unmet_dependencies`` counts dependencies not yet satisfied and ``failed_dependencies``
    counts required dependencies that failed, were cancelled or can never run; both are kept
    current by the transitions of the dependencies, so a claim needs no join to decide
    readiness and the claim index covers only ready tasks.
    """

    id = uuid_pk()
    run = models.ForeignKey(
        "parallel_mcp.Run", on_delete=models.DO_NOTHING, related_name="tasks", db_index=False
    )
    key = models.CharField(max_length=NAME_LENGTH, null=True, blank=True)
    kind = models.CharField(max_length=NAME_LENGTH)
    status = models.CharField(
        max_length=16, choices=status_choices(TaskStatus), default=TaskStatus.QUEUED
    )
    priority = models.IntegerField(default=0)
    max_attempts = models.PositiveIntegerField(null=True, blank=True)
    attempt_count = models.PositiveIntegerField(default=0)
    retry_delay_ms = models.BigIntegerField(null=True, blank=True)
    retry_backoff = models.CharField(
        max_length=16,
        null=True,
        blank=True,
        choices=[("fixed", "fixed"), ("exponential", "exponential")],
    )
    retry_max_delay_ms = models.BigIntegerField(null=True, blank=True)
    timeout_ms = models.BigIntegerField(null=True, blank=True)
    not_before = models.DateTimeField(null=True, blank=True)
    input = models.JSONField(null=True, blank=True)
    output = models.JSONField(null=True, blank=True)
    metadata = models.JSONField(null=True, blank=True)
    error = models.TextField(null=True, blank=True)
    progress = models.FloatField(default=0.0)
    progress_message = models.TextField(null=True, blank=True)
    # Indexed only where set (pmcp_task_context_snapshot_idx): an index of every row would
    # take an entry for NULL at each of a task's updates, none of which changes it.
    context_snapshot = models.ForeignKey(
        "parallel_mcp.ContextSnapshot",
        on_delete=models.DO_NOTHING,
        null=True,
        blank=True,
        related_name="+",
        db_index=False,
    )
    lease_id = models.UUIDField(null=True, blank=True)
    leased_by = models.CharField(max_length=NAME_LENGTH, null=True, blank=True)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    # Who took the lease (parallel_mcp.actors), while leased: only that principal may use it.
    lease_principal = models.CharField(max_length=NAME_LENGTH, null=True, blank=True)
    dead = models.BooleanField(default=False)
    # False for queued tasks of a max_parallel run that hold no free slot: they stay out of
    # the claim index, so a run at its limit costs other runs' claims nothing.
    claimable = models.BooleanField(default=True)
    # Pause with blocked_by: how many named blockers have not completed yet.
    pending_blockers = models.PositiveIntegerField(default=0)
    # Whether some paused task waits for this one (completion then looks it up).
    blocks_others = models.BooleanField(default=False)
    unmet_dependencies = models.PositiveIntegerField(default=0)
    failed_dependencies = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True, blank=True)
    completed_at = models.DateTimeField(null=True, blank=True)

    # Not a column: set only on the tasks list_stuck_tasks returns (the TASK shape's optional
    # field); reading it on any other task raises AttributeError.
    running_for_ms: int

    class Meta:
        db_table = "pmcp_task"
        ordering = list(CLAIM_ORDER)
        indexes = [
            # The claim: ready tasks in claim order.
            models.Index(
                *(F(name[1:]).desc() if name[0] == "-" else F(name).asc() for name in CLAIM_ORDER),
                name="pmcp_task_claim_idx",
                condition=CLAIM_READY,
            ),
            # Free slots of a max_parallel run go to its best ready tasks: its slot holders
            # (claimable) and the best of the others are two short ranges of this index.
            models.Index(
                F("run").asc(),
                F("claimable").asc(),
                F("priority").desc(),
                F("created_at").asc(),
                F("id").asc(),
                name="pmcp_task_run_ready_idx",
                condition=Q(status=TaskStatus.QUEUED, unmet_dependencies=0),
            ),
            # Delayed tasks of max_parallel runs waiting for a slot, by due time: the expiry
            # pass reads those now due (leases.runs_with_due_waiting_tasks), never the tasks
            # that wait for a slot without a delay.
            models.Index(
                fields=["not_before", "run"],
                name="pmcp_task_slot_delayed_idx",
                condition=SLOT_WAITING & Q(not_before__isnull=False),
            ),
            # Lease expiry scans only leased/running tasks by expiry time.
            models.Index(
                fields=["lease_expires_at"],
                name="pmcp_task_lease_expiry_idx",
                condition=Q(status__in=_LEASED),
            ),
            models.Index(fields=["run", "status"], name="pmcp_task_run_status_idx"),
            # The foreign key's look-ups (deleting a snapshot checks that no task names it).
            models.Index(
                fields=["context_snapshot"],
                name="pmcp_task_context_snapshot_idx",
                condition=Q(context_snapshot__isnull=False),
            ),
            models.Index(
                fields=["-updated_at", "-id"],
                name="pmcp_task_dead_idx",
                condition=DEAD_LETTERED,
            ),
        ]
        constraints = [
            status_check("status", TaskStatus, "pmcp_task_status_valid"),
            models.UniqueConstraint(
                fields=["run", "key"], condition=Q(key__isnull=False), name="pmcp_task_run_key_uniq"
            ),
            models.CheckConstraint(
                condition=Q(priority__gte=PRIORITY_MIN, priority__lte=PRIORITY_MAX),
                name="pmcp_task_priority_range",
            ),
            models.CheckConstraint(
                condition=Q(progress__gte=0.0, progress__lte=1.0), name="pmcp_task_progress_range"
            ),
            models.CheckConstraint(
                condition=Q(max_attempts__isnull=True) | Q(max_attempts__gte=1),
                name="pmcp_task_max_attempts_positive",
            ),
            models.CheckConstraint(
                condition=Q(attempt_count__gte=0), name="pmcp_task_attempt_count_nonneg"
            ),
            models.CheckConstraint(
                condition=Q(retry_backoff__isnull=True)
                | Q(retry_backoff__in=["exponential", "fixed"]),
                name="pmcp_task_retry_backoff_valid",
            ),
            models.CheckConstraint(
                condition=Q(retry_delay_ms__isnull=True) | Q(retry_delay_ms__gte=0),
                name="pmcp_task_retry_delay_nonneg",
            ),
            models.CheckConstraint(
                condition=Q(retry_max_delay_ms__isnull=True) | Q(retry_max_delay_ms__gte=0),
                name="pmcp_task_retry_max_delay_nonneg",
            ),
            models.CheckConstraint(
                condition=Q(timeout_ms__isnull=True) | Q(timeout_ms__gt=0),
                name="pmcp_task_timeout_positive",
            ),
            # Lease columns are set exactly while the task is leased or running.
            models.CheckConstraint(
                condition=(
                    Q(
                        status__in=_LEASED,
                        lease_id__isnull=False,
                        leased_by__isnull=False,
                        lease_expires_at__isnull=False,
                    )
                    | (
                        ~Q(status__in=_LEASED)
                        & Q(
                            lease_id__isnull=True,
                            leased_by__isnull=True,
                            lease_expires_at__isnull=True,
                            lease_principal__isnull=True,
                        )
                    )
                ),
                name="pmcp_task_lease_columns_match_status",
            ),
            models.CheckConstraint(
                condition=Q(dead=False) | Q(status=TaskStatus.FAILED),
                name="pmcp_task_dead_only_when_failed",
            ),
        ]
        permissions = [("work_tasks", "Can claim and report on tasks as a worker")]

    def __str__(self) -> str:
        return f"Task {self.key or self.id} [{self.kind}] ({self.status})"

    @property
    def depends_on_task_ids(self) -> list:
        """Ids of this task's dependencies, in the order they were declared."""
        cached = getattr(self, "_depends_on_cache", None)
        if cached is None:
            cached = list(
                TaskDependency.objects.using(self._state.db or "default")
                .filter(task_id=self.pk)
                .order_by("id")
                .values_list("depends_on_id", flat=True)
            )
            self._depends_on_cache = cached
        return list(cached)

    @property
    def input_responses(self) -> dict:
        """What the MCP client answered to the input this task asked for
        (``pause_task(input_requests=…)``), ``{key: response}``; empty until it answered. Read
        on first use. A remote orchestrator's ``get_task`` brings it along."""
        cached = getattr(self, "_input_responses_cache", None)
        if cached is None:
            from .tool_calls import InputRequest

            cached = dict(
                InputRequest.objects.using(self._state.db or "default")
                .filter(task_id=self.pk, answered_at__isnull=False)
                .order_by("answered_at", "key")
                .values_list("key", "response")
            )
            self._input_responses_cache = cached
        return dict(cached)


class TaskBlocker(models.Model):
    """A ``pause_task(blocked_by=…)`` edge: ``task`` stays blocked until ``blocker`` completes."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey("parallel_mcp.Run", on_delete=models.DO_NOTHING, related_name="+")
    task = models.ForeignKey(
        Task, on_delete=models.DO_NOTHING, related_name="blocker_edges", db_index=False
    )
    blocker = models.ForeignKey(
        Task, on_delete=models.DO_NOTHING, related_name="blocked_edges", db_index=False
    )

    class Meta:
        db_table = "pmcp_task_blocker"
        constraints = [
            models.UniqueConstraint(fields=["task", "blocker"], name="pmcp_blocker_uniq"),
            models.CheckConstraint(condition=~Q(task=F("blocker")), name="pmcp_blocker_not_self"),
        ]
        indexes = [models.Index(fields=["blocker"], name="pmcp_blocker_upstream_idx")]

    def __str__(self) -> str:
        return f"{self.task_id} blocked by {self.blocker_id}"


class TaskDependency(models.Model):
    """An edge of the DAG: ``task`` waits for ``depends_on``."""

    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey("parallel_mcp.Run", on_delete=models.DO_NOTHING, related_name="+")
    task = models.ForeignKey(
        Task, on_delete=models.DO_NOTHING, related_name="dependency_edges", db_index=False
    )
    depends_on = models.ForeignKey(
        Task, on_delete=models.DO_NOTHING, related_name="dependent_edges", db_index=False
    )
    required = models.BooleanField(default=True)

    class Meta:
        db_table = "pmcp_task_dependency"
        constraints = [
            models.UniqueConstraint(fields=["task", "depends_on"], name="pmcp_dependency_uniq"),
            models.CheckConstraint(
                condition=~Q(task=F("depends_on")), name="pmcp_dependency_not_self"
            ),
        ]
        indexes = [
            models.Index(fields=["depends_on"], name="pmcp_dependency_upstream_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} depends on {self.depends_on_id}"

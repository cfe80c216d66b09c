"""Output serializers: what the API returns. Ids are strings, datetimes ISO 8601, JSON fields
JSON. Every contract field of each model is here (see docs/api.md)."""

from __future__ import annotations

from rest_framework import serializers

from ...results import BLOCKER_KINDS
from ...states import AttemptStatus, LeaseStatus, RunStatus, TaskStatus
from .fields import DependsOnField


def _choices(values) -> list[str]:
    return [str(value) for value in values]


class RunOut(serializers.Serializer):
    id = serializers.UUIDField()
    namespace = serializers.CharField()
    external_id = serializers.CharField(allow_null=True)
    status = serializers.ChoiceField(choices=_choices(RunStatus))
    metadata = serializers.JSONField(allow_null=True)
    current_context_snapshot_id = serializers.UUIDField(allow_null=True)
    max_parallel = serializers.IntegerField(allow_null=True)
    cancel_requested_at = serializers.DateTimeField(allow_null=True)
    cancel_reason = serializers.CharField(allow_null=True)
    tasks_total = serializers.IntegerField()
    tasks_active = serializers.IntegerField(
        help_text="Queued tasks that can still run, plus leased and running ones."
    )
    tasks_waiting = serializers.IntegerField(help_text="Blocked and waiting_input tasks.")
    tasks_stuck = serializers.IntegerField(
        help_text="Queued tasks that can never run: a required dependency failed or was cancelled."
    )
    tasks_completed = serializers.IntegerField()
    tasks_failed = serializers.IntegerField()
    tasks_cancelled = serializers.IntegerField()
    progress = serializers.FloatField(
        help_text="Share of the run's tasks in a terminal state (0.0 to 1.0)."
    )
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()


class TaskOut(serializers.Serializer):
    id = serializers.UUIDField()
    run_id = serializers.UUIDField()
    key = serializers.CharField(allow_null=True)
    kind = serializers.CharField()
    status = serializers.ChoiceField(choices=_choices(TaskStatus))
    priority = serializers.IntegerField()
    max_attempts = serializers.IntegerField(allow_null=True)
    attempt_count = serializers.IntegerField()
    retry_delay_ms = serializers.IntegerField(allow_null=True)
    retry_backoff = serializers.ChoiceField(choices=["fixed", "exponential"], allow_null=True)
    retry_max_delay_ms = serializers.IntegerField(allow_null=True)
    timeout_ms = serializers.IntegerField(allow_null=True)
    not_before = serializers.DateTimeField(allow_null=True)
    input = serializers.JSONField(allow_null=True)
    output = serializers.JSONField(allow_null=True)
    metadata = serializers.JSONField(allow_null=True)
    error = serializers.CharField(allow_null=True)
    progress = serializers.FloatField()
    progress_message = serializers.CharField(allow_null=True)
    context_snapshot_id = serializers.UUIDField(allow_null=True)
    lease_id = serializers.UUIDField(allow_null=True)
    leased_by = serializers.CharField(allow_null=True)
    lease_expires_at = serializers.DateTimeField(allow_null=True)
    dead = serializers.BooleanField()
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    completed_at = serializers.DateTimeField(allow_null=True)
    depends_on_task_ids = DependsOnField()


class AttemptOut(serializers.Serializer):
    id = serializers.UUIDField()
    run_id = serializers.UUIDField()
    task_id = serializers.UUIDField()
    worker_id = serializers.CharField()
    status = serializers.ChoiceField(choices=_choices(AttemptStatus))
    leased_at = serializers.DateTimeField()
    started_at = serializers.DateTimeField(allow_null=True)
    ended_at = serializers.DateTimeField(allow_null=True)
    lease_expires_at = serializers.DateTimeField()
    error = serializers.CharField(allow_null=True)
    output = serializers.JSONField(allow_null=True)
    metadata = serializers.JSONField(allow_null=True)


class LeaseOut(serializers.Serializer):
    id = serializers.UUIDField()
    run_id = serializers.UUIDField()
    task_id = serializers.UUIDField()
    attempt_id = serializers.UUIDField()
    worker_id = serializers.CharField()
    status = serializers.ChoiceField(choices=_choices(LeaseStatus))
    acquired_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()
    heartbeat_at = serializers.DateTimeField(allow_null=True)
    released_at = serializers.DateTimeField(allow_null=True)
    client_token = serializers.CharField(allow_null=True)


class ContextSnapshotOut(serializers.Serializer):
    id = serializers.UUIDField()
    run_id = serializers.UUIDField()
    task_id = serializers.UUIDField(allow_null=True)
    scope = serializers.ChoiceField(choices=["run", "task"])
    parent_snapshot_id = serializers.UUIDField(allow_null=True)
    label = serializers.CharField(allow_null=True)
    payload = serializers.JSONField()
    created_at = serializers.DateTimeField()


class CurrentContextOut(serializers.Serializer):
    snapshot = ContextSnapshotOut(allow_null=True, help_text="null when the run has no context.")


class EventOut(serializers.Serializer):
    id = serializers.IntegerField()
    run_id = serializers.UUIDField()
    task_id = serializers.UUIDField(allow_null=True)
    attempt_id = serializers.UUIDField(allow_null=True)
    event_type = serializers.CharField()
    payload = serializers.JSONField()
    created_at = serializers.DateTimeField()


class BlockerOut(serializers.Serializer):
    kind = serializers.ChoiceField(choices=list(BLOCKER_KINDS))
    message = serializers.CharField()
    task_id = serializers.UUIDField(allow_null=True)
    until = serializers.DateTimeField(allow_null=True)


class TaskDetailOut(TaskOut):
    attempts = AttemptOut(
        many=True,
        source="recent_attempts",
        help_text="The most recent attempts (PARALLEL_MCP_API['TASK_DETAIL_ATTEMPTS']), oldest "
        "first.",
    )
    blockers = BlockerOut(
        many=True,
        help_text="Why the task is not running now (explain_task); empty when it is "
        "claimable or terminal.",
    )


class TaskBatchOut(serializers.Serializer):
    tasks = TaskOut(many=True)


class ClaimOut(serializers.Serializer):
    run = RunOut()
    task = TaskOut()
    attempt = AttemptOut()
    lease = LeaseOut()
    context = serializers.JSONField(
        allow_null=True, help_text="Payload of the run's current context snapshot, or null."
    )


class ClaimBatchOut(serializers.Serializer):
    claims = ClaimOut(many=True, help_text="In claim order; empty when nothing is claimable.")


class HeartbeatOut(serializers.Serializer):
    lease = LeaseOut()
    cancelled = serializers.BooleanField(
        help_text="Always false here: a cancelled task or run answers 409 lease_conflict with "
        "details.cancelled = true."
    )


class ExpireOut(serializers.Serializer):
    expired_task_ids = serializers.ListField(child=serializers.UUIDField())
    count = serializers.IntegerField()


class PruneOut(serializers.Serializer):
    pruned_run_ids = serializers.ListField(child=serializers.UUIDField())
    count = serializers.IntegerField()


class _Page(serializers.Serializer):
    next_cursor = serializers.CharField(
        allow_null=True,
        help_text="Opaque; pass it back as ?cursor= for the next page. null on the last page.",
    )
    next = serializers.URLField(allow_null=True, help_text="The next page's URL, or null.")


class RunPageOut(_Page):
    results = RunOut(many=True)


class TaskPageOut(_Page):
    results = TaskOut(many=True)


class EventPageOut(serializers.Serializer):
    results = EventOut(many=True)
    next_cursor = serializers.IntegerField(
        allow_null=True,
        help_text="Id of the last event returned (the after_id of the next call); after_id "
        "itself when nothing is new; null when nothing and no after_id.",
    )
    has_more = serializers.BooleanField(
        help_text="The page is full: more events may be waiting, call again at once."
    )


class TaskListOut(serializers.Serializer):
    results = TaskOut(many=True)


class ErrorBody(serializers.Serializer):
    code = serializers.CharField(help_text="Stable machine-readable code.")
    message = serializers.CharField()
    details = serializers.DictField(help_text="Ids and fields involved.")


class ErrorOut(serializers.Serializer):
    error = ErrorBody()


class WorkerProcessOut(serializers.Serializer):
    id = serializers.UUIDField(help_text="The process id the worker reported.")
    worker_id = serializers.CharField()
    hostname = serializers.CharField()
    pid = serializers.IntegerField(allow_null=True)
    concurrency = serializers.IntegerField()
    remote = serializers.BooleanField(help_text="Reports through this API (pmcp_worker --api).")
    kinds = serializers.ListField(child=serializers.CharField(), source="kind_names")
    started_at = serializers.DateTimeField()
    last_seen_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField(
        help_text="It counts as running until then, unless it reports again."
    )

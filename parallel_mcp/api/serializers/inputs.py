"""Input serializers: request bodies and query strings, checked before the Orchestrator is
called (which checks again). Bodies of operator calls refuse unknown fields (a misspelt
``max_attempts`` must not be dropped silently); worker-protocol bodies ignore them, so newer
clients can talk to older servers."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from ...conf import app_settings
from ...models.tasks import PRIORITY_MAX, PRIORITY_MIN
from ...services.hotpath import MAX_CLAIM_BATCH
from ...services.workers import INT32_MAX, MAX_WORKER_KINDS, PRESENCE_MISSED_REPORTS
from ...states import TERMINAL_RUN_STATUSES, RunStatus, TaskStatus
from .fields import (
    MAX_EVENT_ID,
    MAX_MS,
    CommaListField,
    DependencyField,
    JSONValueField,
    UtcDateTimeField,
    optional_text,
    text,
)

REASON_LENGTH = 10_000
# A batch's leases carry "<client_token>#<n>" (n < MAX_CLAIM_BATCH) in a 200-character column.
BATCH_TOKEN_LENGTH = 200 - 1 - len(str(MAX_CLAIM_BATCH - 1))
# prune older_than_ms: up to a century back.
MAX_PRUNE_AGE_MS = 100 * 365 * 24 * 3600 * 1000


class StrictSerializer(serializers.Serializer):
    # Refuses fields it does not know (no docstring: the schema would show it everywhere).

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(str(key) for key in data if key not in self.fields)
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


def _limit_field() -> serializers.IntegerField:
    return serializers.IntegerField(
        required=False,
        min_value=1,
        help_text="Page size (default PARALLEL_MCP_API['PAGE_SIZE'], at most "
        "PARALLEL_MCP['MAX_LIST_LIMIT']).",
    )


class _LimitMixin:
    def validate_limit(self, value: int) -> int:
        ceiling = app_settings.MAX_LIST_LIMIT
        if value > ceiling:
            raise serializers.ValidationError(
                f"Ensure this value is less than or equal to {ceiling}."
            )
        return value


# -- runs ---------------------------------------------------------------------------------------


class RunCreateIn(StrictSerializer):
    namespace = text(required=False, default="default")
    external_id = optional_text()
    metadata = JSONValueField(required=False)
    context = JSONValueField(
        required=False, help_text="With a value: the run's first context snapshot."
    )
    max_parallel = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=1_000_000
    )
    id = serializers.UUIDField(required=False, allow_null=True)


class RunListQuery(_LimitMixin, serializers.Serializer):
    namespace = text(required=False)
    status = CommaListField(
        child=serializers.ChoiceField(choices=[str(s) for s in RunStatus]),
        required=False,
        help_text="Only runs in these statuses (repeat the parameter or separate by commas).",
    )
    external_id = text(required=False)
    updated_after = UtcDateTimeField(required=False, help_text="Inclusive.")
    updated_before = UtcDateTimeField(required=False, help_text="Exclusive.")
    order_by = serializers.ChoiceField(
        choices=["updated_at", "created_at"], required=False, default="updated_at"
    )
    order_dir = serializers.ChoiceField(choices=["asc", "desc"], required=False, default="desc")
    limit = _limit_field()
    cursor = text(required=False, max_length=1000)


class ReasonIn(StrictSerializer):
    reason = optional_text(max_length=REASON_LENGTH)


class EmptyIn(StrictSerializer):
    pass


class ContextAppendIn(StrictSerializer):
    payload = JSONValueField(allow_null=False, help_text="Any JSON value but null.")
    label = optional_text()
    scope = serializers.ChoiceField(choices=["run", "task"], required=False, default="run")
    task_id = serializers.UUIDField(required=False, allow_null=True)
    parent_snapshot_id = serializers.UUIDField(required=False, allow_null=True)
    id = serializers.UUIDField(required=False, allow_null=True)


# -- tasks --------------------------------------------------------------------------------------


class RetryPolicyIn(StrictSerializer):
    delay_ms = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=MAX_MS
    )
    backoff = serializers.ChoiceField(
        choices=["fixed", "exponential"], required=False, allow_null=True
    )
    max_delay_ms = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=MAX_MS
    )


class TaskIn(StrictSerializer):
    kind = text()
    key = optional_text(help_text="Unique in the run; batch items may name it in depends_on.")
    priority = serializers.IntegerField(
        required=False, min_value=PRIORITY_MIN, max_value=PRIORITY_MAX
    )
    max_attempts = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=1_000_000
    )
    retry = RetryPolicyIn(required=False, allow_null=True)
    timeout_ms = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_MS
    )
    input = JSONValueField(required=False)
    metadata = JSONValueField(required=False)
    depends_on = serializers.ListField(child=DependencyField(), required=False, max_length=10_000)
    not_before = UtcDateTimeField(required=False, allow_null=True)
    context_snapshot_id = serializers.UUIDField(required=False, allow_null=True)
    id = serializers.UUIDField(required=False, allow_null=True)


class TaskBatchIn(StrictSerializer):
    tasks = TaskIn(many=True, max_length=10_000)


class ResumeIn(StrictSerializer):
    input = JSONValueField(
        required=False, help_text="When present (even null), replaces the task's input."
    )
    reason = optional_text(max_length=REASON_LENGTH)


class TaskRetryIn(StrictSerializer):
    cascade = serializers.BooleanField(
        required=False,
        default=True,
        help_text="Also reset every transitive dependent in a terminal state.",
    )
    reason = optional_text(max_length=REASON_LENGTH)


class RequeueIn(StrictSerializer):
    reset_attempts = serializers.BooleanField(required=False, default=True)
    not_before = UtcDateTimeField(required=False, allow_null=True)
    reason = optional_text(max_length=REASON_LENGTH)


class RunTasksQuery(_LimitMixin, serializers.Serializer):
    status = CommaListField(
        child=serializers.ChoiceField(choices=[str(s) for s in TaskStatus]), required=False
    )
    kind = serializers.ListField(child=text(), required=False)
    limit = _limit_field()
    cursor = text(required=False, max_length=1000)


class PendingQuery(_LimitMixin, serializers.Serializer):
    run_id = serializers.UUIDField(required=False)
    kind = serializers.ListField(child=text(), required=False)
    ready = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Only tasks a claim could take now (dependencies met, not_before passed).",
    )
    limit = _limit_field()
    cursor = text(required=False, max_length=1000)


class DeadQuery(_LimitMixin, serializers.Serializer):
    run_id = serializers.UUIDField(required=False)
    kind = serializers.ListField(child=text(), required=False)
    limit = _limit_field()
    cursor = text(required=False, max_length=1000)


class StuckQuery(serializers.Serializer):
    running_longer_than_ms = serializers.IntegerField(required=False, min_value=0, max_value=MAX_MS)


# -- events -------------------------------------------------------------------------------------


class RunEventsQuery(_LimitMixin, serializers.Serializer):
    after_id = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_EVENT_ID,
        help_text="The next_cursor of the previous page (the last event id seen).",
    )
    type = serializers.ListField(
        child=text(max_length=64), required=False, help_text="Only these event types."
    )
    limit = serializers.IntegerField(
        required=False,
        min_value=1,
        help_text="Page size (default PARALLEL_MCP['DEFAULT_EVENT_PAGE_LIMIT']).",
    )


class EventsQuery(RunEventsQuery):
    run_id = serializers.UUIDField(required=False)


class StreamQuery(serializers.Serializer):
    after_id = serializers.IntegerField(
        required=False,
        min_value=0,
        max_value=MAX_EVENT_ID,
        help_text="Start after this event id (the Last-Event-ID header wins). Without either, "
        "the stream starts at the current end of the log; 0 replays everything.",
    )
    run_id = serializers.UUIDField(required=False)
    type = serializers.ListField(child=text(max_length=64), required=False)
    timeout = serializers.FloatField(
        required=False,
        min_value=0,
        help_text="Seconds the connection stays open (default and ceiling: the "
        "SSE_DEFAULT_SECONDS and SSE_MAX_SECONDS settings).",
    )


# -- maintenance --------------------------------------------------------------------------------


class PruneIn(StrictSerializer):
    older_than = UtcDateTimeField(
        required=False, allow_null=True, help_text="Prune runs last updated before this time."
    )
    older_than_ms = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=0,
        max_value=MAX_PRUNE_AGE_MS,
        help_text="…or not updated for this many milliseconds.",
    )
    statuses = serializers.ListField(
        child=serializers.ChoiceField(choices=sorted(str(s) for s in TERMINAL_RUN_STATUSES)),
        required=False,
        allow_null=True,
    )
    limit = serializers.IntegerField(required=False, allow_null=True, min_value=1)

    def validate_limit(self, value: int | None) -> int | None:
        if value is not None and value > app_settings.MAX_LIST_LIMIT:
            raise serializers.ValidationError(
                f"Ensure this value is less than or equal to {app_settings.MAX_LIST_LIMIT}."
            )
        return value

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        given = [name for name in ("older_than", "older_than_ms") if attrs.get(name) is not None]
        if len(given) != 1:
            raise serializers.ValidationError(
                {"older_than": ["Give exactly one of older_than and older_than_ms."]}
            )
        return attrs


# -- the worker protocol ------------------------------------------------------------------------


class ClaimIn(serializers.Serializer):
    worker_id = text()
    lease_ms = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_MS
    )
    kinds = serializers.ListField(child=text(), required=False, allow_null=True, allow_empty=False)
    client_token = optional_text(
        help_text="Idempotency: a retried claim with the same token returns the same claim."
    )
    start = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Claim straight into running (task.running in the claim's transaction), so "
        "no tasks/{task_id}/running call is needed.",
    )


class ClaimBatchIn(ClaimIn):
    limit = serializers.IntegerField(
        min_value=1,
        max_value=MAX_CLAIM_BATCH,
        help_text=f"How many tasks to claim at most (1 to {MAX_CLAIM_BATCH}).",
    )
    client_token = optional_text(
        max_length=BATCH_TOKEN_LENGTH,
        help_text="Idempotency: a retried batch with the same token returns the same claims "
        "(lease n carries the token '<client_token>#<n>').",
    )


class LeaseIn(serializers.Serializer):
    lease_id = serializers.UUIDField()
    worker_id = text()


class HeartbeatIn(LeaseIn):
    lease_ms = serializers.IntegerField(
        required=False, allow_null=True, min_value=1, max_value=MAX_MS
    )


class ProgressIn(LeaseIn):
    progress = serializers.FloatField(min_value=0.0, max_value=1.0)
    message = optional_text(max_length=REASON_LENGTH)


class PauseIn(LeaseIn):
    status = serializers.ChoiceField(choices=["blocked", "waiting_input"])
    reason = optional_text(max_length=REASON_LENGTH)
    blocked_by = serializers.ListField(
        child=serializers.UUIDField(),
        required=False,
        allow_null=True,
        max_length=10_000,
        help_text="With status=blocked: stay blocked until every named task completes.",
    )


class CompleteIn(LeaseIn):
    output = JSONValueField(required=False)
    metadata = JSONValueField(required=False)
    next_context = JSONValueField(
        required=False, help_text="With a value: appended as the run's new current context."
    )
    next_context_label = optional_text()
    client_token = optional_text()


class FailIn(LeaseIn):
    error = text(max_length=100_000)
    metadata = JSONValueField(required=False)
    retry = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Requeue with backoff while attempts remain (else failed and dead-lettered).",
    )
    client_token = optional_text()


class ReleaseIn(LeaseIn):
    reason = optional_text(max_length=REASON_LENGTH)


# -- worker presence ------------------------------------------------------------------------


class PresenceIn(serializers.Serializer):
    process_id = serializers.UUIDField(
        help_text="Chosen by the worker process when it starts; the same in every report."
    )
    worker_id = text(help_text="The name the process claims under (on its leases).")
    hostname = text(max_length=255)
    pid = serializers.IntegerField(
        required=False, allow_null=True, min_value=0, max_value=INT32_MAX
    )
    kinds = serializers.ListField(
        child=text(),
        allow_empty=False,
        max_length=MAX_WORKER_KINDS,
        help_text="The task kinds it handles (fixed by the first report).",
    )
    concurrency = serializers.IntegerField(
        required=False, default=1, min_value=1, max_value=INT32_MAX
    )
    interval_ms = serializers.IntegerField(
        min_value=1,
        max_value=MAX_MS,
        help_text=f"How often it reports; it counts as gone {PRESENCE_MISSED_REPORTS} "
        "intervals after its last report.",
    )


class PresenceStopIn(serializers.Serializer):
    process_id = serializers.UUIDField()

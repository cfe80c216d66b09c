"""Input serializers: request bodies and query strings, checked before the Orchestrator is
called (which checks again). Every field applies an argument kind of
:mod:`parallel_mcp.contract.arguments`, so the API refuses exactly what the services refuse,
with the same limits. Bodies of operator calls refuse unknown fields (a misspelt
``max_attempts`` must not be dropped silently); worker-protocol bodies ignore them, so newer
clients can talk to older servers."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from ...contract import arguments as a
from ...contract.arguments import Choice
from ...contract.limits import MAX_BATCH, MAX_CLAIM_BATCH, MAX_MS, MIN_BATCH
from ...services.workers import PRESENCE_MISSED_REPORTS
from ...states import TERMINAL_RUN_STATUSES, RunStatus, TaskStatus
from .fields import Arg, CommaListField, DependencyField, DependsOnListField

# Opaque keyset cursors (see ..pagination).
CURSOR = a.Text(1000)
# ?timeout= of the event stream, in seconds (the SSE_MAX_SECONDS setting cuts it shorter).
STREAM_SECONDS = a.Number(0.0, float(MAX_MS // 1000))


def optional(kind: a.Kind, **kwargs: Any) -> Arg:
    """An optional, nullable field of ``kind``."""
    return Arg(kind, required=False, allow_null=True, **kwargs)


def names(**kwargs: Any) -> serializers.ListField:
    """A repeated query parameter of names (``?kind=a&kind=b``)."""
    return serializers.ListField(
        child=Arg(a.NAME), required=False, max_length=a.KINDS.max_items, **kwargs
    )


def event_types(**kwargs: Any) -> serializers.ListField:
    return serializers.ListField(
        child=Arg(a.EVENT_TYPE), required=False, max_length=a.EVENT_TYPES.max_items, **kwargs
    )


class BodySerializer(serializers.Serializer):
    # A request body. ``schema_rules``: JSON Schema keywords the OpenAPI schema adds to the
    # body's object for rules between fields (api/schema.py); ``validate`` applies them.
    # ``body_required``: the schema says the body is required (an empty one is refused even
    # without required fields). (No docstring: the schema would show it everywhere.)
    schema_rules: dict[str, Any] = {}
    body_required = False


class StrictSerializer(BodySerializer):
    # Refuses fields it does not know; its schema says ``additionalProperties: false``.

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, dict):
            unknown = sorted(str(key) for key in data if key not in self.fields)
            if unknown:
                raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        return super().to_internal_value(data)


def _limit_field(help_text: str | None = None) -> Arg:
    return Arg(
        a.LIST_LIMIT,
        query=True,
        required=False,
        help_text=help_text
        or "Page size (default PARALLEL_MCP_API['PAGE_SIZE'], at most "
        "PARALLEL_MCP['MAX_LIST_LIMIT']).",
    )


def _cursor_field() -> Arg:
    return Arg(
        CURSOR,
        query=True,
        required=False,
        help_text="Opaque: the next_cursor of the previous page of this list, with the same "
        "filters and ordering. Any other value answers 400 (validation_error, details.field "
        "cursor).",
    )


# -- runs ---------------------------------------------------------------------------------------


class RunCreateIn(StrictSerializer):
    namespace = Arg(a.NAME, required=False, default="default")
    external_id = optional(a.NAME)
    # (Field names DRF's stubs also know as Field attributes: declared fields are a metaclass'
    # business, hence the ignores.)
    metadata = optional(a.JSON)
    context = optional(  # type: ignore[assignment]
        a.JSON, help_text="With a value: the run's first context snapshot."
    )
    max_parallel = optional(a.MAX_PARALLEL)
    id = optional(a.ID)


class RunListQuery(serializers.Serializer):
    namespace = Arg(a.NAME, required=False)
    status = CommaListField(
        choices=[str(s) for s in RunStatus],
        required=False,
        help_text="Only runs in these statuses (repeat the parameter or separate by commas).",
    )
    external_id = Arg(a.NAME, required=False)
    updated_after = Arg(a.WHEN, required=False, help_text="Inclusive.")
    updated_before = Arg(a.WHEN, required=False, help_text="Exclusive.")
    order_by = Arg(Choice(("updated_at", "created_at")), required=False, default="updated_at")
    order_dir = Arg(Choice(("asc", "desc")), required=False, default="desc")
    limit = _limit_field()
    cursor = _cursor_field()


class ReasonIn(StrictSerializer):
    reason = optional(a.REASON)


class EmptyIn(StrictSerializer):
    pass


class ContextAppendIn(StrictSerializer):
    payload = Arg(a.PAYLOAD, help_text="Any JSON value but null.")
    label = optional(a.NAME)  # type: ignore[assignment]
    scope = Arg(Choice(("run", "task")), required=False, default="run")
    task_id = optional(a.ID, help_text="Required (not null) with scope=task.")
    parent_snapshot_id = optional(a.ID)
    id = optional(a.ID)

    # scope=task needs a task_id (the services refuse it otherwise).
    schema_rules = {
        "if": {"properties": {"scope": {"const": "task"}}, "required": ["scope"]},
        "then": {"properties": {"task_id": {"type": "string"}}, "required": ["task_id"]},
    }


# -- tasks --------------------------------------------------------------------------------------


class RetryPolicyIn(StrictSerializer):
    delay_ms = optional(a.RETRY_DELAY_MS)
    backoff = optional(a.BACKOFF)
    max_delay_ms = optional(a.RETRY_DELAY_MS)


class TaskIn(StrictSerializer):
    """``enqueue_task``: ``depends_on`` names existing tasks by id."""

    kind = Arg(a.NAME)
    key = optional(a.NAME, help_text="Unique in the run; batch items may name it in depends_on.")
    priority = Arg(a.PRIORITY, required=False)
    max_attempts = optional(a.MAX_ATTEMPTS)
    retry = RetryPolicyIn(required=False, allow_null=True)
    timeout_ms = optional(a.DURATION_MS)
    input = optional(a.JSON)
    metadata = optional(a.JSON)
    depends_on = DependsOnListField(child=DependencyField(), required=False)
    not_before = optional(a.WHEN)
    context_snapshot_id = optional(a.ID)
    id = optional(a.ID)


class BatchTaskIn(TaskIn):
    """An item of ``enqueue_tasks``: ``depends_on`` may also name the key of another item."""

    depends_on = DependsOnListField(child=DependencyField(batch=True), required=False)


BATCH_HELP = (
    f"{MIN_BATCH} to {MAX_BATCH} tasks, each an object of enqueue_task arguments; an empty "
    "list is a no-op (nothing is created, the answer is an empty list)."
)


class TaskBatchIn(StrictSerializer):
    tasks = BatchTaskIn(  # type: ignore[call-arg]  # ListSerializer's
        many=True,
        min_length=MIN_BATCH,
        max_length=MAX_BATCH,
        help_text=BATCH_HELP,
    )


class ResumeIn(StrictSerializer):
    input = optional(a.JSON, help_text="When present (even null), replaces the task's input.")
    reason = optional(a.REASON)


class TaskRetryIn(StrictSerializer):
    cascade = Arg(
        a.FLAG,
        required=False,
        default=True,
        help_text="Also reset every transitive dependent in a terminal state.",
    )
    reason = optional(a.REASON)


class RequeueIn(StrictSerializer):
    reset_attempts = Arg(a.FLAG, required=False, default=True)
    not_before = optional(a.WHEN)
    reason = optional(a.REASON)


class RunTasksQuery(serializers.Serializer):
    status = CommaListField(choices=[str(s) for s in TaskStatus], required=False)
    kind = names()
    limit = _limit_field()
    cursor = _cursor_field()


class PendingQuery(serializers.Serializer):
    run_id = Arg(a.ID, required=False)
    kind = names()
    ready = Arg(
        a.FLAG,
        query=True,
        required=False,
        default=False,
        help_text="Only tasks a claim could take now (dependencies met, not_before passed).",
    )
    ready_by = Arg(
        a.WHEN,
        required=False,
        help_text="Only tasks a claim could take at this time (list_pending_tasks' ready_by); "
        "given with ready=true, ready_by is the time that counts.",
    )
    limit = _limit_field()
    cursor = _cursor_field()


class DeadQuery(serializers.Serializer):
    run_id = Arg(a.ID, required=False)
    kind = names()
    limit = _limit_field()
    cursor = _cursor_field()


class StuckQuery(serializers.Serializer):
    running_longer_than_ms = Arg(a.THRESHOLD_MS, query=True, required=False)


# -- events -------------------------------------------------------------------------------------


class RunEventsQuery(serializers.Serializer):
    after_id = Arg(
        a.EVENT_ID,
        query=True,
        required=False,
        help_text="The next_cursor of the previous page (the last event id seen).",
    )
    type = event_types(help_text="Only these event types.")
    limit = _limit_field("Page size (default PARALLEL_MCP['DEFAULT_EVENT_PAGE_LIMIT']).")


class EventsQuery(RunEventsQuery):
    run_id = Arg(a.ID, required=False)


class StreamQuery(serializers.Serializer):
    after_id = Arg(
        a.EVENT_ID,
        query=True,
        required=False,
        help_text="Start after this event id (the Last-Event-ID header wins). Without either, "
        "the stream starts at the current end of the log; 0 replays everything.",
    )
    run_id = Arg(a.ID, required=False)
    type = event_types()
    timeout = Arg(
        STREAM_SECONDS,
        query=True,
        required=False,
        help_text="Seconds the connection stays open (default: the SSE_DEFAULT_SECONDS setting; "
        "more than SSE_MAX_SECONDS is cut to it).",
    )


# -- maintenance --------------------------------------------------------------------------------


PRUNE_CUT_OFFS = ("older_than", "older_than_ms")


class PruneIn(StrictSerializer):
    older_than = optional(a.WHEN, help_text="Prune runs last updated before this time.")
    older_than_ms = optional(
        a.PRUNE_AGE_MS, help_text="…or not updated for this many milliseconds."
    )
    statuses = serializers.ListField(
        child=serializers.ChoiceField(choices=sorted(str(s) for s in TERMINAL_RUN_STATUSES)),
        required=False,
        allow_null=True,
    )
    limit = optional(a.LIST_LIMIT)

    # Exactly one of the cut-offs, not null.
    body_required = True
    schema_rules = {
        "oneOf": [
            {"properties": {name: {"not": {"type": "null"}}}, "required": [name]}
            for name in PRUNE_CUT_OFFS
        ]
    }

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        given = [name for name in PRUNE_CUT_OFFS if attrs.get(name) is not None]
        if len(given) != 1:
            raise serializers.ValidationError(
                {"older_than": ["Give exactly one of older_than and older_than_ms."]}
            )
        return attrs


# -- the worker protocol ------------------------------------------------------------------------


class ClaimIn(BodySerializer):
    worker_id = Arg(a.NAME)
    lease_ms = optional(a.LEASE_MS)
    kinds = optional(a.KINDS)
    client_token = optional(
        a.NAME, help_text="Idempotency: a retried claim with the same token returns the same claim."
    )
    start = Arg(
        a.FLAG,
        required=False,
        default=False,
        help_text="Claim straight into running (task.running in the claim's transaction), so "
        "no tasks/{task_id}/running call is needed.",
    )


class ClaimBatchIn(ClaimIn):
    limit = Arg(
        a.CLAIM_LIMIT, help_text=f"How many tasks to claim at most (1 to {MAX_CLAIM_BATCH})."
    )
    client_token = optional(
        a.BATCH_TOKEN,
        help_text="Idempotency: a retried batch with the same token returns the same claims "
        "(lease n carries the token '<client_token>#<n>').",
    )


class LeaseIn(BodySerializer):
    lease_id = Arg(a.ID)
    worker_id = Arg(a.NAME)


class HeartbeatIn(LeaseIn):
    lease_ms = optional(a.LEASE_MS)


class ProgressIn(LeaseIn):
    progress = Arg(a.PROGRESS)
    message = optional(a.REASON)


class PauseIn(LeaseIn):
    status = Arg(a.PAUSE_STATUS)
    reason = optional(a.REASON)
    blocked_by = optional(
        a.TASK_IDS,
        help_text="With status=blocked only: stay blocked until every named task completes.",
    )
    input_requests = optional(
        a.INPUT_REQUESTS,
        help_text="With status=waiting_input only, for a task of a run created by an MCP tool "
        "call: what to ask the MCP client, {key: {method, params}} (docs/mcp-tasks.md), "
        "recorded with the pause.",
    )

    # blocked_by goes with status=blocked only, input_requests with status=waiting_input only
    # (the services refuse them otherwise).
    schema_rules = {
        "allOf": [
            {
                "if": {
                    "properties": {"status": {"const": "waiting_input"}},
                    "required": ["status"],
                },
                "then": {"properties": {"blocked_by": {"type": "null"}}},
            },
            {
                "if": {"properties": {"status": {"const": "blocked"}}, "required": ["status"]},
                "then": {"properties": {"input_requests": {"type": "null"}}},
            },
        ]
    }


class CompleteIn(LeaseIn):
    output = optional(a.JSON)
    metadata = optional(a.JSON)
    next_context = optional(
        a.JSON, help_text="With a value: appended as the run's new current context."
    )
    next_context_label = optional(a.NAME)
    client_token = optional(a.NAME)


class FailIn(LeaseIn):
    error = Arg(a.ERROR)
    metadata = optional(a.JSON)
    retry = Arg(
        a.FLAG,
        required=False,
        default=False,
        help_text="Requeue with backoff while attempts remain (else failed and dead-lettered).",
    )
    client_token = optional(a.NAME)


class ReleaseIn(LeaseIn):
    reason = optional(a.REASON)


# -- worker presence ------------------------------------------------------------------------


class PresenceIn(serializers.Serializer):
    process_id = Arg(
        a.ID, help_text="Chosen by the worker process when it starts; the same in every report."
    )
    worker_id = Arg(a.NAME, help_text="The name the process claims under (on its leases).")
    hostname = Arg(a.HOSTNAME)
    pid = optional(a.PID)
    kinds = Arg(a.KINDS, help_text="The task kinds it handles (fixed by the first report).")
    concurrency = Arg(a.CONCURRENCY, required=False, default=1)
    interval_ms = Arg(
        a.DURATION_MS,
        help_text=f"How often it reports; it counts as gone {PRESENCE_MISSED_REPORTS} "
        "intervals after its last report.",
    )


class PresenceStopIn(serializers.Serializer):
    process_id = Arg(a.ID)

"""The one serialized shape of each object the contract returns.

A run, task, attempt, lease, claim, context snapshot, event or blocker looks the same through
the HTTP API, the MCP tools and resources, the event stream and the remote worker's client,
because each is declared here once, as a list of fields, and everything is derived from it:

* ``SHAPE.dump(obj)``: the JSON-ready dict (ids as strings, datetimes as RFC 3339 in UTC with
  ``Z``, statuses as strings, JSON fields as stored);
* ``SHAPE.schema()``: its JSON Schema (the MCP tools' output schemas);
* ``SHAPE.serializer()``: a DRF serializer class with the same fields, from which the OpenAPI
  schema documents the API's responses;
* ``SHAPE.load(data)``: Python values back from the JSON (the remote worker builds unsaved model
  instances from them).

Functions below (``run``, ``task``, ``tasks``, ``claims``, …) are what the doors call; lists
read the dependencies (and a claim's run context) of all their items in one query.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache
from typing import Any
from uuid import UUID

from ..results import BLOCKER_KINDS, Blocker, Claim, EventPage, ExpireResult, PruneResult
from ..states import AttemptStatus, LeaseStatus, RunStatus, TaskStatus

# Field types.
UUID_ = "uuid"
STRING = "string"
INTEGER = "integer"
NUMBER = "number"
BOOLEAN = "boolean"
DATETIME = "datetime"
JSON = "json"
UUIDS = "uuids"
NESTED = "nested"


@dataclass(frozen=True)
class Field:
    name: str
    type: str
    nullable: bool = False
    enum: tuple[str, ...] = ()
    help: str = ""
    # Present only when the object carries it (e.g. running_for_ms of list_stuck_tasks).
    optional: bool = False
    shape: Shape | None = None  # for NESTED
    many: bool = False  # for NESTED


def _time(value: datetime | None) -> str | None:
    if value is None:
        return None
    text = value.astimezone(UTC).isoformat()
    return text[:-6] + "Z" if text.endswith("+00:00") else text


time_text = _time  # a datetime as every shape writes it (ISO 8601, UTC, "Z")


def _dump(field: Field, value: Any) -> Any:
    if value is None:
        return None
    kind = field.type
    if kind == UUID_:
        return str(value)
    if kind == DATETIME:
        return _time(value)
    if kind in (STRING,):
        return str(value)
    if kind == UUIDS:
        return [str(item) for item in value]
    if kind == NESTED:
        assert field.shape is not None
        if isinstance(value, dict):
            return value  # dumped already (with batched reads)
        if field.many:
            return [item if isinstance(item, dict) else field.shape.dump(item) for item in value]
        return field.shape.dump(value)
    return value  # integers, numbers, booleans and JSON as stored


def _load(field: Field, value: Any) -> Any:
    if value is None:
        return None
    kind = field.type
    if kind == UUID_:
        return UUID(str(value))
    if kind == DATETIME:
        return datetime.fromisoformat(value)
    if kind == UUIDS:
        return [UUID(str(item)) for item in value]
    if kind == NESTED:
        assert field.shape is not None
        if field.many:
            return [field.shape.load(item) for item in value]
        return field.shape.load(value)
    return value


NULL = {"type": "null"}
JSON_TYPES = ("object", "array", "string", "number", "boolean")


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` or null, in the one form every door publishes (a description stays on the
    outside, where clients show it). A schema that is already a choice (``anyOf``) gets null
    as one more branch."""
    inner = {key: value for key, value in schema.items() if key != "description"}
    if set(inner) == {"anyOf"}:
        branches = inner["anyOf"] if NULL in inner["anyOf"] else [*inner["anyOf"], NULL]
        result: dict[str, Any] = {"anyOf": branches}
    else:
        result = {"anyOf": [inner, NULL]}
    if "description" in schema:
        result["description"] = schema["description"]
    return result


def any_json() -> dict[str, Any]:
    """Any JSON value but null (doors add null with :func:`nullable`), in the one form every
    door publishes: a branch per JSON type. ``{}`` accepts the same values, but a schema without
    a type is what clients that map tool schemas onto a typed dialect cannot read (the MCP
    Inspector's ``--strict`` check flags it)."""
    return {"anyOf": [{"type": name} for name in JSON_TYPES]}


def field_schema(field: Field) -> dict[str, Any]:
    kind = field.type
    schema: dict[str, Any]
    if kind == UUID_:
        schema = {"type": "string", "format": "uuid"}
    elif kind == DATETIME:
        schema = {"type": "string", "format": "date-time"}
    elif kind == STRING:
        schema = {"type": "string", "enum": list(field.enum)} if field.enum else {"type": "string"}
    elif kind in (INTEGER, NUMBER, BOOLEAN):
        schema = {"type": kind}
    elif kind == UUIDS:
        schema = {"type": "array", "items": {"type": "string", "format": "uuid"}}
    elif kind == NESTED:
        assert field.shape is not None
        schema = field.shape.schema()
        if field.many:
            schema = {"type": "array", "items": schema}
    else:  # JSON: any value, null included
        schema = nullable(any_json())
    if field.nullable:
        schema = nullable(schema)
    if field.help:
        schema = {**schema, "description": field.help}
    return schema


class Shape:
    """An object's serialized form (see the module docstring)."""

    def __init__(self, name: str, fields: Sequence[Field], *, doc: str = "") -> None:
        self.name = name
        self.fields = tuple(fields)
        self.doc = doc
        self.names = tuple(field.name for field in self.fields)

    def __repr__(self) -> str:
        return f"Shape({self.name})"

    def extend(self, name: str, fields: Sequence[Field], *, doc: str = "") -> Shape:
        return Shape(name, [*self.fields, *fields], doc=doc or self.doc)

    def dump(self, obj: Any, **values: Any) -> dict[str, Any]:
        """``obj``'s fields (attributes of the same name) as JSON-ready values; ``values``
        gives fields that are not attributes of ``obj``."""
        data: dict[str, Any] = {}
        for field in self.fields:
            if field.name in values:
                value = values[field.name]
            elif field.optional and not hasattr(obj, field.name):
                continue
            else:
                value = getattr(obj, field.name)
            if field.optional and value is None:
                continue
            data[field.name] = _dump(field, value)
        return data

    def load(self, data: dict[str, Any]) -> dict[str, Any]:
        """Python values (UUIDs, aware datetimes) of the fields present in ``data``."""
        return {
            field.name: _load(field, data[field.name])
            for field in self.fields
            if field.name in data
        }

    @cache  # noqa: B019  (shapes are module constants, never collected)
    def schema(self) -> dict[str, Any]:
        return {
            "type": "object",
            "title": self.name,
            "properties": {field.name: field_schema(field) for field in self.fields},
            "required": [field.name for field in self.fields if not field.optional],
        }

    @cache  # noqa: B019
    def serializer(self) -> type:
        """A DRF serializer class with these fields (for the OpenAPI schema)."""
        from ..api.serializers.generated import serializer_for

        return serializer_for(self)


def _values(enum: Iterable[Any]) -> tuple[str, ...]:
    return tuple(str(member) for member in enum)


RUN = Shape(
    "Run",
    [
        Field("id", UUID_),
        Field("namespace", STRING),
        Field("external_id", STRING, nullable=True),
        Field("status", STRING, enum=_values(RunStatus)),
        Field("metadata", JSON),
        Field("current_context_snapshot_id", UUID_, nullable=True),
        Field("max_parallel", INTEGER, nullable=True),
        Field("cancel_requested_at", DATETIME, nullable=True),
        Field("cancel_reason", STRING, nullable=True),
        Field("tasks_total", INTEGER),
        Field(
            "tasks_active",
            INTEGER,
            help="Queued tasks that can still run, plus leased and running ones.",
        ),
        Field("tasks_waiting", INTEGER, help="Blocked and waiting_input tasks."),
        Field(
            "tasks_stuck",
            INTEGER,
            help="Queued tasks that can never run: a required dependency failed or was cancelled.",
        ),
        Field("tasks_completed", INTEGER),
        Field("tasks_failed", INTEGER),
        Field("tasks_cancelled", INTEGER),
        Field("progress", NUMBER, help="Share of the run's tasks in a terminal state (0 to 1)."),
        Field("created_at", DATETIME),
        Field("updated_at", DATETIME),
    ],
)

TASK = Shape(
    "Task",
    [
        Field("id", UUID_),
        Field("run_id", UUID_),
        Field("key", STRING, nullable=True),
        Field("kind", STRING),
        Field("status", STRING, enum=_values(TaskStatus)),
        Field("priority", INTEGER),
        Field("max_attempts", INTEGER, nullable=True),
        Field("attempt_count", INTEGER),
        Field("retry_delay_ms", INTEGER, nullable=True),
        Field("retry_backoff", STRING, nullable=True, enum=("fixed", "exponential")),
        Field("retry_max_delay_ms", INTEGER, nullable=True),
        Field("timeout_ms", INTEGER, nullable=True),
        Field("not_before", DATETIME, nullable=True),
        Field("input", JSON),
        Field("output", JSON),
        Field("metadata", JSON),
        Field("error", STRING, nullable=True),
        Field("progress", NUMBER),
        Field("progress_message", STRING, nullable=True),
        Field("context_snapshot_id", UUID_, nullable=True),
        Field("lease_id", UUID_, nullable=True),
        Field("leased_by", STRING, nullable=True),
        Field("lease_expires_at", DATETIME, nullable=True),
        Field("dead", BOOLEAN),
        Field("depends_on_task_ids", UUIDS, help="The tasks it depends on, in declaration order."),
        Field("created_at", DATETIME),
        Field("updated_at", DATETIME),
        Field("started_at", DATETIME, nullable=True),
        Field("completed_at", DATETIME, nullable=True),
        Field(
            "running_for_ms",
            INTEGER,
            optional=True,
            help="list_stuck_tasks only: how long the current attempt has been running.",
        ),
    ],
)

ATTEMPT = Shape(
    "Attempt",
    [
        Field("id", UUID_),
        Field("run_id", UUID_),
        Field("task_id", UUID_),
        Field("worker_id", STRING),
        Field("status", STRING, enum=_values(AttemptStatus)),
        Field("leased_at", DATETIME),
        Field("started_at", DATETIME, nullable=True),
        Field("ended_at", DATETIME, nullable=True),
        Field("lease_expires_at", DATETIME),
        Field("error", STRING, nullable=True),
        Field("output", JSON),
        Field("metadata", JSON),
    ],
)

LEASE = Shape(
    "Lease",
    [
        Field("id", UUID_),
        Field("run_id", UUID_),
        Field("task_id", UUID_),
        Field("attempt_id", UUID_),
        Field("worker_id", STRING),
        Field("status", STRING, enum=_values(LeaseStatus)),
        Field("acquired_at", DATETIME),
        Field("expires_at", DATETIME),
        Field("heartbeat_at", DATETIME, nullable=True),
        Field("released_at", DATETIME, nullable=True),
        Field("client_token", STRING, nullable=True),
    ],
)

SNAPSHOT = Shape(
    "ContextSnapshot",
    [
        Field("id", UUID_),
        Field("run_id", UUID_),
        Field("task_id", UUID_, nullable=True),
        Field("scope", STRING, enum=("run", "task")),
        Field("parent_snapshot_id", UUID_, nullable=True),
        Field("label", STRING, nullable=True),
        Field("payload", JSON),
        Field("created_at", DATETIME),
    ],
)

EVENT = Shape(
    "Event",
    [
        Field("id", INTEGER),
        Field("run_id", UUID_),
        Field("task_id", UUID_, nullable=True),
        Field("attempt_id", UUID_, nullable=True),
        Field("event_type", STRING),
        Field("payload", JSON),
        Field("created_at", DATETIME),
        Field(
            "actor",
            STRING,
            nullable=True,
            help="Who acted: token:<prefix> or user:<id>; null for in-process callers.",
        ),
    ],
)

BLOCKER = Shape(
    "Blocker",
    [
        Field("kind", STRING, enum=BLOCKER_KINDS),
        Field("message", STRING),
        Field("task_id", UUID_, nullable=True),
        Field("until", DATETIME, nullable=True),
    ],
)

CLAIM = Shape(
    "Claim",
    [
        Field("run", NESTED, shape=RUN),
        Field("task", NESTED, shape=TASK),
        Field("attempt", NESTED, shape=ATTEMPT),
        Field("lease", NESTED, shape=LEASE),
        Field(
            "context",
            JSON,
            help="The payload of the run's current context snapshot (null when it has none).",
        ),
    ],
)

EXPIRE_RESULT = Shape(
    "ExpireResult",
    [Field("expired_task_ids", UUIDS), Field("count", INTEGER)],
    doc="What expire_leases did: the tasks whose lease it expired.",
)

PRUNE_RESULT = Shape(
    "PruneResult",
    [Field("pruned_run_ids", UUIDS), Field("count", INTEGER)],
    doc="What prune_runs did: the runs it deleted.",
)

TASK_DETAIL = TASK.extend(
    "TaskDetail",
    [
        Field(
            "attempts",
            NESTED,
            shape=ATTEMPT,
            many=True,
            help="The most recent attempts, oldest first.",
        ),
        Field(
            "blockers",
            NESTED,
            shape=BLOCKER,
            many=True,
            help="Why the task is not running now (explain_task); empty when it is claimable "
            "or terminal.",
        ),
        Field(
            "input_responses",
            JSON,
            help="What the MCP client answered to the input the task asked for "
            "(pause_task's input_requests), an object {key: response}; empty until it answered.",
        ),
    ],
)


# -- what the doors call -----------------------------------------------------------------------
def run(value: Any) -> dict[str, Any]:
    return RUN.dump(value)


def task(value: Any, *, depends_on: list[Any] | None = None) -> dict[str, Any]:
    if depends_on is None:
        return TASK.dump(value)
    return TASK.dump(value, depends_on_task_ids=depends_on)


def tasks(items: Iterable[Any]) -> list[dict[str, Any]]:
    """Tasks, the dependencies of all of them read in one query."""
    items = list(items)
    deps = _dependencies(items)
    return [task(item, depends_on=deps[item.pk]) for item in items]


def task_detail(value: Any, *, attempts: list[Any], blockers: list[Blocker]) -> dict[str, Any]:
    return TASK_DETAIL.dump(
        value, attempts=attempts, blockers=blockers, input_responses=value.input_responses
    )


def attempt(value: Any) -> dict[str, Any]:
    return ATTEMPT.dump(value)


def lease(value: Any) -> dict[str, Any]:
    return LEASE.dump(value)


def snapshot(value: Any) -> dict[str, Any]:
    return SNAPSHOT.dump(value)


def event(value: Any) -> dict[str, Any]:
    return EVENT.dump(value)


def events(items: Iterable[Any]) -> list[dict[str, Any]]:
    return [EVENT.dump(item) for item in items]


def blocker(value: Blocker) -> dict[str, Any]:
    return BLOCKER.dump(value)


def claims(items: Iterable[Claim]) -> list[dict[str, Any]]:
    """Claims, each with its run's current context payload; the dependencies and contexts of
    all of them read in one query each."""
    items = list(items)
    if not items:
        return []
    deps = _dependencies([item.task for item in items])
    contexts = _contexts([item.run for item in items])
    return [
        CLAIM.dump(
            item,
            task=task(item.task, depends_on=deps[item.task.pk]),
            context=contexts.get(item.run.current_context_snapshot_id),
        )
        for item in items
    ]


def claim(value: Claim) -> dict[str, Any]:
    return claims([value])[0]


def event_page(page: EventPage) -> dict[str, Any]:
    return {"events": events(page.events), "next_cursor": page.next_cursor}


def expire_result(result: ExpireResult) -> dict[str, Any]:
    return EXPIRE_RESULT.dump(result)


def prune_result(result: PruneResult) -> dict[str, Any]:
    return PRUNE_RESULT.dump(result)


# -- batched reads -------------------------------------------------------------------------------
def _dependencies(items: list[Any]) -> dict[Any, list[Any]]:
    """Every task's dependency ids in declaration order, one query for all (none for tasks
    that already carry them)."""
    from ..selectors import dependency_ids

    found: dict[Any, list[Any]] = {}
    missing = []
    for item in items:
        cached = getattr(item, "_depends_on_cache", None)
        if cached is not None:
            found[item.pk] = list(cached)
        else:
            missing.append(item)
    if missing:
        using = missing[0]._state.db or "default"
        found.update(dependency_ids(using=using, task_ids=[item.pk for item in missing]))
    return found


def _contexts(runs: list[Any]) -> dict[Any, Any]:
    from ..selectors import snapshot_payloads

    ids = {run.current_context_snapshot_id for run in runs} - {None}
    if not ids:
        return {}
    using = runs[0]._state.db or "default"
    return snapshot_payloads(using=using, snapshot_ids=ids)


def error(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """The one shape of an error at every door: the HTTP API's error bodies and the MCP
    server's tool errors (their text), ``{"error": {"code", "message", "details"}}``."""
    return {"error": {"code": code, "message": message, "details": details or {}}}

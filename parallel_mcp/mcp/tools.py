"""The MCP tools: one per Orchestrator method, each with a precise JSON input schema, a JSON
output schema, a description written for a model to read, and a thin call.

Groups decide who sees a tool:

* ``read``: reads only (what ``--read-only`` and ``read`` tokens get);
* ``worker``: the worker protocol, from claiming a task to reporting its outcome (what
  ``worker`` tokens get);
* ``write``: creating runs and tasks and operating on them.

``full`` tokens and the stdio transport get every group. Over HTTP a token's tools are further
narrowed by its user's Django permissions (``permission`` below; superusers have them all).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache
from typing import Any

import jsonschema
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.dateparse import parse_datetime

from ..conf import app_settings
from ..contract import arguments as args
from ..contract import shapes
from ..contract import shapes as s
from ..contract.arguments import Kind
from ..contract.limits import MAX_BATCH, MAX_CLAIM_BATCH, MIN_BATCH
from ..contract.protocol import UNSET
from ..contract.roles import ACCESS_KINDS, ROLE_ACCESS
from ..models.snapshots import SCOPES
from ..orchestrator import Orchestrator
from ..selectors import require_run
from ..states import TERMINAL_RUN_STATUSES, RunStatus

GROUPS = ACCESS_KINDS  # read, worker, write

DURATION = re.compile(r"^\s*(\d{1,15})\s*(ms|s|m|h|d|w)\s*$")
_UNITS = {"ms": 1, "s": 1_000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


# -- schema building blocks -------------------------------------------------------------------
def obj(properties: dict[str, Any], required: tuple[str, ...] = (), **extra: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {
        "type": "object",
        "properties": properties,
        "additionalProperties": False,
    }
    if required:
        schema["required"] = list(required)
    schema.update(extra)
    return schema


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema, or null (for optional arguments whose default is "none")."""
    return shapes.nullable(schema)


def arg(kind: Kind, description: str) -> dict[str, Any]:
    """The JSON Schema of an argument of ``kind`` (its rules come from the contract)."""
    return {**kind.schema(), "description": description}


def uuid(description: str) -> dict[str, Any]:
    return arg(args.ID, description)


def text(description: str, kind: Kind = args.NAME) -> dict[str, Any]:
    return arg(kind, description)


def timestamp(description: str) -> dict[str, Any]:
    return arg(args.WHEN, description)


def json_value(description: str) -> dict[str, Any]:
    return nullable(arg(args.JSON, f"{description} Any JSON value."))


def limit_schema(default: int) -> dict[str, Any]:
    maximum = app_settings.MAX_LIST_LIMIT
    return arg(args.LIST_LIMIT, f"How many items at most (1-{maximum}; default {default}).")


def offset_schema() -> dict[str, Any]:
    return arg(args.OFFSET, "How many items to skip, for paging (default 0).")


def kinds_schema(description: str) -> dict[str, Any]:
    return nullable(arg(args.KINDS, description))


def lease_ms_schema(description: str) -> dict[str, Any]:
    return nullable(arg(args.LEASE_MS, description))


WORKER_ID = text(
    "Your worker identity: any stable name, the same on every call about a task you claimed."
)
TASK_ID = uuid("The task's id.")
RUN_ID = uuid("The run's id.")
LEASE_ID = uuid("The lease id returned by claim_next_task (claim.lease.id).")
CLIENT_TOKEN = nullable(
    text(
        "An idempotency key: repeating the call with the same token replays the recorded "
        "result instead of applying it twice. Never reuse a token for another call."
    )
)


# -- output schemas ---------------------------------------------------------------------------
def record(properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": properties, "required": list(properties)}


# The objects' shapes: the contract's (the same through the API and the remote worker).
RUN_OUT = shapes.RUN.schema()
TASK_OUT = shapes.TASK.schema()
ATTEMPT_OUT = shapes.ATTEMPT.schema()
LEASE_OUT = shapes.LEASE.schema()
SNAPSHOT_OUT = shapes.SNAPSHOT.schema()
EVENT_OUT = shapes.EVENT.schema()
BLOCKER_OUT = shapes.BLOCKER.schema()
CLAIM_OUT = shapes.CLAIM.schema()


def out(**properties: dict[str, Any]) -> dict[str, Any]:
    return record(properties)


def many(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "array", "items": schema}


# -- argument conversion ----------------------------------------------------------------------
def to_datetime(value: str, name: str) -> datetime:
    """An aware datetime in the contract's range, from an ISO 8601 string."""
    return args.WHEN.from_wire(value, name)


def to_cutoff(value: str, name: str = "older_than") -> datetime | timedelta:
    match = DURATION.match(value)
    if not match:
        return to_datetime(value, name)
    milliseconds = int(match.group(1)) * _UNITS[match.group(2)]
    args.PRUNE_AGE_MS.check(milliseconds, name)  # before timedelta() can overflow
    return timedelta(milliseconds=milliseconds)


def _is_aware_datetime(value: object) -> bool:
    if not isinstance(value, str):
        return True  # the format applies to strings only
    try:
        parsed = parse_datetime(value)
    except ValueError:
        return False
    return parsed is not None and parsed.tzinfo is not None


FORMAT_CHECKER = jsonschema.FormatChecker(["uuid"])
FORMAT_CHECKER.checks("date-time")(_is_aware_datetime)


def _convert(arguments: dict[str, Any], datetimes: tuple[str, ...]) -> dict[str, Any]:
    converted = dict(arguments)
    for name in datetimes:
        if converted.get(name) is not None:
            converted[name] = to_datetime(converted[name], name)
    return converted


# -- the tool type ----------------------------------------------------------------------------
Call = Callable[[Orchestrator, dict[str, Any]], dict[str, Any]]


@dataclass(frozen=True)
class ToolSpec:
    name: str
    title: str
    group: str
    permission: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any]
    call: Call
    datetimes: tuple[str, ...] = ()
    destructive: bool = False
    idempotent: bool = False
    validator: Any = field(default=None, compare=False, repr=False)

    @property
    def read_only(self) -> bool:
        return self.group == "read"

    def errors(self, arguments: Any) -> list[dict[str, Any]]:
        """Schema violations of ``arguments``, each ``{"field", "message"}``; empty when valid."""
        found = []
        for error in sorted(self.validator.iter_errors(arguments), key=lambda e: list(e.path)):
            error = _precise(error)
            path = ".".join(str(part) for part in error.absolute_path)
            found.append({"field": path or None, "message": error.message})
        return found

    def run(self, orchestrator: Orchestrator, arguments: dict[str, Any]) -> dict[str, Any]:
        """Call the Orchestrator with already validated arguments; a JSON-ready dict back."""
        return self.call(orchestrator, _convert(arguments, self.datetimes))


def _precise(error: Any) -> Any:
    """For a value that is neither X nor null (``anyOf``), the reason it is not an X, at its
    own path: "statuses.0: 'running' is not one of […]", not "… is not valid under any of the
    given schemas"."""
    while error.validator == "anyOf" and error.context:
        reasons = [
            inner
            for inner in error.context
            if not (inner.validator == "type" and inner.validator_value == "null")
        ]
        if not reasons:
            break
        error = max(reasons, key=lambda inner: len(inner.absolute_path))
    return error


def _one(name: str, serializer: Callable[[Any], Any]) -> Callable[[Any], dict[str, Any]]:
    return lambda value: {name: None if value is None else serializer(value)}


def _of_known_run(read: Call) -> Call:
    """A list of one run's items: an unknown run is ``not_found``, as the HTTP API's
    ``runs/{run_id}/…`` answer 404 (the Orchestrator's list would be empty)."""

    def call(orch: Orchestrator, a: dict[str, Any]) -> dict[str, Any]:
        require_run(using=orch.using, run_id=a["run_id"])
        return read(orch, a)

    return call


def _tool(
    name: str,
    *,
    title: str,
    group: str,
    permission: str,
    description: str,
    properties: dict[str, Any],
    required: tuple[str, ...] = (),
    output: dict[str, Any],
    call: Call,
    datetimes: tuple[str, ...] = (),
    destructive: bool = False,
    idempotent: bool = False,
) -> ToolSpec:
    schema = obj(properties, required)
    jsonschema.Draft202012Validator.check_schema(schema)
    jsonschema.Draft202012Validator.check_schema(output)
    return ToolSpec(
        name=name,
        title=title,
        group=group,
        permission=permission,
        description=" ".join(description.split()),
        input_schema=schema,
        output_schema=output,
        call=call,
        datetimes=datetimes,
        destructive=destructive,
        idempotent=idempotent,
        validator=jsonschema.Draft202012Validator(schema, format_checker=FORMAT_CHECKER),
    )


# -- the calls (each one Orchestrator method) ---------------------------------------------------
def _call_enqueue_tasks(orch: Orchestrator, a: dict[str, Any]) -> dict[str, Any]:
    items = [_convert(item, ("not_before",)) for item in a["tasks"]]
    return {"tasks": s.tasks(orch.enqueue_tasks(run_id=a["run_id"], tasks=items))}


def _call_prune_runs(orch: Orchestrator, a: dict[str, Any]) -> dict[str, Any]:
    a = dict(a, older_than=to_cutoff(a["older_than"]))
    return s.prune_result(orch.prune_runs(**a))


def _call_resume_task(orch: Orchestrator, a: dict[str, Any]) -> dict[str, Any]:
    task = orch.resume_task(
        task_id=a["task_id"], input=a.get("input", UNSET), reason=a.get("reason")
    )
    return {"task": s.task(task)}


def _task_properties(*, batch: bool) -> dict[str, Any]:
    dependency_ref = (
        "a task id of the same run, or the key of another task of this batch"
        if batch
        else "a task id of the same run"
    )
    ref: dict[str, Any] = args.NAME.schema() if batch else {"type": "string", "format": "uuid"}
    return {
        "kind": text("What sort of work this is; workers claim tasks by kind (e.g. 'site.apply')."),
        "key": nullable(
            text("A name unique within the run (optional); other tasks may refer to it.")
        ),
        "priority": arg(args.PRIORITY, "Higher runs first (default 0)."),
        "max_attempts": nullable(
            arg(
                args.MAX_ATTEMPTS,
                "How many claims the task gets before it is dead-lettered (default: no "
                "limit, and a failure or expired lease is then final or retried forever as "
                "the call decides).",
            )
        ),
        "retry": nullable(
            obj(
                {
                    "delay_ms": nullable(arg(args.RETRY_DELAY_MS, "Delay before a retry, in ms.")),
                    "backoff": nullable(
                        {
                            "type": "string",
                            "enum": ["fixed", "exponential"],
                            "description": "exponential doubles the delay on each attempt.",
                        }
                    ),
                    "max_delay_ms": nullable(
                        arg(args.RETRY_DELAY_MS, "Upper bound of the delay (0 = none), in ms.")
                    ),
                },
                description="Retry backoff policy (optional).",
            )
        ),
        "timeout_ms": nullable(
            arg(
                args.DURATION_MS,
                "How long one attempt may run before it counts as failed, in ms.",
            )
        ),
        "input": json_value("The task's input, handed to whoever claims it."),
        "metadata": json_value("Free-form metadata kept with the task."),
        "depends_on": {
            "type": "array",
            "description": (
                "Tasks that must complete before this one can be claimed. Each entry is "
                f"{dependency_ref}, or {{'task_id': …, 'required': false}} for an optional "
                "dependency (satisfied by any terminal state)."
            ),
            "items": {
                "anyOf": [
                    ref,
                    obj(
                        {"task_id": ref, "required": {"type": "boolean"}},
                        ("task_id",),
                    ),
                ]
            },
        },
        "not_before": nullable(
            timestamp("Do not hand the task out before this time (ISO 8601 with time zone).")
        ),
        "context_snapshot_id": nullable(
            uuid("A context snapshot of the run this task should work from (optional).")
        ),
        "id": nullable(uuid("Choose the task's id yourself (optional; default: a new UUID).")),
    }


@cache
def tool_specs() -> dict[str, ToolSpec]:
    """Every tool by name, in the order they are listed."""
    list_limit = app_settings.DEFAULT_LIST_LIMIT
    event_limit = app_settings.DEFAULT_EVENT_PAGE_LIMIT
    prune_limit = app_settings.DEFAULT_PRUNE_LIMIT
    tasks_out = out(tasks=many(TASK_OUT))
    task_out = out(task=TASK_OUT)
    run_out = out(run=RUN_OUT)
    worker_refs = {"task_id": TASK_ID, "lease_id": LEASE_ID, "worker_id": WORKER_ID}
    worker_required = ("task_id", "lease_id", "worker_id")
    claim_properties = {
        "worker_id": WORKER_ID,
        "lease_ms": lease_ms_schema(
            "How long the lease lasts before the task is taken back, in ms (default: the "
            "server's default lease)."
        ),
        "kinds": kinds_schema("Only claim tasks of these kinds (default: any)."),
        "client_token": CLIENT_TOKEN,
        "start": {
            "type": "boolean",
            "description": "Claim straight into running, as if mark_task_running followed in "
            "the same transaction (default false).",
        },
    }
    specs = [
        # -- runs -------------------------------------------------------------------------
        _tool(
            "create_run",
            title="Create a run",
            group="write",
            permission="parallel_mcp.operate_runs",
            description="""
                Create a run: a container for a graph of tasks, its shared context and its event
                log. Add tasks with enqueue_task or enqueue_tasks afterwards. With `context`, the
                run starts with that JSON as its current context snapshot (label
                'run.initial'). `max_parallel` caps how many of its tasks may be leased or
                running at once.""",
            properties={
                "namespace": text(
                    "A grouping label, e.g. a project or tenant (default 'default')."
                ),
                "external_id": nullable(text("Your own reference for this run (optional).")),
                "metadata": json_value("Free-form metadata kept with the run."),
                "context": json_value("Initial shared context for the run's tasks (optional)."),
                "id": nullable(uuid("Choose the run's id yourself (optional).")),
                "max_parallel": nullable(
                    arg(args.MAX_PARALLEL, "At most this many tasks leased or running at once.")
                ),
            },
            output=run_out,
            call=lambda o, a: {"run": s.run(o.create_run(**a))},
        ),
        _tool(
            "get_run",
            title="Get a run",
            group="read",
            permission="parallel_mcp.view_run",
            description="""
                Read one run: its status (pending, active, waiting, completed, failed,
                cancelled), task counts per state, progress (share of tasks finished) and
                current context snapshot id. `run` is null when no run has that id.""",
            properties={"run_id": RUN_ID},
            required=("run_id",),
            output=out(run=nullable(RUN_OUT)),
            call=lambda o, a: _one("run", s.run)(o.get_run(**a)),
        ),
        _tool(
            "list_runs",
            title="List runs",
            group="read",
            permission="parallel_mcp.view_run",
            description="""
                List runs, most recently updated first by default, filtered by namespace,
                statuses, external id or update time (`updated_after` inclusive,
                `updated_before` exclusive). Page with limit and offset.""",
            properties={
                "namespace": nullable(text("Only runs of this namespace.")),
                "statuses": nullable(
                    {
                        "type": "array",
                        "items": {"type": "string", "enum": list(RunStatus)},
                        "description": "Only runs in one of these statuses.",
                    }
                ),
                "external_id": nullable(text("Only runs with this external id.")),
                "updated_after": nullable(timestamp("Only runs updated at or after this time.")),
                "updated_before": nullable(timestamp("Only runs updated before this time.")),
                "limit": limit_schema(list_limit),
                "offset": offset_schema(),
                "order_by": {
                    "type": "string",
                    "enum": ["updated_at", "created_at"],
                    "description": "Sort field (default updated_at).",
                },
                "order_dir": {
                    "type": "string",
                    "enum": ["desc", "asc"],
                    "description": "Sort direction (default desc).",
                },
            },
            output=out(runs=many(RUN_OUT)),
            call=lambda o, a: {"runs": [s.run(run) for run in o.list_runs(**a)]},
            datetimes=("updated_after", "updated_before"),
        ),
        _tool(
            "cancel_run",
            title="Cancel a run",
            group="write",
            permission="parallel_mcp.operate_runs",
            description="""
                Cancel a run: every task not yet finished becomes cancelled, and workers holding
                one of its leases are fenced out on their next call. A run that already
                finished is left as it is.""",
            properties={
                "run_id": RUN_ID,
                "reason": nullable(text("Why, for the event log.", args.REASON)),
            },
            required=("run_id",),
            output=run_out,
            call=lambda o, a: {"run": s.run(o.cancel_run(**a))},
            destructive=True,
            idempotent=True,
        ),
        _tool(
            "copy_run",
            title="Copy a run",
            group="write",
            permission="parallel_mcp.operate_runs",
            description="""
                Start a fresh run with a copy of every task definition of an existing run and
                the same dependency graph, all queued again. The original run is untouched.""",
            properties={
                "run_id": RUN_ID,
                "reason": nullable(text("Why, for the event log.", args.REASON)),
            },
            required=("run_id",),
            output=run_out,
            call=lambda o, a: {"run": s.run(o.copy_run(**a))},
        ),
        _tool(
            "prune_runs",
            title="Prune finished runs",
            group="write",
            permission="parallel_mcp.operate_runs",
            description="""
                Delete finished runs (completed, failed or cancelled) last updated before a
                cut-off, with all their tasks, attempts, leases, snapshots and events. Running
                runs are never deleted. Returns the ids deleted; call again while `count`
                equals `limit` to delete more.""",
            properties={
                "older_than": {
                    "description": (
                        "The cut-off: an ISO 8601 time with time zone, or a duration counted "
                        "back from now such as '7d', '12h', '30m', '45s' or '500ms'."
                    ),
                    "anyOf": [
                        {"type": "string", "format": "date-time"},
                        {"type": "string", "pattern": DURATION.pattern},
                    ],
                },
                "statuses": nullable(
                    {
                        "type": "array",
                        "items": {"type": "string", "enum": sorted(TERMINAL_RUN_STATUSES)},
                        "minItems": 1,
                        "description": "Only runs in these statuses (default: all three).",
                    }
                ),
                "limit": limit_schema(min(prune_limit, app_settings.MAX_LIST_LIMIT)),
            },
            required=("older_than",),
            output=shapes.PRUNE_RESULT.schema(),
            call=_call_prune_runs,
            destructive=True,
        ),
        # -- tasks: enqueue and operate ---------------------------------------------------
        _tool(
            "enqueue_task",
            title="Enqueue a task",
            group="write",
            permission="parallel_mcp.operate_runs",
            description="""
                Add one task to a run. It can be claimed once every task in `depends_on` has
                completed and `not_before` has passed; higher `priority` goes first, then
                oldest. To add several related tasks at once, use enqueue_tasks.""",
            properties={"run_id": RUN_ID, **_task_properties(batch=False)},
            required=("run_id", "kind"),
            output=task_out,
            call=lambda o, a: {"task": s.task(o.enqueue_task(**a))},
            datetimes=("not_before",),
        ),
        _tool(
            "enqueue_tasks",
            title="Enqueue a batch of tasks",
            group="write",
            permission="parallel_mcp.operate_runs",
            description="""
                Add a graph of tasks to a run in one all-or-nothing call. Each item takes the
                arguments of enqueue_task; its `depends_on` may name other items of the batch by
                their `key`. A dependency cycle is refused with an error naming it.""",
            properties={
                "run_id": RUN_ID,
                "tasks": {
                    "type": "array",
                    "minItems": MIN_BATCH,
                    "maxItems": MAX_BATCH,
                    "description": "The tasks, each an object of enqueue_task arguments; an "
                    "empty list is a no-op (nothing is created, the answer is an empty list).",
                    "items": obj(_task_properties(batch=True), ("kind",)),
                },
            },
            required=("run_id", "tasks"),
            output=tasks_out,
            call=_call_enqueue_tasks,
        ),
        _tool(
            "resume_task",
            title="Resume a paused task",
            group="write",
            permission="parallel_mcp.operate_runs",
            description="""
                Put a paused task (blocked or waiting_input) back in the queue so a worker can
                claim it again. Pass `input` to replace the task's input, for example with the
                answer a waiting_input task asked for.""",
            properties={
                "task_id": TASK_ID,
                "input": json_value("New input for the task (optional; omit to keep it)."),
                "reason": nullable(text("Why, for the event log.", args.REASON)),
            },
            required=("task_id",),
            output=task_out,
            call=_call_resume_task,
        ),
        _tool(
            "cancel_task",
            title="Cancel a task",
            group="write",
            permission="parallel_mcp.operate_runs",
            description="""
                Cancel one unfinished task. A worker holding its lease is fenced out: its next
                call about the task fails with lease_conflict.""",
            properties={
                "task_id": TASK_ID,
                "reason": nullable(text("Why, for the event log.", args.REASON)),
            },
            required=("task_id",),
            output=task_out,
            call=lambda o, a: {"task": s.task(o.cancel_task(**a))},
            destructive=True,
        ),
        _tool(
            "retry_task",
            title="Re-execute a task",
            group="write",
            permission="parallel_mcp.operate_runs",
            description="""
                Run a finished task (completed, failed or cancelled) again: it is queued with its
                output, error and progress cleared. With `cascade` (default true) every finished
                task that depends on it, directly or not, is reset too.""",
            properties={
                "task_id": TASK_ID,
                "cascade": {
                    "type": "boolean",
                    "description": "Also reset finished dependents (default true).",
                },
                "reason": nullable(text("Why, for the event log.", args.REASON)),
            },
            required=("task_id",),
            output=task_out,
            call=lambda o, a: {"task": s.task(o.retry_task(**a))},
        ),
        _tool(
            "requeue_dead_task",
            title="Requeue a dead-lettered task",
            group="write",
            permission="parallel_mcp.operate_runs",
            description="""
                Give a dead-lettered task (failed after its last attempt; see list_dead_tasks)
                another chance: it is queued again, by default with its attempt count reset.""",
            properties={
                "task_id": TASK_ID,
                "reset_attempts": {
                    "type": "boolean",
                    "description": "Start counting attempts from zero again (default true).",
                },
                "not_before": nullable(timestamp("Do not hand it out before this time.")),
                "reason": nullable(text("Why, for the event log.", args.REASON)),
            },
            required=("task_id",),
            output=task_out,
            call=lambda o, a: {"task": s.task(o.requeue_dead_task(**a))},
            datetimes=("not_before",),
        ),
        _tool(
            "expire_leases",
            title="Expire overdue leases",
            group="write",
            permission="parallel_mcp.operate_runs",
            description="""
                Take back every task whose lease ran out without a heartbeat: it is queued again
                with backoff while attempts remain, else failed and dead-lettered. Usually every
                local pmcp_worker does this every few seconds (or pmcp_expire_leases).""",
            properties={},
            output=shapes.EXPIRE_RESULT.schema(),
            call=lambda o, a: s.expire_result(o.expire_leases(**a)),
        ),
        # -- tasks: read --------------------------------------------------------------------
        _tool(
            "get_task",
            title="Get a task",
            group="read",
            permission="parallel_mcp.view_task",
            description="""
                Read one task: status, attempts, input, output, error, progress, lease and the
                ids it depends on. `task` is null when no task has that id.""",
            properties={"task_id": TASK_ID},
            required=("task_id",),
            output=out(task=nullable(TASK_OUT)),
            call=lambda o, a: _one("task", s.task)(o.get_task(**a)),
        ),
        _tool(
            "list_run_tasks",
            title="List a run's tasks",
            group="read",
            permission="parallel_mcp.view_task",
            description="Every task of a run, oldest first (not_found when no run has that id).",
            properties={"run_id": RUN_ID},
            required=("run_id",),
            output=tasks_out,
            call=_of_known_run(lambda o, a: {"tasks": s.tasks(o.list_run_tasks(**a))}),
        ),
        _tool(
            "list_pending_tasks",
            title="List queued tasks",
            group="read",
            permission="parallel_mcp.view_task",
            description="""
                Queued tasks in the order claims take them (priority, then age), optionally of one
                run or some kinds. With `ready_by`, only those a claim at that time could take
                (dependencies done, not_before passed).""",
            properties={
                "run_id": nullable(uuid("Only tasks of this run.")),
                "kinds": kinds_schema("Only tasks of these kinds."),
                "ready_by": nullable(timestamp("Only tasks claimable at this time.")),
                "limit": limit_schema(list_limit),
            },
            output=tasks_out,
            call=lambda o, a: {"tasks": s.tasks(o.list_pending_tasks(**a))},
            datetimes=("ready_by",),
        ),
        _tool(
            "list_dead_tasks",
            title="List dead-lettered tasks",
            group="read",
            permission="parallel_mcp.view_task",
            description="""
                The dead-letter queue: tasks that failed after their last attempt, most recent
                first. requeue_dead_task gives one another chance.""",
            properties={
                "run_id": nullable(uuid("Only tasks of this run.")),
                "kinds": kinds_schema("Only tasks of these kinds."),
                "limit": limit_schema(list_limit),
                "offset": offset_schema(),
            },
            output=tasks_out,
            call=lambda o, a: {"tasks": s.tasks(o.list_dead_tasks(**a))},
        ),
        _tool(
            "explain_task",
            title="Explain why a task is not running",
            group="read",
            permission="parallel_mcp.view_task",
            description="""
                Why an unfinished task is not running: each blocker names its kind
                (dependency_pending, dependency_failed, not_before, paused, leased, run_limit,
                run_cancelled, no_worker), the task or time involved and a sentence of
                explanation. An empty list means the next claim can take it and a running worker
                handles its kind.""",
            properties={"task_id": TASK_ID},
            required=("task_id",),
            output=out(blockers=many(BLOCKER_OUT)),
            call=lambda o, a: {"blockers": [s.blocker(b) for b in o.explain_task(**a)]},
        ),
        _tool(
            "list_stuck_tasks",
            title="List stuck tasks",
            group="read",
            permission="parallel_mcp.view_task",
            description="""
                Leased or running tasks whose worker still heart-beats but whose attempt has run
                longer than `running_longer_than_ms` or the task's own timeout_ms: typically a
                wedged worker. Longest-running first, each with `running_for_ms`.""",
            properties={
                "running_longer_than_ms": nullable(
                    arg(args.THRESHOLD_MS, "The threshold in ms (default: each task's timeout_ms).")
                ),
            },
            output=tasks_out,
            call=lambda o, a: {"tasks": s.tasks(o.list_stuck_tasks(**a))},
        ),
        # -- the worker protocol ------------------------------------------------------------
        _tool(
            "claim_next_task",
            title="Claim the next task",
            group="worker",
            permission="parallel_mcp.work_tasks",
            description="""
                Take the next ready task (highest priority, then oldest) under a lease. `claim`
                is null when nothing is ready. Keep claim.task.id and claim.lease.id: every
                later call about the task needs them and your worker_id. Call
                mark_task_running when you start (or pass `start` true to claim it already
                running), heartbeat_lease before claim.lease.expires_at if the work takes long,
                and finish with complete_task, fail_task, pause_task or release_task.""",
            properties=claim_properties,
            required=("worker_id",),
            output=out(claim=nullable(CLAIM_OUT)),
            call=lambda o, a: _one("claim", s.claim)(o.claim_next_task(**a)),
        ),
        _tool(
            "claim_next_tasks",
            title="Claim several tasks",
            group="worker",
            permission="parallel_mcp.work_tasks",
            description=f"""
                Take up to `limit` ready tasks (1-{MAX_CLAIM_BATCH}) at once, each under its own
                lease, in one transaction and in claim order (highest priority, then oldest).
                `claims` is empty when nothing is ready and may be shorter than `limit` (fewer
                ready tasks; a run with max_parallel gives one task per call). Treat each claim
                as one from claim_next_task: keep its task.id and lease.id, heartbeat each
                lease, and finish each task on its own. With `client_token`, lease n gets the
                token `<client_token>#<n>` and repeating the call with the same token replays
                the whole batch.""",
            properties={
                "worker_id": WORKER_ID,
                "limit": arg(
                    args.CLAIM_LIMIT, f"How many tasks to claim at most (1-{MAX_CLAIM_BATCH})."
                ),
                **claim_properties,
                "client_token": nullable(
                    text(
                        "An idempotency key for the whole batch: repeating the call with the "
                        "same token replays the same claims. Never reuse a token for another "
                        "call.",
                        args.BATCH_TOKEN,
                    )
                ),
            },
            required=("worker_id", "limit"),
            output=out(claims=many(CLAIM_OUT)),
            call=lambda o, a: {"claims": s.claims(o.claim_next_tasks(**a))},
        ),
        _tool(
            "mark_task_running",
            title="Mark a claimed task running",
            group="worker",
            permission="parallel_mcp.work_tasks",
            description="Record that you started working on a task you claimed (leased → running).",
            properties=dict(worker_refs),
            required=worker_required,
            output=task_out,
            call=lambda o, a: {"task": s.task(o.mark_task_running(**a))},
        ),
        _tool(
            "heartbeat_lease",
            title="Extend a lease",
            group="worker",
            permission="parallel_mcp.work_tasks",
            description="""
                Extend your lease on a task to now + lease_ms. Call it well before
                lease.expires_at while you work. A lease_conflict error means the task was
                cancelled or taken from you: stop working on it.""",
            properties={
                **worker_refs,
                "lease_ms": lease_ms_schema(
                    "The new lease length from now, in ms (default: the server's default lease)."
                ),
            },
            required=worker_required,
            output=out(lease=LEASE_OUT),
            call=lambda o, a: {"lease": s.lease(o.heartbeat_lease(**a))},
        ),
        _tool(
            "report_progress",
            title="Report progress",
            group="worker",
            permission="parallel_mcp.work_tasks",
            description="Record how far along a task you hold is (0.0 to 1.0), with a message.",
            properties={
                **worker_refs,
                "progress": {
                    "type": "number",
                    "minimum": 0,
                    "maximum": 1,
                    "description": "Share done, from 0.0 to 1.0.",
                },
                "message": nullable(text("What is happening now.", args.REASON)),
            },
            required=(*worker_required, "progress"),
            output=task_out,
            call=lambda o, a: {"task": s.task(o.report_progress(**a))},
        ),
        _tool(
            "pause_task",
            title="Pause a task",
            group="worker",
            permission="parallel_mcp.work_tasks",
            description="""
                Park a task you hold and give up its lease: `waiting_input` when it needs an
                answer (resume_task brings it back, optionally with new input), `blocked` when it
                must wait. With `blocked_by` (task ids of the same run) it is queued again
                automatically once all of those tasks complete. With `input_requests`
                (`waiting_input`, a task of a run created by an MCP tool call) the MCP client
                that called the tool is asked, and the task is queued again once it has
                answered them all.""",
            properties={
                **worker_refs,
                "status": {
                    "type": "string",
                    "enum": ["blocked", "waiting_input"],
                    "description": "The paused state.",
                },
                "reason": nullable(text("Why, for whoever resumes it.", args.REASON)),
                "blocked_by": nullable(
                    {
                        "type": "array",
                        "items": {"type": "string", "format": "uuid"},
                        "minItems": 1,
                        "description": "Resume automatically when these tasks have completed.",
                    }
                ),
                "input_requests": nullable(
                    arg(
                        args.INPUT_REQUESTS,
                        "With waiting_input: what to ask the MCP client that called the tool, "
                        "{key: {method: elicitation/create | sampling/createMessage | "
                        "roots/list, params: {...}}}; keys are unique in the run.",
                    )
                ),
            },
            required=(*worker_required, "status"),
            output=task_out,
            call=lambda o, a: {"task": s.task(o.pause_task(**a))},
        ),
        _tool(
            "complete_task",
            title="Complete a task",
            group="worker",
            permission="parallel_mcp.work_tasks",
            description="""
                Finish a task you hold successfully with its output. Tasks depending on it may
                become claimable. With `next_context`, that JSON becomes the run's new current
                context snapshot in the same transaction.""",
            properties={
                **worker_refs,
                "output": json_value("The task's result."),
                "metadata": json_value("Free-form metadata about this attempt."),
                "next_context": json_value("A new shared context for the run (optional)."),
                "next_context_label": nullable(text("A label for that context snapshot.")),
                "client_token": CLIENT_TOKEN,
            },
            required=worker_required,
            output=task_out,
            call=lambda o, a: {"task": s.task(o.complete_task(**a))},
        ),
        _tool(
            "fail_task",
            title="Fail a task",
            group="worker",
            permission="parallel_mcp.work_tasks",
            description="""
                Report that a task you hold failed. With `retry` false (default) the failure is
                final. With `retry` true the task is queued again after its backoff while
                attempts remain, and dead-lettered when none do.""",
            properties={
                **worker_refs,
                "error": text("What went wrong.", args.ERROR),
                "metadata": json_value("Free-form metadata about this attempt."),
                "retry": {
                    "type": "boolean",
                    "description": "Try again if attempts remain (default false).",
                },
                "client_token": CLIENT_TOKEN,
            },
            required=(*worker_required, "error"),
            output=task_out,
            call=lambda o, a: {"task": s.task(o.fail_task(**a))},
        ),
        _tool(
            "release_task",
            title="Release a task",
            group="worker",
            permission="parallel_mcp.work_tasks",
            description="""
                Give a task you hold back to the queue without an outcome (for example when
                shutting down); it does not use up an attempt.""",
            properties={
                **worker_refs,
                "reason": nullable(text("Why, for the event log.", args.REASON)),
            },
            required=worker_required,
            output=task_out,
            call=lambda o, a: {"task": s.task(o.release_task(**a))},
        ),
        # -- context and events -------------------------------------------------------------
        _tool(
            "append_context_snapshot",
            title="Append a context snapshot",
            group="write",
            permission="parallel_mcp.operate_runs",
            description="""
                Store a new piece of shared context for a run. A run-scope snapshot becomes the
                run's current context; a task-scope one (with task_id) is kept for that task.""",
            properties={
                "run_id": RUN_ID,
                "payload": json_value("The context."),
                "scope": {
                    "type": "string",
                    "enum": list(SCOPES),
                    "description": "run (default) or task.",
                },
                "label": nullable(text("A label, e.g. 'after-research'.")),
                "task_id": nullable(uuid("The task a task-scope snapshot belongs to.")),
                "parent_snapshot_id": nullable(uuid("The snapshot this one derives from.")),
                "id": nullable(uuid("Choose the snapshot's id yourself (optional).")),
            },
            required=("run_id", "payload"),
            output=out(snapshot=SNAPSHOT_OUT),
            call=lambda o, a: {"snapshot": s.snapshot(o.append_context_snapshot(**a))},
        ),
        _tool(
            "get_current_context_snapshot",
            title="Get a run's current context",
            group="read",
            permission="parallel_mcp.view_contextsnapshot",
            description="""
                The run's current shared context snapshot (its JSON payload and label), or null
                when it has none.""",
            properties={"run_id": RUN_ID},
            required=("run_id",),
            output=out(snapshot=nullable(SNAPSHOT_OUT)),
            call=lambda o, a: _one("snapshot", s.snapshot)(o.get_current_context_snapshot(**a)),
        ),
        _tool(
            "list_run_events",
            title="List a run's events",
            group="read",
            permission="parallel_mcp.view_event",
            description="""
                A run's whole event log in order (run.created, task.enqueued, task.claimed,
                task.completed, …); not_found when no run has that id. For long runs page with
                list_events_since instead.""",
            properties={"run_id": RUN_ID},
            required=("run_id",),
            output=out(events=many(EVENT_OUT)),
            call=_of_known_run(lambda o, a: {"events": s.events(o.list_run_events(**a))}),
        ),
        _tool(
            "list_events_since",
            title="Follow the event feed",
            group="read",
            permission="parallel_mcp.view_event",
            description="""
                The next page of events after `after_id`, in order, optionally for one run or some
                event types. Pass the returned `next_cursor` as `after_id` next time: you never
                miss an event. next_cursor is null only when there was nothing and no after_id.""",
            properties={
                "after_id": nullable(arg(args.EVENT_ID, "The last event id you have seen.")),
                "run_id": nullable(uuid("Only events of this run.")),
                "event_types": nullable(
                    {
                        "type": "array",
                        "items": args.EVENT_TYPE.schema(),
                        "maxItems": args.EVENT_TYPES.max_items,
                        "description": "Only these event types, e.g. ['task.completed'].",
                    }
                ),
                "limit": limit_schema(event_limit),
            },
            output=out(events=many(EVENT_OUT), next_cursor=nullable({"type": "integer"})),
            call=lambda o, a: s.event_page(o.list_events_since(**a)),
        ),
    ]
    return {spec.name: spec for spec in specs}


@receiver(setting_changed)
def _limits_changed(*, setting: str, **kwargs: Any) -> None:
    # Some limits are settings (MAX_LIST_LIMIT, MAX_LEASE_MS): the schemas state their values.
    if setting == "PARALLEL_MCP":
        tool_specs.cache_clear()


def tools_in(groups: tuple[str, ...] | frozenset[str]) -> list[ToolSpec]:
    return [spec for spec in tool_specs().values() if spec.group in groups]


ROLE_GROUPS = ROLE_ACCESS  # a tool's group is its kind of access (parallel_mcp.contract.roles)

"""Helpers for the MCP tests: spawn the real server (stdio or HTTP) and talk to it with the SDK's
own client session."""

from __future__ import annotations

import gc
import json
import re
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal

import anyio
import anyio.to_thread
import httpx2
import jsonschema
import mcp_types
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.extension import ClientExtension, NotificationBinding, ResultClaim
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import ConfigDict, TypeAdapter

from parallel_mcp.mcp.auth import in_db_thread
from parallel_mcp.mcp.hosts import resolve_bind
from tests.subprocesses import REPO, subprocess_env

SERVER = [sys.executable, "-m", "django", "pmcp_mcp", "--settings=tests.settings"]
UNKNOWN = "00000000-0000-4000-8000-000000000000"
# A raw JSON-RPC initialize request, for tests that speak HTTP without the SDK.
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "raw", "version": "1"},
    },
}


def stdio_parameters(*options: str, settings: str = "tests.settings") -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=[*SERVER[1:-1], f"--settings={settings}", *options],
        env=subprocess_env(),
        cwd=str(REPO),
    )


def superuser_token(username: str) -> str:
    """The secret of a new ``full`` token of the superuser ``username`` (created if needed)."""
    from django.contrib.auth.models import User

    from parallel_mcp.services.tokens import create_token

    user = User.objects.filter(username=username).first() or User.objects.create_superuser(
        username, password="pw"
    )
    return create_token(using="default", user=user, name=f"{username} token").secret


async def in_db(function: Callable[[], Any]) -> Any:
    """``function()`` (an ORM read, say) in a worker thread, from async test code, with the
    database connections it opens closed afterwards, as the server does for its own calls: a
    connection left open in an anyio thread outlives the test (PostgreSQL then refuses to drop
    the test database, and Python 3.13 warns about the unclosed SQLite connection)."""
    return await anyio.to_thread.run_sync(in_db_thread, function)


@pytest.fixture(autouse=True)
def no_connection_left_open():
    """Autouse where imported: after the test, no database connection is open but the test
    thread's own. Not collected first, so that a connection dropped without being closed
    (left in a finished thread) is still found."""
    from django.db import connections
    from django.db.backends.base.base import BaseDatabaseWrapper

    yield
    own = {id(wrapper) for wrapper in connections.all(initialized_only=True)}
    left = [
        f"{wrapper.alias} ({wrapper.vendor})"
        for wrapper in gc.get_objects()
        # type(), not isinstance(): a weakref proxy whose object died (a library's
        # per-view cache of weak references holds some) raises ReferenceError on isinstance.
        if issubclass(type(wrapper), BaseDatabaseWrapper)
        and wrapper.connection is not None
        and id(wrapper) not in own
    ]
    assert not left, f"database connections left open by other threads: {left}"


@asynccontextmanager
async def stdio_session(*options: str) -> AsyncIterator[ClientSession]:
    """An initialized client session with a freshly spawned ``pmcp_mcp`` over stdio."""
    with tempfile.TemporaryFile(mode="w+") as errlog:
        async with stdio_client(stdio_parameters(*options), errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


@asynccontextmanager
async def stdio_tasks_session(*options: str, settings: str) -> AsyncIterator[ClientSession]:
    """A 2026-07-28 session (``server/discover``, no handshake) with a freshly spawned
    ``pmcp_mcp`` over stdio, declaring the io.modelcontextprotocol/tasks extension."""
    with tempfile.TemporaryFile(mode="w+") as errlog:
        parameters = stdio_parameters(*options, settings=settings)
        async with stdio_client(parameters, errlog=errlog) as (read, write):
            async with ClientSession(read, write, **tasks_session_options()) as session:
                await session.discover()
                yield session


@asynccontextmanager
async def http_tasks_session(
    url: str, token: str | None = None, *, on_task: Any = None
) -> AsyncIterator[ClientSession]:
    """As ``stdio_tasks_session``, over streamable HTTP (``on_task``: see TasksExtension)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0)) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            options = tasks_session_options(on_task)
            async with ClientSession(read, write, **options) as session:
                await session.discover()
                yield session


@asynccontextmanager
async def http_session(url: str, token: str | None = None) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0)) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


# -- what TypeScript clients check -------------------------------------------------------------
# The TypeScript SDK 1.x ``Client`` (the MCP Inspector 0.15 and 2.x, and most JavaScript hosts)
# compiles each listed tool's ``outputSchema`` with Ajv (draft-07, ``strict: false``,
# ``validateSchema: false``, ajv-formats' full formats) and, in ``callTool``:
#
#   if (validator) {
#     if (!result.structuredContent && !result.isError) throw McpError(InvalidRequest,
#         `Tool ${name} has an output schema but did not return structured content`);
#     if (result.structuredContent) { ... validator(result.structuredContent) ...
#         throw McpError(InvalidParams, `Structured content does not match the tool's output
#         schema: ${errorsText}`) }
#   }
#
# so structuredContent is validated on errors too: an error envelope there made the client show
# "data must have required property 'task'" instead of the server's message (issue 14, item 8).

# ajv-formats 3 ("full" mode), the two formats the schemas use.
_AJV_UUID = re.compile(r"^(?:urn:uuid:)?[0-9a-f]{8}-(?:[0-9a-f]{4}-){3}[0-9a-f]{12}$", re.I)
_AJV_DATE = re.compile(r"^(\d\d\d\d)-(\d\d)-(\d\d)$")
_AJV_TIME = re.compile(r"^(\d\d):(\d\d):(\d\d(?:\.\d+)?)(z|([+-])(\d\d)(?::?(\d\d))?)?$", re.I)
_AJV_DAYS = (0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)
AJV_FORMATS = jsonschema.FormatChecker([])


@AJV_FORMATS.checks("uuid")
def _ajv_uuid(value: object) -> bool:
    return not isinstance(value, str) or bool(_AJV_UUID.match(value))


@AJV_FORMATS.checks("date-time")
def _ajv_date_time(value: object) -> bool:
    """ajv-formats' ``date-time``: RFC 3339 with a mandatory time zone."""
    if not isinstance(value, str):
        return True
    parts = re.split(r"t|\s", value, flags=re.I)
    if len(parts) != 2:
        return False
    date, time_ = _AJV_DATE.match(parts[0]), _AJV_TIME.match(parts[1])
    if not date or not time_ or not time_[4]:
        return False
    year, month, day = (int(group) for group in date.groups())
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    if not 1 <= month <= 12 or not 1 <= day <= (29 if month == 2 and leap else _AJV_DAYS[month]):
        return False
    if int(time_[6] or 0) > 23 or int(time_[7] or 0) > 59:
        return False
    # (ajv-formats also accepts a leap second at 23:59:60 UTC; the server never writes one.)
    return int(time_[1]) <= 23 and int(time_[2]) <= 59 and float(time_[3]) < 60


def typescript_client_check(tool: str, output_schema: dict[str, Any] | None, result: Any) -> None:
    """Fail the way the TypeScript SDK 1.x ``Client.callTool`` fails on ``result`` (the
    ``CallToolResult`` as the wire has it), for a tool listed with ``output_schema``."""
    if output_schema is None:
        return
    structured = result.get("structuredContent")  # JS: absent and null are both falsy
    if structured is None and not result.get("isError"):
        raise AssertionError(
            f"Tool {tool} has an output schema but did not return structured content"
        )
    if structured is not None:
        validator = jsonschema.Draft7Validator(output_schema, format_checker=AJV_FORMATS)
        problems = [
            f"data{''.join(f'/{part}' for part in error.absolute_path)} {error.message}"
            for error in validator.iter_errors(structured)
        ]
        if problems:
            raise AssertionError(
                f"{tool}: Structured content does not match the tool's output schema: "
                + ", ".join(problems)
            )


def wire(result: Any) -> dict[str, Any]:
    """A result model as its JSON on the wire (camelCase keys, absent fields left out)."""
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


def error_of(tool: str, result: dict[str, Any]) -> dict[str, Any]:
    """The ``error`` object of a failed call as every client shows it: ``isError`` and the
    envelope as text (the only place a client that knows nothing of this server looks)."""
    assert result.get("isError") is True, f"{tool} unexpectedly succeeded: {result}"
    texts = [item["text"] for item in result.get("content", []) if item.get("type") == "text"]
    assert len(texts) == 1, f"{tool}: an error should be one text block, got {result}"
    envelope = json.loads(texts[0])
    assert set(envelope) == {"error"}, envelope
    error = envelope["error"]
    assert set(error) == {"code", "message", "details"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["details"], dict), error
    return error


_OUTPUT_SCHEMAS: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()


async def output_schemas(session: ClientSession) -> dict[str, Any]:
    """The output schema of each tool the server lists to this session (what a TypeScript
    client caches from tools/list); read once per session."""
    if session not in _OUTPUT_SCHEMAS:
        tools = (await session.list_tools()).tools
        _OUTPUT_SCHEMAS[session] = {tool.name: tool.output_schema for tool in tools}
    return _OUTPUT_SCHEMAS[session]


async def checked_call(session: ClientSession, tool: str, arguments: Any) -> dict[str, Any]:
    """Call ``tool`` and check the result as a TypeScript client would (see above); the
    result's wire JSON back. The Python SDK checks successful results itself."""
    result = wire(await session.call_tool(tool, arguments))
    schema = (await output_schemas(session)).get(tool)
    typescript_client_check(tool, schema, result)
    return result


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """The structured result of a successful call (checked against the output schema as the
    Python and TypeScript SDKs check it)."""
    result = await checked_call(session, tool, arguments)
    assert not result.get("isError"), f"{tool} failed: {result}"
    assert isinstance(result.get("structuredContent"), dict), result
    assert json.loads(result["content"][0]["text"]) == result["structuredContent"]
    return result["structuredContent"]


async def fail(session: ClientSession, tool: str, arguments: Any = None) -> dict[str, Any]:
    """The ``error`` object of a call that must fail as a tool error, readable by every
    client (checked as a TypeScript client checks it)."""
    result = await checked_call(session, tool, {} if arguments is None else arguments)
    return error_of(tool, result)


async def tool_names(session: ClientSession) -> set[str]:
    return {tool.name for tool in (await session.list_tools()).tools}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def connect_address(host: str) -> str:
    """The address a client on this machine reaches a server bound to ``host`` at."""
    bound = resolve_bind(host, 0).address
    return "127.0.0.1" if bound.is_unspecified else str(bound)


class LiveServer:
    """``pmcp_mcp --transport http`` in a subprocess on a free port of ``host`` (loopback by
    default), with the test settings or another settings module; or, with ``project``
    (``(manage.py, environment)``), another project's ``manage.py pmcp_mcp``."""

    def __init__(
        self,
        *options: str,
        host: str | None = None,
        settings: str = "tests.settings",
        wait: bool = True,
        project: tuple[Any, dict[str, str]] | None = None,
    ) -> None:
        self.port = free_port()
        self.address = connect_address(host or "127.0.0.1")
        shown = f"[{self.address}]" if ":" in self.address else self.address
        self.url = f"http://{shown}:{self.port}/mcp"
        self.stderr = tempfile.TemporaryFile(mode="w+")
        if project is None:
            command = [*SERVER[:-1], f"--settings={settings}", "--transport", "http"]
            cwd, env = REPO, subprocess_env()
        else:
            manage_py, env = project
            command = [sys.executable, str(manage_py), "pmcp_mcp", "--transport", "http"]
            cwd = manage_py.parent
        if host is not None:
            command += ["--host", host]
        self.process = subprocess.Popen(
            [*command, "--port", str(self.port), *options],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self.stderr,
        )
        if wait:  # else call wait_until_listening(), e.g. after starting several at once
            self.wait_until_listening()

    def log(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read()

    def wait_until_listening(self, timeout: float = 120.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise AssertionError(f"pmcp_mcp exited ({self.process.returncode}):\n{self.log()}")
            try:
                with socket.create_connection((self.address, self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.1)
        log = self.log()
        self.stop()
        raise AssertionError(f"pmcp_mcp did not listen within {timeout}s:\n{log}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:  # pragma: no cover
                self.process.kill()
                self.process.wait(timeout=10)
        self.stderr.close()


async def full_run(planner, worker, reader) -> None:
    """Plan a run with a dependency, work it as a worker, watch it as a reader."""
    run = (
        await call(
            planner, "create_run", namespace="mcp", context={"step": 0}, metadata={"via": "mcp"}
        )
    )["run"]
    assert run["status"] == "pending" and run["current_context_snapshot_id"]
    first = (
        await call(
            planner, "enqueue_task", run_id=run["id"], kind="research", key="first", input={"q": 1}
        )
    )["task"]
    second = (
        await call(
            planner,
            "enqueue_task",
            run_id=run["id"],
            kind="write",
            key="second",
            depends_on=[first["id"]],
        )
    )["task"]
    assert second["depends_on_task_ids"] == [first["id"]] and second["status"] == "queued"
    blockers = (await call(reader, "explain_task", task_id=second["id"]))["blockers"]
    assert [(b["kind"], b["task_id"]) for b in blockers] == [("dependency_pending", first["id"])]

    claim = (await call(worker, "claim_next_task", worker_id="agent-1", lease_ms=60_000))["claim"]
    assert claim["task"]["id"] == first["id"] and claim["task"]["input"] == {"q": 1}
    assert claim["run"]["id"] == run["id"] and claim["attempt"]["status"] == "leased"
    lease = claim["lease"]
    refs = {"task_id": first["id"], "lease_id": lease["id"], "worker_id": "agent-1"}
    assert (await call(worker, "claim_next_task", worker_id="agent-2"))["claim"] is None

    assert (await call(worker, "mark_task_running", **refs))["task"]["status"] == "running"
    beat = (await call(worker, "heartbeat_lease", **refs, lease_ms=120_000))["lease"]
    assert beat["id"] == lease["id"] and beat["expires_at"] > lease["expires_at"]
    half = (await call(worker, "report_progress", **refs, progress=0.5, message="half"))["task"]
    assert half["progress"] == 0.5 and half["progress_message"] == "half"
    done = (
        await call(
            worker,
            "complete_task",
            **refs,
            output={"answer": 42},
            next_context={"step": 1},
            next_context_label="after-first",
        )
    )["task"]
    assert done["status"] == "completed" and done["output"] == {"answer": 42}
    assert done["progress"] == 1.0
    snapshot = (await call(reader, "get_current_context_snapshot", run_id=run["id"]))["snapshot"]
    assert snapshot["payload"] == {"step": 1} and snapshot["label"] == "after-first"

    claim = (await call(worker, "claim_next_task", worker_id="agent-1"))["claim"]
    assert claim["task"]["id"] == second["id"]
    refs = {"task_id": second["id"], "lease_id": claim["lease"]["id"], "worker_id": "agent-1"}
    await call(worker, "complete_task", **refs, output="written")

    run = (await call(reader, "get_run", run_id=run["id"]))["run"]
    assert run["status"] == "completed" and run["tasks_completed"] == 2
    assert run["progress"] == 1.0
    tasks = (await call(reader, "list_run_tasks", run_id=run["id"]))["tasks"]
    assert [task["key"] for task in tasks] == ["first", "second"]
    assert {task["status"] for task in tasks} == {"completed"}

    events = (await call(reader, "list_run_events", run_id=run["id"]))["events"]
    types = [event["event_type"] for event in events]
    assert types[0] == "run.created" and types.count("task.completed") == 2
    for expected in ("task.enqueued", "task.claimed", "task.running", "task.lease_heartbeat"):
        assert expected in types
    assert "context.snapshot.created" in types and "task.progress" in types
    page = await call(reader, "list_events_since", run_id=run["id"], limit=3)
    assert [e["id"] for e in page["events"]] == [e["id"] for e in events[:3]]
    assert page["next_cursor"] == events[2]["id"]
    rest = await call(
        reader, "list_events_since", run_id=run["id"], after_id=page["next_cursor"], limit=1000
    )
    assert [e["id"] for e in page["events"] + rest["events"]] == [e["id"] for e in events]
    empty = await call(reader, "list_events_since", run_id=run["id"], after_id=events[-1]["id"])
    assert empty == {"events": [], "next_cursor": events[-1]["id"]}
    only = await call(reader, "list_events_since", event_types=["task.completed"], limit=10)
    assert [e["task_id"] for e in only["events"]] == [first["id"], second["id"]]

    # The same state through the resources.
    body = await reader.read_resource(f"pmcp://runs/{run['id']}")
    content = json.loads(body.contents[0].text)
    assert content["run"]["status"] == "completed" and len(content["tasks"]) == 2
    assert body.contents[0].mime_type == "application/json"
    body = await reader.read_resource(f"pmcp://runs/{run['id']}/events")
    assert [e["id"] for e in json.loads(body.contents[0].text)["events"]] == [
        e["id"] for e in events
    ]
    listed = await reader.list_resources()
    assert f"pmcp://runs/{run['id']}" in {str(resource.uri) for resource in listed.resources}
    templates = await reader.list_resource_templates()
    assert {t.uri_template for t in templates.resource_templates} == {
        "pmcp://runs/{run_id}",
        "pmcp://runs/{run_id}/events",
    }
    with pytest.raises(MCPError) as missing:
        await reader.read_resource(f"pmcp://runs/{UNKNOWN}")
    assert missing.value.code == -32002
    with pytest.raises(MCPError) as malformed:
        await reader.read_resource("pmcp://runs/not-a-uuid/events")
    assert malformed.value.code == -32602


# -- what the MCP Inspector's --strict check reports ----------------------------------------------
# A mirror of the Inspector 2.x schema lint (core/json/schemaLint.ts), which `inspector --cli
# --method tools/list` summarises and `--strict` details: a bare boolean schema (error), a `type`
# array (warning: clients that map schemas onto a single-type dialect reject it), a remote `$ref`
# (warning) and a schema with no validation keyword, such as `{}` for "any JSON" (warning).
_LINT_SUBSCHEMA = (
    "items",
    "contains",
    "not",
    "propertyNames",
    "if",
    "then",
    "else",
    "additionalProperties",
    "unevaluatedProperties",
    "additionalItems",
    "unevaluatedItems",
    "contentSchema",
)
_LINT_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_LINT_SUBSCHEMA_MAPS = (
    "properties",
    "patternProperties",
    "dependentSchemas",
    "dependencies",
    "$defs",
    "definitions",
)
_LINT_BOOLEAN_ALLOWED = (
    "additionalProperties",
    "unevaluatedProperties",
    "additionalItems",
    "unevaluatedItems",
)
_LINT_CONSTRAINING = frozenset(
    {
        *("type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum"),
        *("exclusiveMinimum", "maxLength", "minLength", "pattern", "format", "contentMediaType"),
        *("contentEncoding", "contentSchema", "maxItems", "minItems", "uniqueItems"),
        *("maxContains", "minContains", "maxProperties", "minProperties", "required"),
        *("dependentRequired", "allOf", "anyOf", "oneOf", "not", "items", "prefixItems"),
        *("contains", "additionalItems", "unevaluatedItems", "properties", "patternProperties"),
        *("additionalProperties", "unevaluatedProperties", "propertyNames", "dependentSchemas"),
        *("dependencies", "$ref", "$dynamicRef", "$recursiveRef"),
    }
)


def portability_findings(schema: Any, path: str = "", keyword: str | None = None) -> list[str]:
    """What the Inspector's ``--strict`` check reports about ``schema``, one line each."""
    if isinstance(schema, bool):
        return [] if keyword in _LINT_BOOLEAN_ALLOWED else [f"{path}: bare boolean schema"]
    if not isinstance(schema, dict):
        return []
    found = []
    if isinstance(schema.get("type"), list):
        found.append(f"{path}: `type` is an array {schema['type']}")
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref and not ref.startswith("#"):
        found.append(f"{path}: remote $ref {ref}")
    constrains = bool(_LINT_CONSTRAINING & set(schema)) or (
        "if" in schema and ("then" in schema or "else" in schema)
    )
    if not constrains and keyword != "not":
        found.append(f"{path}: no validation keyword (accepts any value)")
    for key in _LINT_SUBSCHEMA_MAPS:
        if isinstance(schema.get(key), dict):
            for name, sub in schema[key].items():
                found += portability_findings(sub, f"{path}.{key}.{name}", key)
    for key in _LINT_SUBSCHEMA_LISTS:
        if isinstance(schema.get(key), list):
            for index, sub in enumerate(schema[key]):
                found += portability_findings(sub, f"{path}.{key}[{index}]", key)
    for key in _LINT_SUBSCHEMA:
        if key in schema:
            subs = (
                schema[key] if key == "items" and isinstance(schema[key], list) else [schema[key]]
            )
            for sub in subs:
                found += portability_findings(sub, f"{path}.{key}", key)
    return found


# -- the io.modelcontextprotocol/tasks extension, as a client speaks it -------------------------
TASKS_EXTENSION = "io.modelcontextprotocol/tasks"


class CreateTaskResult(mcp_types.Result):
    """A task handle (``resultType: "task"``) as the official client parses a claimed shape."""

    model_config = ConfigDict(extra="allow")
    result_type: Literal["task"]
    task_id: str
    status: str
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None = None


class TaskParams(mcp_types.RequestParams):
    task_id: str


class UpdateTaskParams(TaskParams):
    input_responses: Any


class GetTaskRequest(mcp_types.Request[TaskParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskParams
    name_param = "taskId"


class UpdateTaskRequest(mcp_types.Request[UpdateTaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateTaskParams
    name_param = "taskId"


class CancelTaskRequest(mcp_types.Request[TaskParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskParams
    name_param = "taskId"


_RAW = TypeAdapter(dict[str, Any])


async def _not_resolved(result: Any, context: Any) -> Any:  # pragma: no cover
    raise AssertionError("the tests read task handles with allow_claimed=True")


class TaskNotificationParams(mcp_types.NotificationParams):
    """``notifications/tasks`` params: a DetailedTask (and the listen stream's ``_meta``)."""

    model_config = ConfigDict(extra="allow")


class TasksExtension(ClientExtension):
    """Declares the extension in every request's capabilities (2026-07-28) and parses the
    ``task`` result of tools/call; with ``on_task``, receives ``notifications/tasks`` (each
    as its wire JSON)."""

    identifier = TASKS_EXTENSION

    def __init__(self, on_task: Callable[[dict[str, Any]], Awaitable[None]] | None = None):
        self.on_task = on_task

    def claims(self) -> list[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=_not_resolved)]

    def notifications(self) -> list[NotificationBinding[Any]]:
        if self.on_task is None:
            return []
        return [
            NotificationBinding(
                method="notifications/tasks",
                params_type=TaskNotificationParams,
                handler=self._task,
            )
        ]

    async def _task(self, params: TaskNotificationParams) -> None:
        assert self.on_task is not None
        await self.on_task(params.model_dump(by_alias=True, mode="json", exclude_none=False))


def tasks_session_options(on_task: Any = None) -> dict[str, Any]:
    """ClientSession keyword arguments that declare the extension (and, with ``on_task``,
    receive notifications/tasks)."""
    extension = TasksExtension(on_task)
    return {
        "extensions": {TASKS_EXTENSION: {}},
        "result_claims": {TASKS_EXTENSION: tuple(extension.claims())},
        "notification_bindings": extension.notifications(),
    }


async def call_for_task(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """tools/call that must answer with a task handle; the handle's wire JSON back."""
    result = await session.call_tool(tool, arguments, allow_claimed=True)
    assert isinstance(result, CreateTaskResult), f"{tool}: expected a task handle, got {result}"
    return result.model_dump(by_alias=True, mode="json", exclude_none=True)


async def get_task(session: ClientSession, task_id: str) -> dict[str, Any]:
    return await session.send_request(GetTaskRequest(params=TaskParams(task_id=task_id)), _RAW)


async def update_task(session: ClientSession, task_id: str, responses: Any) -> dict[str, Any]:
    request = UpdateTaskRequest(params=UpdateTaskParams(task_id=task_id, input_responses=responses))
    return await session.send_request(request, _RAW)


async def cancel_task(session: ClientSession, task_id: str) -> dict[str, Any]:
    return await session.send_request(CancelTaskRequest(params=TaskParams(task_id=task_id)), _RAW)


async def poll_task(
    session: ClientSession, task_id: str, until: Any, timeout: float = 60.0
) -> dict[str, Any]:
    """tasks/get until ``until(task)`` holds (honouring a short poll interval)."""
    deadline = time.monotonic() + timeout
    while True:
        task = await get_task(session, task_id)
        if until(task):
            return task
        if time.monotonic() > deadline:
            raise AssertionError(f"task {task_id} still {task['status']} after {timeout}s: {task}")
        await anyio.sleep(0.05)


@asynccontextmanager
async def listening(session: ClientSession, task_ids: list[str]) -> AsyncIterator[dict[str, Any]]:
    """``subscriptions/listen`` naming ``notifications.taskIds``, in the background, as a
    client of the extension sends it. The dict it yields gets ``result`` (the listen result,
    when the server ends the stream) or ``error``; the stream is dropped on exit."""
    outcome: dict[str, Any] = {}
    request = mcp_types.SubscriptionsListenRequest(
        params=mcp_types.SubscriptionsListenRequestParams(
            notifications=mcp_types.SubscriptionFilter.model_validate({"taskIds": task_ids})
        )
    )

    async def send() -> None:
        try:
            outcome["result"] = await session.send_request(request, _RAW)
        except MCPError as exc:
            outcome["error"] = exc

    async with anyio.create_task_group() as group:
        group.start_soon(send)
        yield outcome
        group.cancel_scope.cancel()


async def eventually(condition: Callable[[], Any], timeout: float = 60.0) -> None:
    """Wait until ``condition()`` holds (what a notification handler collected, say)."""
    deadline = anyio.current_time() + timeout
    while not condition():
        assert anyio.current_time() < deadline, f"still not true after {timeout}s"
        await anyio.sleep(0.02)


def settled(task: dict[str, Any]) -> bool:
    return task["status"] in ("completed", "failed", "cancelled")

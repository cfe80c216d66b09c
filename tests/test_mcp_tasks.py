"""MCP tools declared with @tool and the io.modelcontextprotocol/tasks extension, in process:
the official SDK client against the server, a worker in a thread running the tools."""

from __future__ import annotations

import functools
import itertools
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from types import SimpleNamespace

import anyio
import mcp_types
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import connections
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY as SUBSCRIPTION_ID
from pydantic import ConfigDict, TypeAdapter

from parallel_mcp import Orchestrator, selectors
from parallel_mcp.contract import limits
from parallel_mcp.exceptions import ValidationError
from parallel_mcp.mcp.declare import ToolArgumentsError, ToolRegistry, tool, tool_kind
from parallel_mcp.mcp.server import ParallelMcpServer
from parallel_mcp.mcp.task_notify import EventFeed
from parallel_mcp.mcp.task_state import mcp_status
from parallel_mcp.models import Event, InputRequest, Run, Task, ToolCall
from parallel_mcp.results import EventPage
from parallel_mcp.services.tool_calls import answer_input, start_tool_call
from parallel_mcp.worker.loop import Worker
from parallel_mcp.worker.registry import HandlerRegistry
from tests.mcp_support import (
    TASKS_EXTENSION,
    TasksExtension,
    call_for_task,
    cancel_task,
    error_of,
    eventually,
    get_task,
    in_db,
    listening,
    no_connection_left_open,  # noqa: F401 - autouse
    poll_task,
    settled,
    update_task,
    wire,
)
from tests.mcptools.definitions import NAME_REQUEST, approval_request, colour_request, declare

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def registries() -> tuple[ToolRegistry, HandlerRegistry]:
    tools, handlers = ToolRegistry(), HandlerRegistry()
    declare(tools, handlers)
    return tools, handlers


@contextmanager
def worker_running(handlers: HandlerRegistry) -> Iterator[Worker]:
    worker = Worker(
        registry=handlers,
        concurrency=4,
        listen=False,
        poll_min_ms=10,
        poll_max_ms=50,
        worker_id="mcp-tasks-test",
        drain_timeout_ms=1_000,
    )

    def target() -> None:
        try:
            worker.run()
        finally:
            connections.close_all()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    try:
        yield worker
    finally:
        worker.request_stop()
        thread.join(15)
        assert not thread.is_alive(), "the worker did not stop"


def client(tools: ToolRegistry, *, declare_tasks: bool = True, mode: str = "auto") -> Client:
    server = ParallelMcpServer(tools=tools).build()
    return Client(server, mode=mode, extensions=[TasksExtension()] if declare_tasks else None)


# -- declaring tools ---------------------------------------------------------------------------
def test_a_tool_is_a_handler_of_its_kind_with_a_schema_from_its_type_hints(registries):
    tools, handlers = registries
    definition = tools.get("add")
    assert definition.kind == tool_kind("add") == "mcp.tool.add"
    assert handlers.get("mcp.tool.add") == definition.run
    schema = definition.input_schema
    assert schema["type"] == "object" and schema["required"] == ["a"]
    assert schema["properties"]["a"]["type"] == "integer"
    assert schema["properties"]["b"] == {"default": 1, "title": "B", "type": "integer"}
    assert schema["additionalProperties"] is False
    assert definition.description == "Add two integers."
    assert definition.task_input({"a": 2}) == {"a": 2, "b": 1}
    with pytest.raises(ToolArgumentsError, match="a: Input should be a valid integer"):
        definition.task_input({"a": "2"})  # strict JSON types, as the schema says


@pytest.mark.parametrize(
    ("name", "options", "function", "message"),
    [
        ("bad name!", {}, lambda ctx: None, "tool name"),
        ("", {}, lambda ctx: None, "tool name"),
        ("x" * 129, {}, lambda ctx: None, "tool name"),
        ("ok", {"task": "sometimes"}, lambda ctx: None, "task must be one of"),
        ("ok", {}, lambda: None, "handler context as its first parameter"),
        ("ok", {}, lambda ctx, *rest: None, "named parameter"),
        ("ok", {}, lambda ctx, **rest: None, "named parameter"),
        ("ok", {}, lambda ctx, _private=1: None, "underscore"),
    ],
)
def test_a_bad_declaration_fails_at_start_up(name, options, function, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        tool(name, registry=ToolRegistry(), handlers=HandlerRegistry(), **options)(function)


def test_two_functions_cannot_declare_one_tool():
    tools, handlers = ToolRegistry(), HandlerRegistry()
    tool("twice", registry=tools, handlers=handlers)(lambda ctx: 1)
    with pytest.raises(ImproperlyConfigured, match="Two functions declare the MCP tool 'twice'"):
        tool("twice", registry=tools, handlers=handlers)(lambda ctx: 2)


def test_a_tool_named_like_an_orchestrator_tool_is_refused_unless_served_alone():
    tools, handlers = ToolRegistry(), HandlerRegistry()
    tool("create_run", registry=tools, handlers=handlers)(lambda ctx: 1)
    with pytest.raises(ImproperlyConfigured, match="create_run"):
        ParallelMcpServer(tools=tools)
    assert ParallelMcpServer(tools=tools, tools_only=True).visible == {"create_run"}


# -- the status mapping ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("run_status", "task_status", "asks", "expected"),
    [
        ("pending", "queued", False, "working"),
        ("active", "queued", False, "working"),
        ("active", "leased", False, "working"),
        ("active", "running", False, "working"),
        ("waiting", "blocked", False, "working"),
        ("waiting", "waiting_input", True, "input_required"),
        ("active", "blocked", True, "input_required"),  # a child task asks
        ("completed", "completed", False, "completed"),
        ("failed", "failed", False, "completed"),  # a tool error, in the result
        ("failed", "blocked", False, "completed"),
        ("cancelled", "cancelled", False, "cancelled"),
        ("cancelled", "completed", False, "cancelled"),
        ("active", "cancelled", False, "cancelled"),
    ],
)
def test_run_and_task_states_map_to_the_extension_statuses(run_status, task_status, asks, expected):
    assert mcp_status(run_status=run_status, task_status=task_status, asks_input=asks) == expected


# -- a client that declares the extension -------------------------------------------------------
def test_a_call_answers_with_a_durable_task_handle_and_tasks_get_follows_the_run(registries):
    tools, handlers = registries

    async def scenario():
        async with client(tools) as c:
            assert TASKS_EXTENSION in c.session.server_capabilities.extensions
            listed = {t.name: t for t in (await c.session.list_tools()).tools}
            assert listed["add"].input_schema["required"] == ["a"]
            assert listed["add"].description == "Add two integers."
            assert "create_run" in listed  # next to the orchestrator's tools

            handle = await call_for_task(c.session, "add", a=2, b=5)
            assert handle["resultType"] == "task" and handle["status"] == "working"
            assert handle["ttlMs"] == 86_400_000 and handle["pollIntervalMs"] == 1_000
            assert handle["createdAt"].endswith("Z") and handle["lastUpdatedAt"].endswith("Z")
            task_id = handle["taskId"]
            # Durably created before the handle was returned, labelled with tool and caller.
            call = await in_db(
                lambda: ToolCall.objects.select_related("run", "task").get(pk=task_id)
            )
            assert (call.tool, call.principal, call.task.kind) == ("add", "local", "mcp.tool.add")
            assert call.run.namespace == "mcp.tool"
            assert call.run.metadata == {"mcp_tool": "add", "mcp_caller": "local"}
            assert call.task.input == {"a": 2, "b": 5}
            assert (await get_task(c.session, task_id))["status"] == "working"

            with worker_running(handlers):
                done = await poll_task(c.session, task_id, settled)
            assert done["resultType"] == "complete" and done["status"] == "completed"
            assert done["result"]["structuredContent"] == {"sum": 7}
            assert done["result"]["isError"] is False
            assert done["result"]["content"][0]["text"] == '{"sum": 7}'

    anyio.run(scenario)


def test_a_failing_tool_completes_with_a_tool_error_and_a_forbidden_one_never_gives_a_handle(
    registries,
):
    tools, handlers = registries

    async def scenario():
        async with client(tools) as c:
            handle = await call_for_task(c.session, "explode", message="kaboom")
            with worker_running(handlers):
                done = await poll_task(c.session, handle["taskId"], settled)
                direct = wire(await c.session.call_tool("plain", {"text": "hi"}))
            assert done["status"] == "completed"
            # The error shape of every tool error of the server (docs/mcp.md).
            error = error_of("explode", done["result"])
            assert error["code"] == "tool_failed"
            assert error["message"].startswith("explode failed: RuntimeError: kaboom")
            assert error["details"]["tool"] == "explode"
            assert error["details"]["run_id"] == handle["taskId"]
            assert "RuntimeError: kaboom" in error["details"]["error"]
            assert direct["structuredContent"] == {"text": "hi"} and not direct.get("isError")

    anyio.run(scenario)


def test_input_required_then_tasks_update_resumes_the_tool_with_the_answers(registries):
    tools, handlers = registries

    async def scenario():
        async with client(tools) as c:
            handle = await call_for_task(c.session, "greet", greeting="Hi")
            task_id = handle["taskId"]
            with worker_running(handlers):
                asking = await poll_task(c.session, task_id, lambda t: t["status"] != "working")
                assert asking["status"] == "input_required"
                assert asking["inputRequests"] == {"name": NAME_REQUEST}
                assert asking["statusMessage"] == "Waiting for input: name."
                # Asked again: the same request, under the same key.
                assert (await get_task(c.session, task_id))["inputRequests"] == asking[
                    "inputRequests"
                ]
                # A key that is not outstanding is ignored; the task still waits.
                ack = await update_task(c.session, task_id, {"other": {"action": "accept"}})
                assert ack.get("resultType") == "complete"
                assert (await get_task(c.session, task_id))["status"] == "input_required"
                answer = {"action": "accept", "content": {"name": "Luca"}}
                await update_task(c.session, task_id, {"name": answer})
                done = await poll_task(c.session, task_id, settled)
                # Answering again after the fact changes nothing.
                await update_task(c.session, task_id, {"name": {"action": "decline"}})
            assert done["status"] == "completed"
            assert done["result"]["content"] == [{"type": "text", "text": "Hi, Luca!"}]
            row = await in_db(lambda: InputRequest.objects.get(run_id=task_id))
            assert (row.key, row.response, row.answered_by) == ("name", answer, "local")

    anyio.run(scenario)


def test_tasks_cancel_cancels_the_run_and_reaches_the_running_handler(registries, tmp_path):
    tools, handlers = registries
    marker = tmp_path / "marker"

    async def scenario():
        async with client(tools) as c:
            with worker_running(handlers):
                handle = await call_for_task(c.session, "slow", seconds=30, marker=str(marker))
                task_id = handle["taskId"]
                working = await poll_task(
                    c.session, task_id, lambda t: t.get("statusMessage") == "half way"
                )
                assert working["status"] == "working"
                ack = await cancel_task(c.session, task_id)
                assert ack["resultType"] == "complete" and set(ack) <= {"resultType", "_meta"}
                done = await poll_task(c.session, task_id, settled)
                assert done["status"] == "cancelled"
                assert done["statusMessage"].startswith("Cancelled: cancelled by the MCP client")
                # The handler is told through ctx.cancelled (the heartbeat's lease check).
                deadline = anyio.current_time() + 30
                while "cancelled" not in marker.read_text() and anyio.current_time() < deadline:
                    await anyio.sleep(0.1)
            assert "cancelled" in marker.read_text()

    anyio.run(scenario)


def test_a_tool_fans_out_into_parallel_tasks_of_its_run(registries):
    tools, handlers = registries

    async def scenario():
        async with client(tools) as c:
            handle = await call_for_task(c.session, "squares", n=5)
            with worker_running(handlers):
                done = await poll_task(c.session, handle["taskId"], settled)
            assert done["result"]["structuredContent"] == {"total": 0 + 1 + 4 + 9 + 16}
            kinds = await in_db(
                lambda: sorted(Task.objects.filter(run_id=handle["taskId"]).values_list("kind"))
            )
            assert kinds == [("mcp.tool.squares",)] + [("mcptest.square",)] * 5

    anyio.run(scenario)


# -- notifications/tasks ---------------------------------------------------------------------------
def test_a_listening_client_is_told_each_change_of_its_tasks_until_they_end(registries, settings):
    settings.PARALLEL_MCP = {"MCP_TASK_NOTIFY_POLL_MS": 20}
    tools, handlers = registries
    pushed: list[dict] = []
    acks: list = []
    someone_elses = start_tool_call(
        using="default", tool="add", kind="mcp.tool.add", input={"a": 1}, principal="token:x",
        ttl_ms=None,
    )  # fmt: skip

    async def on_task(params: dict) -> None:
        pushed.append(params)

    async def on_message(message) -> None:
        if getattr(message, "method", None) == "notifications/subscriptions/acknowledged":
            acks.append(message.params.notifications.model_dump(by_alias=True, exclude_none=True))

    async def scenario():
        server = ParallelMcpServer(tools=tools).build()
        extension = TasksExtension(on_task=on_task)
        async with Client(server, extensions=[extension], message_handler=on_message) as c:
            handle = await call_for_task(c.session, "greet", greeting="Hi")
            task_id = handle["taskId"]
            ids = [task_id, str(someone_elses.run_id), "not-an-id"]
            async with listening(c.session, ids) as stream:
                await eventually(lambda: pushed)
                # Only the caller's own task is acknowledged; its state comes at once.
                assert acks == [{"taskIds": [task_id]}]
                assert [p["status"] for p in pushed] == ["working"]
                with worker_running(handlers):
                    await eventually(lambda: pushed[-1]["status"] == "input_required")
                    assert pushed[-1]["inputRequests"] == {"name": NAME_REQUEST}
                    answer = {"action": "accept", "content": {"name": "Ada"}}
                    await update_task(c.session, task_id, {"name": answer})
                    await eventually(lambda: "result" in stream)
                final = await get_task(c.session, task_id)
            # Ended gracefully once the task completed; nothing was sent twice in a row.
            subscription = stream["result"]["_meta"][SUBSCRIPTION_ID]
            assert subscription is not None
            statuses = [p["status"] for p in pushed]
            assert statuses[0] == "working" and statuses[-1] == "completed"
            assert "input_required" in statuses
            assert all(a != b for a, b in itertools.pairwise(pushed))
            assert all(p["taskId"] == task_id for p in pushed)
            assert all(p["_meta"] == {SUBSCRIPTION_ID: subscription} for p in pushed)
            # The last notification is what tasks/get answers.
            keys = set(final) - {"resultType", "_meta"}
            assert {k: pushed[-1][k] for k in keys} == {k: final[k] for k in keys}
            assert pushed[-1]["result"]["content"] == [{"type": "text", "text": "Hi, Ada!"}]

    anyio.run(scenario)


def test_a_listener_sees_input_requests_shrink_when_some_are_answered(registries, settings):
    """A partial tasks/update (the task still waits) is an event of its own, so listeners are
    told at once, not at the run's next change."""
    settings.PARALLEL_MCP = {"MCP_TASK_NOTIFY_POLL_MS": 20}
    tools, handlers = registries
    pushed: list[dict] = []

    async def on_task(params: dict) -> None:
        pushed.append(params)

    async def scenario():
        server = ParallelMcpServer(tools=tools).build()
        async with Client(server, extensions=[TasksExtension(on_task=on_task)]) as c:
            task_id = (await call_for_task(c.session, "survey"))["taskId"]
            with worker_running(handlers):
                await poll_task(c.session, task_id, lambda t: t["status"] == "input_required")
            async with listening(c.session, [task_id]):
                await eventually(lambda: pushed)
                assert set(pushed[-1]["inputRequests"]) == {"name", "colour"}
                answer = {"action": "accept", "content": {"name": "Ada"}}
                await update_task(c.session, task_id, {"name": answer})
                await eventually(lambda: len(pushed) == 2, timeout=10)
            told = pushed[-1]
            assert told["status"] == "input_required"
            assert told["inputRequests"] == {"colour": colour_request()}
            assert told["statusMessage"] == "Waiting for input: colour."

    anyio.run(scenario)


def test_one_read_of_the_event_log_serves_every_listener(settings):
    settings.PARALLEL_MCP = {"MCP_TASK_NOTIFY_POLL_MS": 60_000}
    run_a, run_b, run_c = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    reads: list = []

    class Log:
        using = "default"

        def list_events_since(self, *, after_id, limit):
            reads.append(after_id)
            events = [SimpleNamespace(run_id=run) for run in (run_a, run_b, run_c)]
            return EventPage(events=events, next_cursor=after_id + len(events))

    async def db(function, *args, **kwargs):
        return 7 if function is selectors.last_event_id else function(*args, **kwargs)

    feed = EventFeed(orchestrator=Log(), db=db)
    changed: dict[str, set] = {}

    async def scenario():
        async with feed.listen({run_a}) as first, feed.listen({run_b}) as second:
            assert feed.cursor == 7  # from the end of the log on

            async def wait(name, listener):
                changed[name] = await feed.changed(listener)

            async with anyio.create_task_group() as group:
                group.start_soon(wait, "first", first)
                group.start_soon(wait, "second", second)
            assert feed.cursor == 10
        assert feed.cursor is None  # nobody listens: the next one starts afresh

    anyio.run(scenario)
    assert changed == {"first": {run_a}, "second": {run_b}}
    assert reads == [7]  # one read for both listeners


def test_listening_needs_the_extension_and_a_bounded_list_of_ids(registries):
    tools, _ = registries

    async def scenario():
        async with client(tools, declare_tasks=False) as c:
            async with listening(c.session, ["00000000-0000-4000-8000-000000000000"]) as stream:
                await eventually(lambda: stream)
            assert stream["error"].code == -32021
        async with client(tools) as c:
            too_many = [str(uuid.uuid4()) for _ in range(limits.MAX_LISTEN_TASK_IDS + 1)]
            async with listening(c.session, too_many) as stream:
                await eventually(lambda: stream)
            assert stream["error"].code == -32602
            assert f"more than {limits.MAX_LISTEN_TASK_IDS}" in stream["error"].error.message
            # Nothing visible to listen to: acknowledged empty, and ended at once.
            async with listening(c.session, [str(uuid.uuid4())]) as stream:
                await eventually(lambda: stream)
            assert "result" in stream

    anyio.run(scenario)


def test_the_server_says_its_listen_streams_carry_no_list_changes(registries):
    tools, _ = registries

    async def scenario():
        async with client(tools) as c:
            capabilities = c.session.server_capabilities
            assert capabilities.tools.list_changed is False
            assert capabilities.prompts.list_changed is False
            assert capabilities.resources.list_changed is False
            assert capabilities.resources.subscribe is False
            assert TASKS_EXTENSION in capabilities.extensions

    anyio.run(scenario)


# -- a client that does not declare it -----------------------------------------------------------
@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_without_the_extension_a_call_waits_for_the_result_or_needs_the_capability(
    registries, mode
):
    tools, handlers = registries

    async def scenario():
        async with client(tools, declare_tasks=False, mode=mode) as c:
            with worker_running(handlers):
                result = wire(await c.session.call_tool("add", {"a": 1}))
                failed = wire(await c.session.call_tool("explode", {"message": "no"}))
            assert result["structuredContent"] == {"sum": 2} and not result.get("isError")
            error = error_of("explode", failed)
            assert error["code"] == "tool_failed" and "RuntimeError: no" in error["message"]
            runs = await in_db(lambda: Run.objects.count())
            with pytest.raises(MCPError) as refused:
                await c.session.call_tool("greet", {})
            assert refused.value.code == -32021
            assert refused.value.error.data == {
                "requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}
            }
            # Refused before anything was written.
            assert await in_db(lambda: Run.objects.count()) == runs
            if mode == "auto":  # the extension's methods need the capability too
                with pytest.raises(MCPError) as refused:
                    await get_task(c.session, "00000000-0000-4000-8000-000000000000")
                assert refused.value.code == -32021

    anyio.run(scenario)


def test_a_call_that_outlives_the_wait_timeout_is_a_tool_error_and_its_run_is_cancelled(
    registries, settings
):
    tools, _ = registries
    settings.PARALLEL_MCP = {"MCP_TOOL_WAIT_TIMEOUT_MS": 200}

    async def scenario():
        async with client(tools, declare_tasks=False) as c:
            result = wire(await c.session.call_tool("slow", {"seconds": 1}))  # no worker runs
        error = error_of("slow", result)
        assert error["code"] == "wait_timeout"
        assert "did not finish within 200 ms" in error["message"]
        assert error["details"]["timeout_ms"] == 200

    anyio.run(scenario)
    assert Run.objects.get().status == "cancelled"


def test_a_tool_that_asks_a_client_without_the_extension_is_the_same_tool_error(registries):
    tools, handlers = registries

    async def scenario():
        async with client(tools, declare_tasks=False) as c:
            with worker_running(handlers):
                result = wire(await c.session.call_tool("approve_each", {"items": ["a"]}))
        error = error_of("approve_each", result)
        assert error["code"] == "input_not_supported"
        assert "needs input from the client" in error["message"]
        assert error["details"]["input_requests"] == ["approve:a"]

    anyio.run(scenario)
    assert Run.objects.get().status == "cancelled"


# -- hostile input ---------------------------------------------------------------------------------
def test_someone_elses_or_an_unknown_task_is_not_found_and_nothing_is_written(registries):
    tools, _ = registries
    other = start_tool_call(
        using="default",
        tool="add",
        kind="mcp.tool.add",
        input={"a": 1, "b": 1},
        principal="token:someone",
        ttl_ms=None,
    )
    events = Event.objects.count()

    async def scenario():
        async with client(tools) as c:
            for task_id in (str(other.run_id), "00000000-0000-4000-8000-000000000000", "nope"):
                for method, send in [
                    ("retrieve task", lambda t: get_task(c.session, t)),
                    ("update task", lambda t: update_task(c.session, t, {"k": {"a": 1}})),
                    ("cancel task", lambda t: cancel_task(c.session, t)),
                ]:
                    with pytest.raises(MCPError) as missing:
                        await send(task_id)
                    assert missing.value.code == -32602
                    assert missing.value.error.message == f"Failed to {method}: Task not found"

    anyio.run(scenario)
    assert Event.objects.count() == events
    assert Run.objects.get(pk=other.run_id).status == "active"  # not cancelled


def test_oversized_or_malformed_input_responses_are_refused_and_nothing_is_recorded(registries):
    tools, handlers = registries

    async def scenario():
        async with client(tools) as c:
            handle = await call_for_task(c.session, "greet")
            task_id = handle["taskId"]
            with worker_running(handlers):
                await poll_task(c.session, task_id, lambda t: t["status"] == "input_required")
            huge = {
                "name": {
                    "action": "accept",
                    "content": {"name": "x" * limits.MAX_INPUT_RESPONSES_BYTES},
                }
            }
            many = {f"k{i}": {"action": "accept"} for i in range(limits.MAX_INPUT_KEYS + 1)}
            for responses, message in [
                (huge, f"larger than {limits.MAX_INPUT_RESPONSES_BYTES} bytes"),
                (many, f"more than {limits.MAX_INPUT_KEYS} keys"),
                ({"name": "accept"}, "must be an object"),
                (["name"], None),
            ]:
                with pytest.raises(MCPError) as refused:
                    await update_task(c.session, task_id, responses)
                assert refused.value.code == -32602
                if message:
                    assert message in refused.value.error.message
            assert (await get_task(c.session, task_id))["status"] == "input_required"

    anyio.run(scenario)
    row = InputRequest.objects.get()
    assert row.answered_at is None and row.response is None


class RawParams(mcp_types.RequestParams):
    """Request params sent as given (wrong types, missing fields)."""

    model_config = ConfigDict(extra="allow")


class RawTaskRequest(mcp_types.Request[RawParams, str]):
    method: str
    params: RawParams


def deep(levels: int) -> dict:
    """An object ``levels`` objects deep, built without recursion."""
    return functools.reduce(lambda inner, _: {"k": inner}, range(levels), {})


def test_hostile_tasks_requests_are_clean_errors_or_ignored_and_write_nothing(registries):
    """Each bad request is a JSON-RPC error (-32602) naming what is wrong; answers to a task
    that asks nothing, or after the fact, are ignored as the extension says (an empty ack).
    Nothing of it is written."""
    tools, handlers = registries

    async def scenario():
        async with client(tools) as c:
            asking = (await call_for_task(c.session, "greet"))["taskId"]
            done = (await call_for_task(c.session, "add", a=1))["taskId"]
            with worker_running(handlers):
                await poll_task(c.session, asking, lambda t: t["status"] == "input_required")
                await poll_task(c.session, done, settled)
            working = (await call_for_task(c.session, "add", a=2))["taskId"]  # no worker now
            before = await in_db(lambda: (Event.objects.latest("pk").pk, Run.objects.count()))

            async def raw(method: str, **params) -> MCPError:
                request = RawTaskRequest(method=method, params=RawParams(**params))
                with pytest.raises(MCPError) as refused:
                    await c.session.send_request(request, TypeAdapter(dict))
                return refused.value

            for responses, message in [
                ({"name": deep(limits.MAX_JSON_DEPTH + 1)}, "nested deeper than"),
                ({"name": deep(200)}, "nested deeper than"),  # about what a client can send
                ({"name": None}, "must be an object"),
                ("accept", None),
                (None, None),
            ]:
                error = await raw("tasks/update", taskId=asking, inputResponses=responses)
                assert error.code == -32602, (responses, error)
                if message:
                    assert message in error.error.message
            for method, params in [
                ("tasks/update", {"taskId": asking}),  # no inputResponses
                ("tasks/get", {}),
                ("tasks/get", {"taskId": 7}),
                ("tasks/cancel", {"taskId": ["x"]}),
                ("tasks/get", {"taskId": "x" * 100_000}),
            ]:
                error = await raw(method, **params)
                assert error.code == -32602, (method, params, error)

            # Not outstanding: a task asking nothing, a finished one. Acknowledged, ignored.
            for task_id in (working, done):
                ack = await update_task(c.session, task_id, {"name": {"action": "accept"}})
                assert set(ack) <= {"resultType", "_meta"}
            assert (await cancel_task(c.session, done)) is not None  # ended: nothing to cancel
            assert (await get_task(c.session, working))["status"] == "working"
            assert (await get_task(c.session, asking))["inputRequests"] == {"name": NAME_REQUEST}
            after = await in_db(lambda: (Event.objects.latest("pk").pk, Run.objects.count()))
            assert after == before

    anyio.run(scenario)
    row = InputRequest.objects.get()
    assert row.answered_at is None and row.response is None
    # Deeper than any JSON encoder's stack (the service measures depth first, iteratively).
    with pytest.raises(ValidationError, match="nested deeper than"):
        answer_input(using="default", run_id=row.run_id, responses={"name": deep(20_000)})
    assert not InputRequest.objects.filter(answered_at__isnull=False).exists()


def test_bad_arguments_are_a_tool_error_and_create_nothing(registries):
    tools, _ = registries

    async def scenario():
        async with client(tools) as c:
            for arguments, field in [
                ({}, "a"),
                ({"a": "two"}, "a"),
                # Strict JSON types, as the schema says and the built-in tools do.
                ({"a": "3"}, "a"),
                ({"a": 1, "b": 2.5}, "b"),
                ({"a": True}, "a"),
                ({"a": 1, "unexpected": True}, "unexpected"),
            ]:
                result = wire(await c.session.call_tool("add", arguments, allow_claimed=True))
                error = error_of("add", result)
                assert error["code"] == "validation_error", error
                assert error["details"]["field"] == field

    anyio.run(scenario)
    assert not Run.objects.exists() and not ToolCall.objects.exists()


def _claim_ids(orch: Orchestrator, **options) -> dict:
    claim = orch.claim_next_task(worker_id="w", **options)
    return {"task_id": claim.task.id, "lease_id": claim.lease.id, "worker_id": "w"}


def test_a_pause_records_its_input_requests_in_its_own_transaction():
    orch = Orchestrator()
    call = start_tool_call(
        using="default", tool="t", kind="k.one", input={}, principal="local", ttl_ms=None
    )
    ids = _claim_ids(orch)
    paused = orch.pause_task(
        **ids, status="waiting_input", reason="asking", input_requests={"q": NAME_REQUEST}
    )
    assert paused.status == "waiting_input"
    row = InputRequest.objects.get()
    assert (row.task_id, row.key, row.request, row.answered_at) == (
        ids["task_id"], "q", NAME_REQUEST, None,
    )  # fmt: skip
    event = Event.objects.filter(event_type="task.waiting_input").get()
    assert event.payload == {"worker_id": "w", "reason": "asking", "input_requests": ["q"]}

    # Not all answered: still waiting. All answered: queued in the same transaction.
    assert answer_input(using="default", run_id=call.run_id, responses={"x": {"a": 1}}) == 0
    assert answer_input(using="default", run_id=call.run_id, responses={"q": {"x": 1}}) == 1
    assert orch.get_task(task_id=ids["task_id"]).status == "queued"
    # Re-run: the answered key cannot be asked again; the refusal writes nothing.
    ids = _claim_ids(orch)
    events = Event.objects.count()
    with pytest.raises(ValidationError, match="answered already"):
        orch.pause_task(
            **ids,
            status="waiting_input",
            input_requests={"new": NAME_REQUEST, "q": NAME_REQUEST},
        )
    assert orch.get_task(task_id=ids["task_id"]).status == "leased"
    assert list(InputRequest.objects.values_list("key", flat=True)) == ["q"]
    assert Event.objects.count() == events


def test_each_answer_is_recorded_with_its_event_whether_or_not_the_task_still_waits():
    orch = Orchestrator()
    call = start_tool_call(
        using="default", tool="t", kind="k.one", input={}, principal="local", ttl_ms=None
    )
    ids = _claim_ids(orch)
    asked = {"name": NAME_REQUEST, "colour": colour_request()}
    orch.pause_task(**ids, status="waiting_input", input_requests=asked)
    run_before = Run.objects.get(pk=call.run_id)
    last = Event.objects.latest("pk").pk

    # Keys that are not outstanding: nothing is written, not even the run's updated_at.
    assert answer_input(using="default", run_id=call.run_id, responses={"x": {}}) == 0
    assert Event.objects.latest("pk").pk == last
    assert Run.objects.get(pk=call.run_id).updated_at == run_before.updated_at

    # Some of them: recorded, with their event; the task still waits for the rest.
    recorded = answer_input(
        using="default", run_id=call.run_id, responses={"name": {"n": 1}}, principal="local"
    )
    assert recorded == 1
    assert orch.get_task(task_id=ids["task_id"]).status == "waiting_input"
    (received,) = Event.objects.filter(pk__gt=last)
    assert (received.event_type, received.task_id) == ("task.input_received", ids["task_id"])
    assert received.payload == {"keys": ["name"], "outstanding": ["colour"]}
    assert Run.objects.get(pk=call.run_id).updated_at > run_before.updated_at

    # The rest (and one already answered, ignored): its event, then the resumption.
    last = received.pk
    responses = {"colour": {"c": 2}, "name": {"n": "again"}}
    assert answer_input(using="default", run_id=call.run_id, responses=responses) == 1
    written = list(Event.objects.filter(pk__gt=last).order_by("pk"))
    assert [e.event_type for e in written] == [
        "task.input_received", "task.resumed", "run.status.changed",
    ]  # fmt: skip
    assert written[0].payload == {"keys": ["colour"], "outstanding": []}
    assert orch.get_task(task_id=ids["task_id"]).status == "queued"
    answers = dict(InputRequest.objects.values_list("key", "response"))
    assert answers == {"name": {"n": 1}, "colour": {"c": 2}}


def test_input_requests_are_checked_before_anything_is_written():
    orch = Orchestrator()
    call = start_tool_call(
        using="default", tool="t", kind="k.one", input={}, principal="local", ttl_ms=None
    )
    ids = _claim_ids(orch)
    refused = [
        ({"status": "blocked", "input_requests": {"q": NAME_REQUEST}}, "waiting_input' only"),
        ({"input_requests": {}}, "non-empty object"),
        ({"input_requests": ["q"]}, "non-empty object"),
        ({"input_requests": {"r": {"method": "tools/call"}}}, "method is one of"),
        ({"input_requests": {"r": {"method": "roots/list", "id": 1}}}, "other than method"),
        ({"input_requests": {"r": {"method": "roots/list", "params": []}}}, "must be an object"),
        ({"input_requests": {" ": NAME_REQUEST}}, "must not be empty"),
        ({"input_requests": {"x" * 201: NAME_REQUEST}}, "longer than 200"),
        (
            {"input_requests": {f"k{i}": NAME_REQUEST for i in range(limits.MAX_INPUT_KEYS + 1)}},
            f"more than {limits.MAX_INPUT_KEYS} keys",
        ),
    ]
    for extra, message in refused:
        arguments = {"status": "waiting_input", **extra}
        with pytest.raises(ValidationError, match=message):
            orch.pause_task(**ids, **arguments)
    assert not InputRequest.objects.exists()
    assert orch.get_task(task_id=ids["task_id"]).status == "leased"

    # Asking again for a key still unanswered, with the same request, changes nothing.
    orch.pause_task(**ids, status="waiting_input", input_requests={"q": NAME_REQUEST})
    orch.resume_task(task_id=ids["task_id"], reason="an operator, without answering")
    ids = _claim_ids(orch)
    with pytest.raises(ValidationError, match="asked with another request"):
        orch.pause_task(
            **ids, status="waiting_input", input_requests={"q": {"method": "roots/list"}}
        )
    orch.pause_task(**ids, status="waiting_input", input_requests={"q": NAME_REQUEST})
    assert InputRequest.objects.count() == 1

    # Another task of the run cannot use the key; a run no tool call made cannot ask at all.
    orch.enqueue_task(run_id=call.run_id, kind="k.two")
    ids = _claim_ids(orch, kinds=["k.two"])
    with pytest.raises(ValidationError, match="used by another task"):
        orch.pause_task(**ids, status="waiting_input", input_requests={"q": NAME_REQUEST})
    other = orch.create_run()
    orch.enqueue_task(run_id=other.id, kind="k.three")
    ids = _claim_ids(orch, kinds=["k.three"])
    with pytest.raises(ValidationError, match="not created by an MCP tool call"):
        orch.pause_task(**ids, status="waiting_input", input_requests={"z": NAME_REQUEST})
    assert orch.get_task(task_id=ids["task_id"]).status == "leased"
    assert InputRequest.objects.count() == 1


def test_a_fan_out_child_asks_the_caller_and_each_answer_resumes_its_own_task(registries):
    tools, handlers = registries

    async def scenario():
        async with client(tools) as c:
            handle = await call_for_task(c.session, "approve_each", items=["a", "b"])
            task_id = handle["taskId"]
            with worker_running(handlers):
                asking = await poll_task(
                    c.session, task_id, lambda t: len(t.get("inputRequests", {})) == 2
                )
                assert asking["status"] == "input_required"
                assert asking["inputRequests"] == {
                    "approve:a": approval_request("a"),
                    "approve:b": approval_request("b"),
                }
                await update_task(c.session, task_id, {"approve:a": {"action": "accept"}})
                still = await poll_task(
                    c.session, task_id, lambda t: list(t.get("inputRequests", {})) == ["approve:b"]
                )
                assert still["status"] == "input_required"
                await update_task(c.session, task_id, {"approve:b": {"action": "decline"}})
                done = await poll_task(c.session, task_id, settled)
            assert done["status"] == "completed"
            assert done["result"]["structuredContent"] == {"approved": ["a"]}

    anyio.run(scenario)


def test_tools_only_and_read_only_exclude_each_other():
    from django.core.management import CommandError, call_command

    with pytest.raises(CommandError, match="--tools-only and --read-only exclude each other"):
        call_command("pmcp_mcp", "--tools-only", "--read-only")


def test_a_read_only_server_serves_no_declared_tool_and_no_task_method(registries):
    tools, _ = registries
    server = ParallelMcpServer(tools=tools, read_only=True)
    assert not (server.visible & {"add", "greet"})
    built = server.build()
    assert built.get_request_handler("tasks/get") is None
    assert TASKS_EXTENSION not in built.extensions

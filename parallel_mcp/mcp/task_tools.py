"""The tools declared with ``@tool``, served over MCP, and the io.modelcontextprotocol/tasks
extension (wire version 2026-07-28): ``tools/call`` may answer with a task handle, and
``tasks/get``, ``tasks/update`` and ``tasks/cancel`` follow it (docs/mcp-tasks.md).

A call creates a run holding one task of the tool's kind (``services.tool_calls``); the MCP
task id is the run id and only the caller's principal sees it. A client that did not declare
the extension on its request gets the result itself once the run ends (``forbidden`` and
``optional`` tools), or ``-32021`` (``required`` tools).
"""

from __future__ import annotations

import functools
import time
from typing import Any

import anyio
import anyio.to_thread
import mcp_types as types
from django.core.exceptions import ImproperlyConfigured
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Field

from .. import selectors
from ..conf import app_settings
from ..exceptions import ValidationError
from ..orchestrator import Orchestrator
from ..services import tool_calls
from .auth import in_db_thread, request_actor
from .declare import ToolDefinition, ToolRegistry
from .task_notify import EventFeed, TaskListenStreams
from .task_state import (
    CANCELLED,
    COMPLETED,
    INPUT_REQUIRED,
    ToolCallState,
    call_result,
    status_of,
    task_object,
    tool_error,
)

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
# The extension's methods; the request param models below.
TASK_METHODS = ("tasks/get", "tasks/update", "tasks/cancel")
# How often a call answered without a task handle looks at its run while it waits.
WAIT_POLL_SECONDS = 0.1


class TaskRequestParams(types.RequestParams):
    task_id: str = Field(alias="taskId")


class UpdateTaskRequestParams(TaskRequestParams):
    input_responses: dict[str, Any] = Field(alias="inputResponses")


def declares_tasks(ctx: Any) -> bool:
    """Whether this request's own capabilities include the extension. Only 2026-07-28
    requests carry them (``_meta``), and only that wire can carry a task handle; a handshake
    declaration does not count, as the extension says."""
    if getattr(ctx, "protocol_version", None) not in MODERN_PROTOCOL_VERSIONS:
        return False
    meta = getattr(ctx, "meta", None) or {}
    capabilities = meta.get(types.CLIENT_CAPABILITIES_META_KEY)
    extensions = capabilities.get("extensions") if isinstance(capabilities, dict) else None
    return isinstance(extensions, dict) and TASKS_EXTENSION in extensions


def missing_capability() -> MCPError:
    return MCPError(
        types.MISSING_REQUIRED_CLIENT_CAPABILITY,
        "Missing required client capability",
        {"requiredCapabilities": {"extensions": {TASKS_EXTENSION: {}}}},
    )


def not_found(what: str) -> MCPError:
    return MCPError(types.INVALID_PARAMS, f"Failed to {what}: Task not found")


def expired(what: str) -> MCPError:
    """A task past its TTL whose run has ended, not pruned yet (the extension's example)."""
    return MCPError(types.INVALID_PARAMS, f"Failed to {what}: Task has expired")


def principal_of(ctx: Any) -> str:
    actor = request_actor(getattr(ctx, "request", None))
    return actor.principal if actor is not None else tool_calls.LOCAL_PRINCIPAL


async def _in_db_thread(function: Any, *args: Any, **kwargs: Any) -> Any:
    """``function`` in a database thread, acting as no one (reads of the event feed)."""
    return await anyio.to_thread.run_sync(
        functools.partial(in_db_thread, function, *args, **kwargs)
    )


def read_state(using: str, task_id: Any, principal: str) -> ToolCallState | None:
    call = selectors.tool_call(using=using, run_id=task_id, principal=principal)
    if call is None:
        return None
    outstanding = selectors.outstanding_input_requests(using=using, run_id=call.run_id)
    notice = None
    if not outstanding and not call.expired:
        notice = selectors.tool_call_notice(using=using, run=call.run)
    return ToolCallState(call=call, outstanding=outstanding, notice=notice)


class ToolTasks:
    """The declared tools of one server and the extension's methods."""

    def __init__(self, *, registry: ToolRegistry, orchestrator: Orchestrator) -> None:
        self.registry = registry
        self.orchestrator = orchestrator
        self.streams = TaskListenStreams(EventFeed(orchestrator=orchestrator, db=_in_db_thread))

    @property
    def using(self) -> str:
        return self.orchestrator.using

    def check_names(self, reserved: set[str]) -> None:
        clash = sorted(set(reserved) & {d.name for d in self.registry.all()})
        if clash:
            raise ImproperlyConfigured(
                f"@tool names clash with parallel_mcp's own MCP tools: {', '.join(clash)}. "
                "Rename them, or serve them alone (pmcp_mcp --tools-only)."
            )

    def names(self) -> set[str]:
        return {definition.name for definition in self.registry.all()}

    def get(self, name: str) -> ToolDefinition | None:
        return self.registry.get(name)

    def listed(self, allowed: frozenset[str]) -> list[types.Tool]:
        return [
            types.Tool(
                name=d.name,
                title=d.title,
                description=d.description or None,
                input_schema=d.input_schema,
                annotations=types.ToolAnnotations(title=d.title, open_world_hint=True),
            )
            for d in self.registry.all()
            if d.name in allowed
        ]

    def register_methods(self, server: Any) -> None:
        server.extensions[TASKS_EXTENSION] = {}
        server.add_request_handler("tasks/get", TaskRequestParams, self.get_task)
        server.add_request_handler("tasks/update", UpdateTaskRequestParams, self.update_task)
        server.add_request_handler("tasks/cancel", TaskRequestParams, self.cancel_task)
        server.add_request_handler(
            "subscriptions/listen", types.SubscriptionsListenRequestParams, self.listen
        )

    async def _db(self, ctx: Any, function: Any, *args: Any, **kwargs: Any) -> Any:
        actor = request_actor(getattr(ctx, "request", None))
        call = functools.partial(function, *args, **kwargs)
        return await anyio.to_thread.run_sync(functools.partial(in_db_thread, actor=actor), call)

    # -- tools/call ---------------------------------------------------------------------------
    async def call(self, ctx: Any, definition: ToolDefinition, arguments: Any) -> Any:
        """A task handle for a client that declared the extension (unless the tool forbids
        tasks), else the result once the run ends. Bad arguments raise ToolArgumentsError
        before anything is written."""
        handle = definition.task != "forbidden" and declares_tasks(ctx)
        if definition.task == "required" and not handle:
            raise missing_capability()
        task_input = definition.task_input(arguments)  # ToolArgumentsError: the caller's
        principal = principal_of(ctx)
        call = await self._db(
            ctx,
            tool_calls.start_tool_call,
            using=self.using,
            tool=definition.name,
            kind=definition.kind,
            input=task_input,
            principal=principal,
            ttl_ms=definition.call_ttl_ms(),
        )
        # Committed: a tasks/get on any replica finds it from here on.
        if handle:
            state = await self._db(ctx, read_state, self.using, call.run_id, principal)
            return {"resultType": "task", **task_object(state)}
        return await self.wait(ctx, call.run_id, principal, definition)

    async def wait(
        self, ctx: Any, run_id: Any, principal: str, definition: ToolDefinition
    ) -> types.CallToolResult:
        deadline = time.monotonic() + app_settings.MCP_TOOL_WAIT_TIMEOUT_MS / 1000
        while True:
            state = await self._db(ctx, read_state, self.using, run_id, principal)
            status = status_of(state)
            if status == COMPLETED:
                return types.CallToolResult.model_validate(call_result(state))
            details = {"tool": definition.name, "run_id": str(run_id)}
            if status == CANCELLED:
                return types.CallToolResult.model_validate(
                    tool_error(
                        "tool_cancelled",
                        f"{definition.name} was cancelled (run {run_id}).",
                        details,
                    )
                )
            if status == INPUT_REQUIRED:
                reason = "the tool asked for input this client cannot give"
                await self._db(ctx, self.orchestrator.cancel_run, run_id=run_id, reason=reason)
                return types.CallToolResult.model_validate(
                    tool_error(
                        "input_not_supported",
                        f"{definition.name} needs input from the client, which it asks for "
                        f"through the {TASKS_EXTENSION} extension: call it from a client that "
                        f"declares the extension. Run {run_id} was cancelled.",
                        {**details, "input_requests": sorted(state.outstanding)},
                    )
                )
            if time.monotonic() >= deadline:
                reason = "no result within MCP_TOOL_WAIT_TIMEOUT_MS"
                await self._db(ctx, self.orchestrator.cancel_run, run_id=run_id, reason=reason)
                return types.CallToolResult.model_validate(
                    tool_error(
                        "wait_timeout",
                        f"{definition.name} did not finish within "
                        f"{app_settings.MCP_TOOL_WAIT_TIMEOUT_MS} ms; run {run_id} was "
                        f"cancelled. Clients that declare the {TASKS_EXTENSION} extension "
                        "can follow long calls instead of waiting.",
                        {**details, "timeout_ms": app_settings.MCP_TOOL_WAIT_TIMEOUT_MS},
                    )
                )
            await anyio.sleep(WAIT_POLL_SECONDS)

    # -- the extension's methods --------------------------------------------------------------
    async def _state(self, ctx: Any, task_id: str, what: str) -> ToolCallState:
        if not declares_tasks(ctx):
            raise missing_capability()
        state = await self._db(ctx, read_state, self.using, task_id, principal_of(ctx))
        if state is None:
            raise not_found(what)
        if state.expired:
            raise expired(what)
        return state

    async def get_task(self, ctx: Any, params: TaskRequestParams) -> dict[str, Any]:
        state = await self._state(ctx, params.task_id, "retrieve task")
        return task_object(state)

    async def update_task(self, ctx: Any, params: UpdateTaskRequestParams) -> dict[str, Any]:
        state = await self._state(ctx, params.task_id, "update task")
        try:
            await self._db(
                ctx,
                tool_calls.answer_input,
                using=self.using,
                run_id=state.run.pk,
                responses=params.input_responses,
                principal=principal_of(ctx),
            )
        except ValidationError as exc:
            raise MCPError(types.INVALID_PARAMS, exc.message, exc.details) from None
        return {}

    async def listen(
        self, ctx: Any, params: types.SubscriptionsListenRequestParams
    ) -> types.SubscriptionsListenResult:
        """``subscriptions/listen``: notifications/tasks for the ``taskIds`` the caller may
        see, until each is completed or cancelled (task_notify.py). This server pushes no
        other notification, so nothing else of the filter is acknowledged."""
        requested = TaskListenStreams.requested_ids(params)
        if requested is not None and not declares_tasks(ctx):
            raise missing_capability()
        principal = principal_of(ctx)

        async def visible(run_ids: list[Any]) -> set[Any]:
            return await self._db(
                ctx,
                selectors.visible_tool_calls,
                using=self.using,
                run_ids=run_ids,
                principal=principal,
            )

        async def read_task(run_id: Any) -> dict[str, Any] | None:
            state = await self._db(ctx, read_state, self.using, run_id, principal)
            return None if state is None or state.expired else task_object(state)

        return await self.streams.serve(ctx, requested or [], visible, read_task)

    async def cancel_task(self, ctx: Any, params: TaskRequestParams) -> dict[str, Any]:
        state = await self._state(ctx, params.task_id, "cancel task")
        await self._db(
            ctx,
            self.orchestrator.cancel_run,
            run_id=state.run.pk,
            reason="cancelled by the MCP client (tasks/cancel)",
        )
        return {}

"""The MCP server: the Orchestrator's methods as tools, runs and their event logs as resources.

``build_server()`` returns the SDK's low-level ``Server``; ``serve_stdio()`` and ``http_app()``
put it on a transport (``manage.py pmcp_mcp`` does both). Tool calls run the Orchestrator in a
worker thread with fresh database connections that are closed when the call ends.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import re
import sys
from importlib import metadata
from typing import Any

import anyio.to_thread
import mcp_types as types
from mcp.server import Server
from mcp.server.stdio import stdio_server
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError
from starlette.types import ASGIApp

from ..contract import shapes as s
from ..exceptions import ParallelMcpError
from ..ids import parse_id
from ..orchestrator import Orchestrator
from .auth import (
    BearerTokenMiddleware,
    DjangoTokenVerifier,
    HostOriginMiddleware,
    in_db_thread,
    request_actor,
    request_scopes,
)
from .declare import ToolArgumentsError, ToolRegistry
from .declare import tools as declared_tools
from .hosts import HostPolicy
from .task_state import tool_error
from .task_tools import ToolTasks
from .tools import ToolSpec, tool_specs

logger = logging.getLogger("parallel_mcp.mcp")

SERVER_NAME = "parallel-mcp"
RESOURCE_NOT_FOUND = -32002  # the MCP specification's code for an unknown resource
RUN_URI = re.compile(r"^pmcp://runs/(?P<run_id>[^/?#]+)(?P<events>/events)?/?$")
RESOURCE_LIST_LIMIT = 50

INSTRUCTIONS = """\
parallel_mcp orchestrates parallel work: a run holds a graph of tasks (with dependencies), a
shared JSON context and an event log. To plan work: create_run, then enqueue_task or
enqueue_tasks (depends_on names tasks that must complete first). To do work as a worker:
claim_next_task with a stable worker_id (or claim_next_tasks for up to `limit` at once),
keep claim.task.id and claim.lease.id, call mark_task_running (or claim with start=true),
heartbeat_lease before the lease expires, and finish with complete_task (optionally with
next_context), fail_task, pause_task or release_task. A lease_conflict error
means the task is no longer yours: stop working on it. To observe: get_run, list_run_tasks,
explain_task, list_events_since (pass next_cursor back as after_id), or read the resources
pmcp://runs/{run_id} and pmcp://runs/{run_id}/events. A failed call returns isError with
the text {"error": {"code", "message", "details"}}."""


def _version() -> str:
    try:
        return metadata.version("parallel-mcp")
    except metadata.PackageNotFoundError:  # pragma: no cover - not installed
        return "0"


class SdkServer(Server):
    """The SDK's low-level server, stating what this server's ``subscriptions/listen``
    streams carry: task notifications only (the tool and prompt lists are fixed, run resources
    are read, not pushed). The SDK would otherwise derive the 2026-07-28 list-change and
    resource-subscription flags from the method being served."""

    def get_capabilities(self, *args: Any, **kwargs: Any) -> types.ServerCapabilities:
        capabilities = super().get_capabilities(*args, **kwargs)
        for capability in (capabilities.tools, capabilities.prompts, capabilities.resources):
            if capability is not None:
                capability.list_changed = False
        if capabilities.resources is not None:
            capabilities.resources.subscribe = False
        return capabilities


def mcp_tool(spec: ToolSpec) -> types.Tool:
    return types.Tool(
        name=spec.name,
        title=spec.title,
        description=spec.description,
        input_schema=spec.input_schema,
        output_schema=spec.output_schema,
        annotations=types.ToolAnnotations(
            title=spec.title,
            read_only_hint=spec.read_only,
            destructive_hint=None if spec.read_only else spec.destructive,
            idempotent_hint=None if spec.read_only else spec.idempotent,
            open_world_hint=False,
        ),
    )


def error_result(code: str, message: str, details: dict[str, Any] | None = None) -> Any:
    """A failed call: ``isError`` with the error envelope as its only (text) content.

    No ``structuredContent``: it would have to match the tool's output schema (the envelope
    does not), and TypeScript clients (SDK 1.x ``callTool``, the MCP Inspector) validate it
    even on errors, then show the schema mismatch instead of the error. Without it every client
    shows the text, as the specification's example of a tool error does.
    """
    return types.CallToolResult.model_validate(tool_error(code, message, details))


def ok_result(data: dict[str, Any]) -> Any:
    return types.CallToolResult(
        content=[types.TextContent(text=json.dumps(data))], structured_content=data
    )


class ParallelMcpServer:
    """The tool and resource handlers, bound to one Orchestrator.

    ``read_only`` hides every tool outside the ``read`` group. ``auth_required`` (HTTP with
    tokens) further limits each request to the tools its token allows (see ``auth``); a request
    without an authenticated token is allowed nothing.

    The tools declared with ``@tool`` (``tools``, the project's by default) are served next to
    the orchestrator's, or alone with ``tools_only``; a read-only server does not serve them
    (a call creates a run).
    """

    def __init__(
        self,
        *,
        orchestrator: Orchestrator | None = None,
        read_only: bool = False,
        auth_required: bool = False,
        tools: ToolRegistry | None = None,
        tools_only: bool = False,
    ) -> None:
        self.orchestrator = orchestrator or Orchestrator()
        self.read_only = read_only
        self.auth_required = auth_required
        self.specs = {} if tools_only else dict(tool_specs())
        self.tasks = ToolTasks(
            registry=declared_tools if tools is None else tools, orchestrator=self.orchestrator
        )
        self.tasks.check_names(set(self.specs))
        self.visible = frozenset(
            name for name, spec in self.specs.items() if spec.read_only or not read_only
        ) | (frozenset() if read_only else frozenset(self.tasks.names()))

    def build(self) -> Server:
        """The SDK's low-level server, dispatching to these handlers."""
        server = SdkServer(
            SERVER_NAME,
            version=_version(),
            title="parallel_mcp" + (" (read-only)" if self.read_only else ""),
            instructions=INSTRUCTIONS,
            on_list_tools=self.list_tools,
            on_call_tool=self.call_tool,
            on_list_resources=self.list_resources,
            on_list_resource_templates=self.list_resource_templates,
            on_read_resource=self.read_resource,
            on_list_prompts=self.list_prompts,
            on_get_prompt=self.get_prompt,
        )
        if not self.read_only:
            self.tasks.register_methods(server)
        return server

    # -- access -------------------------------------------------------------------------------
    def allowed(self, ctx: Any) -> frozenset[str]:
        if not self.auth_required:
            return self.visible
        scopes = request_scopes(getattr(ctx, "request", None))
        return self.visible & scopes if scopes is not None else frozenset()

    def refusal(self, name: str) -> str:
        if self.read_only and name not in self.visible:
            return f"{name} changes state and this server is read-only."
        return f"Your token does not allow {name}."

    # -- tools --------------------------------------------------------------------------------
    async def list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        allowed = self.allowed(ctx)
        return types.ListToolsResult(
            tools=[mcp_tool(spec) for name, spec in self.specs.items() if name in allowed]
            + self.tasks.listed(allowed)
        )

    async def call_tool(self, ctx: Any, params: types.CallToolRequestParams) -> Any:
        name = params.name
        arguments = params.arguments if params.arguments is not None else {}
        spec = self.specs.get(name)
        declared = self.tasks.get(name)
        if spec is None and declared is None:
            return error_result("unknown_tool", f"There is no tool named {name!r}.", {"tool": name})
        if name not in self.allowed(ctx):
            return error_result("forbidden", self.refusal(name), {"tool": name})
        if declared is not None:
            return await self.call_declared(ctx, declared, params.arguments)
        assert spec is not None  # neither unknown nor declared: one of the orchestrator's
        problems = spec.errors(arguments)
        if problems:
            first = problems[0]
            where = f"{first['field']}: " if first["field"] else ""
            return error_result(
                "validation_error",
                f"Invalid arguments for {name}: {where}{first['message']}",
                {"tool": name, "field": first["field"], "errors": problems},
            )
        try:
            actor = request_actor(getattr(ctx, "request", None))
            data = await anyio.to_thread.run_sync(
                functools.partial(in_db_thread, actor=actor), spec.run, self.orchestrator, arguments
            )
        except ParallelMcpError as exc:
            return error_result(exc.code, exc.message, exc.details)
        except Exception as exc:
            logger.exception("MCP tool %s failed", name)
            return error_result(
                "internal_error",
                f"{name} failed unexpectedly ({type(exc).__name__}); see the server log.",
                {"tool": name},
            )
        return ok_result(data)

    async def call_declared(self, ctx: Any, declared: Any, arguments: Any) -> Any:
        name = declared.name
        try:
            return await self.tasks.call(ctx, declared, arguments)
        except ToolArgumentsError as exc:
            return error_result(
                "validation_error",
                str(exc),
                {"tool": name, "field": exc.problems[0]["field"], "errors": exc.problems},
            )
        except ParallelMcpError as exc:
            return error_result(exc.code, exc.message, exc.details)
        except MCPError:
            raise  # a protocol error (-32021), answered as such
        except Exception as exc:
            logger.exception("MCP tool %s failed", name)
            return error_result(
                "internal_error",
                f"{name} failed unexpectedly ({type(exc).__name__}); see the server log.",
                {"tool": name},
            )

    # -- prompts ------------------------------------------------------------------------------
    # None yet. The capability is declared and prompts/list answers an empty list, because
    # clients (the MCP Inspector 0.15 CLI, hosts that list everything on connect) call it
    # whatever the capabilities say and show "Method not found" as a failure.
    async def list_prompts(self, ctx: Any, params: Any) -> types.ListPromptsResult:
        return types.ListPromptsResult(prompts=[])

    async def get_prompt(self, ctx: Any, params: types.GetPromptRequestParams) -> Any:
        name = params.name
        raise MCPError(types.INVALID_PARAMS, f"There is no prompt named {name!r}.", {"name": name})

    # -- resources ----------------------------------------------------------------------------
    async def list_resource_templates(self, ctx: Any, params: Any) -> Any:
        allowed = self.allowed(ctx)
        templates = []
        if {"get_run", "list_run_tasks"} <= allowed:
            templates.append(
                types.ResourceTemplate(
                    name="run",
                    title="Run",
                    uri_template="pmcp://runs/{run_id}",
                    description="A run (status, counts, progress) and its tasks, as JSON.",
                    mime_type="application/json",
                )
            )
        if "list_run_events" in allowed:
            templates.append(
                types.ResourceTemplate(
                    name="run_events",
                    title="Run events",
                    uri_template="pmcp://runs/{run_id}/events",
                    description="A run's event log in order, as JSON.",
                    mime_type="application/json",
                )
            )
        return types.ListResourceTemplatesResult(resource_templates=templates)

    async def list_resources(self, ctx: Any, params: Any) -> Any:
        if "get_run" not in self.allowed(ctx):
            return types.ListResourcesResult(resources=[])
        runs = await anyio.to_thread.run_sync(
            in_db_thread,
            lambda: [s.run(run) for run in self.orchestrator.list_runs(limit=RESOURCE_LIST_LIMIT)],
        )
        return types.ListResourcesResult(
            resources=[
                types.Resource(
                    uri=f"pmcp://runs/{run['id']}",
                    name=f"run {run['id']}",
                    title=f"Run {run['id']} ({run['namespace']}, {run['status']})",
                    description=f"{run['namespace']} run, {run['status']}, "
                    f"{run['tasks_total']} tasks",
                    mime_type="application/json",
                )
                for run in runs
            ]
        )

    async def read_resource(self, ctx: Any, params: types.ReadResourceRequestParams) -> Any:
        uri = str(params.uri)
        match = RUN_URI.match(uri)
        if match is None:
            raise MCPError(RESOURCE_NOT_FOUND, f"Unknown resource {uri!r}.", {"uri": uri})
        run_id = parse_id(match["run_id"])
        if run_id is None:
            raise MCPError(
                types.INVALID_PARAMS, f"{match['run_id']!r} is not a run id (a UUID).", {"uri": uri}
            )
        events = bool(match["events"])
        needed = {"list_run_events"} if events else {"get_run", "list_run_tasks"}
        if not needed <= self.allowed(ctx):
            raise MCPError(types.INVALID_REQUEST, f"Your token does not allow reading {uri}.")
        data = await anyio.to_thread.run_sync(in_db_thread, self._read_run, run_id, events)
        if data is None:
            raise MCPError(RESOURCE_NOT_FOUND, f"Run {run_id} does not exist.", {"uri": uri})
        return types.ReadResourceResult(
            contents=[
                types.TextResourceContents(
                    uri=uri, mime_type="application/json", text=json.dumps(data)
                )
            ]
        )

    def _read_run(self, run_id: Any, events: bool) -> dict[str, Any] | None:
        orch = self.orchestrator
        run = orch.get_run(run_id=run_id)
        if run is None:
            return None
        if events:
            return {
                "run_id": str(run.pk),
                "events": s.events(orch.list_run_events(run_id=run.pk)),
            }
        return {"run": s.run(run), "tasks": s.tasks(orch.list_run_tasks(run_id=run.pk))}


def build_server(
    *,
    orchestrator: Orchestrator | None = None,
    read_only: bool = False,
    auth_required: bool = False,
    tools: ToolRegistry | None = None,
    tools_only: bool = False,
) -> Server:
    """The SDK server with parallel_mcp's tools and resources, and the project's ``@tool``
    tools with the io.modelcontextprotocol/tasks extension."""
    return ParallelMcpServer(
        orchestrator=orchestrator,
        read_only=read_only,
        auth_required=auth_required,
        tools=tools,
        tools_only=tools_only,
    ).build()


async def serve_stdio(server: Server) -> None:
    """Serve one client over stdin/stdout until it disconnects.

    The SDK points file descriptor 1 at stderr while it serves; ``sys.stdout`` is redirected
    too, so a stray ``print`` can never corrupt the protocol stream.
    """
    sys.stdout.flush()
    async with stdio_server() as (read_stream, write_stream):
        with contextlib.redirect_stdout(sys.stderr):
            await server.run(read_stream, write_stream, server.create_initialization_options())
        # Anything buffered for the real stdout goes to stderr while it is still diverted.
        if sys.__stdout__ is not None:
            sys.__stdout__.flush()


def http_app(
    server: Server,
    *,
    hosts: HostPolicy,
    auth_required: bool = True,
    path: str = "/mcp",
    using: str = "default",
) -> ASGIApp:
    """The streamable HTTP ASGI app. Every request must name one of ``hosts`` in ``Host`` (and
    ``Origin``, when sent), checked first; with ``auth_required`` it also needs a bearer token.
    """
    # The SDK's own Host/Origin check turns itself on for three exact host spellings only and
    # compares headers verbatim; HostOriginMiddleware does it for every spelling, so the SDK's
    # is off rather than a second, different rule.
    app: ASGIApp = server.streamable_http_app(
        streamable_http_path=path,
        transport_security=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    if auth_required:
        app = BearerTokenMiddleware(app, verifier=DjangoTokenVerifier(using=using))
    return HostOriginMiddleware(app, policy=hosts)

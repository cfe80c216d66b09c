"""Task-capable MCP tools declared in a Django project: ``@tool("name", task="optional")``.

A tool is a handler like any other (``pmcp_worker`` runs it): the decorator registers the
function as the handler of the task kind ``tool_kind(name)`` and remembers it as a tool that
``pmcp_mcp`` serves. The tool's arguments are the function's parameters after ``ctx``: their
type hints give the MCP input schema, and a call's arguments become the task's input.

This module imports neither the MCP SDK nor pydantic at import time: a worker that imports a
``pmcp_handlers`` module needs pydantic only when it runs a tool's task.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from ..contract import limits
from ..worker.registry import HandlerRegistry
from ..worker.registry import registry as handler_registry
from ..worker.results import Failed

# How a tool may answer a client that declared the io.modelcontextprotocol/tasks extension:
# "forbidden" always waits and answers with the result; "optional" answers with a task handle
# when the client declared the extension, else waits; "required" needs the extension.
TASK_MODES = ("forbidden", "optional", "required")

# Tool names as the MCP specification allows them.
TOOL_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,128}$")
# The task kind of a tool's calls: "mcp.tool.<name>".
TOOL_KIND_PREFIX = "mcp.tool."


class _FromSettings:
    """``@tool(ttl_ms=…)`` not given: the setting ``MCP_TASK_TTL_MS``, read at each call."""

    def __repr__(self) -> str:
        return "MCP_TASK_TTL_MS"


TTL_FROM_SETTINGS: Any = _FromSettings()


def tool_kind(name: str) -> str:
    """The task kind that runs the tool ``name``."""
    return TOOL_KIND_PREFIX + name


class ToolArgumentsError(ValueError):
    """A call's arguments do not fit the tool's parameters; ``problems`` lists each
    ``{"field", "message"}``."""

    def __init__(self, tool: str, problems: list[dict[str, Any]]) -> None:
        self.tool = tool
        self.problems = problems
        first = problems[0]
        where = f"{first['field']}: " if first["field"] else ""
        super().__init__(f"Invalid arguments for {tool}: {where}{first['message']}")


@dataclass(frozen=True)
class ToolDefinition:
    name: str
    task: str
    function: Callable[..., Any]
    title: str | None = None
    description: str = ""
    parameters: tuple[inspect.Parameter, ...] = field(default=(), repr=False)
    ttl_ms: int | None = TTL_FROM_SETTINGS

    @property
    def kind(self) -> str:
        return tool_kind(self.name)

    def call_ttl_ms(self) -> int | None:
        """The TTL of a new call's MCP task: the tool's own, else ``MCP_TASK_TTL_MS``."""
        if self.ttl_ms is TTL_FROM_SETTINGS:
            from ..conf import app_settings

            return app_settings.MCP_TASK_TTL_MS
        return self.ttl_ms

    @cached_property
    def arguments_model(self) -> Any:
        """A pydantic model of the parameters (unknown arguments are refused)."""
        from pydantic import ConfigDict, create_model

        fields: dict[str, Any] = {}
        for parameter in self.parameters:
            annotation = (
                Any if parameter.annotation is inspect.Parameter.empty else parameter.annotation
            )
            default = ... if parameter.default is inspect.Parameter.empty else parameter.default
            fields[parameter.name] = (annotation, default)
        model_name = "".join(part.capitalize() for part in re.split(r"[_.\-]", self.name))
        return create_model(
            f"{model_name or 'Tool'}Arguments",
            __config__=ConfigDict(extra="forbid"),
            __module__=getattr(self.function, "__module__", __name__),
            **fields,
        )

    @cached_property
    def input_schema(self) -> dict[str, Any]:
        schema = self.arguments_model.model_json_schema()
        schema.setdefault("properties", {})
        return schema

    def validate(self, arguments: Any) -> dict[str, Any]:
        """The typed keyword arguments of a call; ``ToolArgumentsError`` when they do not fit."""
        from pydantic import ValidationError

        if arguments is None:
            arguments = {}
        if not isinstance(arguments, dict):
            raise ToolArgumentsError(
                self.name, [{"field": None, "message": "arguments must be an object"}]
            )
        try:
            # Strict, as JSON: an argument must have its schema's JSON type ("3" is no
            # integer, as for parallel_mcp's own tools and the HTTP API), while strings still
            # give the types JSON has none for (datetime, UUID, …).
            parsed = self.arguments_model.model_validate_json(json.dumps(arguments), strict=True)
        except ValidationError as exc:
            problems = [
                {
                    "field": ".".join(str(part) for part in error["loc"]) or None,
                    "message": error["msg"],
                }
                for error in exc.errors(include_url=False, include_input=False)
            ]
            raise ToolArgumentsError(self.name, problems) from None
        return {parameter.name: getattr(parsed, parameter.name) for parameter in self.parameters}

    def task_input(self, arguments: Any) -> dict[str, Any]:
        """The validated arguments as JSON: what the call's task stores as its input."""
        typed = self.validate(arguments)
        return self.arguments_model(**typed).model_dump(mode="json")

    def run(self, ctx: Any) -> Any:
        """The handler the worker calls: the function with the task's input as arguments."""
        try:
            arguments = self.validate(ctx.input)
        except ToolArgumentsError as exc:  # stored before the tool's signature changed
            return Failed(error=str(exc))
        return self.function(ctx, **arguments)


class ToolRegistry:
    def __init__(self) -> None:
        self._tools: dict[str, ToolDefinition] = {}

    def register(self, definition: ToolDefinition) -> None:
        existing = self._tools.get(definition.name)
        if existing is not None and existing.function is not definition.function:
            raise ImproperlyConfigured(
                f"Two functions declare the MCP tool {definition.name!r}: "
                f"{_origin(existing.function)} and {_origin(definition.function)}."
            )
        self._tools[definition.name] = definition

    def get(self, name: str) -> ToolDefinition | None:
        return self._tools.get(name)

    def all(self) -> list[ToolDefinition]:
        return [self._tools[name] for name in sorted(self._tools)]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def clear(self) -> None:
        self._tools.clear()


tools = ToolRegistry()


def _origin(function: Any) -> str:
    return f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', '?')}"


def _parameters(name: str, function: Callable[..., Any]) -> tuple[inspect.Parameter, ...]:
    signature = inspect.signature(function)
    parameters = list(signature.parameters.values())
    if not parameters or parameters[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise ImproperlyConfigured(
            f"The MCP tool {name!r} ({_origin(function)}) must take the handler context as "
            "its first parameter: def tool(ctx, ...)."
        )
    arguments = parameters[1:]
    for parameter in arguments:
        if parameter.kind in (
            inspect.Parameter.VAR_POSITIONAL,
            inspect.Parameter.VAR_KEYWORD,
            inspect.Parameter.POSITIONAL_ONLY,
        ):
            raise ImproperlyConfigured(
                f"The MCP tool {name!r} ({_origin(function)}): parameter {parameter.name!r} "
                "must be a named parameter (no *args, **kwargs or positional-only ones)."
            )
        if parameter.name.startswith("_"):
            raise ImproperlyConfigured(
                f"The MCP tool {name!r} ({_origin(function)}): parameter {parameter.name!r} "
                "must not start with an underscore."
            )
    return tuple(arguments)


def tool(
    name: str,
    *,
    task: str = "optional",
    title: str | None = None,
    description: str | None = None,
    ttl_ms: int | None = TTL_FROM_SETTINGS,
    registry: ToolRegistry = tools,
    handlers: HandlerRegistry = handler_registry,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare the decorated function ``def f(ctx, arg: type = default, ...)`` as the MCP tool
    ``name``, run as the handler of the task kind ``mcp.tool.<name>``. ``task`` is
    ``"forbidden"``, ``"optional"`` (default) or ``"required"``; the description defaults to
    the function's docstring. ``ttl_ms`` is how long a call's MCP task is kept after the call
    (``None``: unlimited; default: the setting ``MCP_TASK_TTL_MS``)."""
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise ImproperlyConfigured(
            f"An MCP tool name is 1 to 128 letters, digits, '_', '-' or '.': {name!r}"
        )
    if task not in TASK_MODES:
        raise ImproperlyConfigured(
            f"The MCP tool {name!r}: task must be one of {', '.join(TASK_MODES)}, got {task!r}."
        )

    if ttl_ms is not TTL_FROM_SETTINGS and ttl_ms is not None:
        if (
            not isinstance(ttl_ms, int)
            or isinstance(ttl_ms, bool)
            or not 0 < ttl_ms <= limits.MAX_MS
        ):
            raise ImproperlyConfigured(
                f"The MCP tool {name!r}: ttl_ms must be None (unlimited) or milliseconds "
                f"from 1 to {limits.MAX_MS}, got {ttl_ms!r}."
            )

    def decorate(function: Callable[..., Any]) -> Callable[..., Any]:
        existing = registry.get(name)
        if existing is not None and existing.function is function:
            return function  # the module was imported again: already declared
        definition = ToolDefinition(
            name=name,
            task=task,
            function=function,
            title=title,
            description=description or inspect.getdoc(function) or "",
            parameters=_parameters(name, function),
            ttl_ms=ttl_ms,
        )
        registry.register(definition)
        handlers.register(definition.kind, definition.run)
        return function

    return decorate

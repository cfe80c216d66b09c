"""MCP tools for the tests of the io.modelcontextprotocol/tasks extension. ``declare()``
registers them in the project's registries (the subprocess tests' settings) or in the given
ones (the in-process tests)."""

from __future__ import annotations

import os
from pathlib import Path

from parallel_mcp import Paused
from parallel_mcp.mcp.declare import ToolRegistry, tool
from parallel_mcp.mcp.declare import tools as project_tools
from parallel_mcp.worker.registry import HandlerRegistry
from parallel_mcp.worker.registry import registry as project_handlers

SQUARE_KIND = "mcptest.square"
APPROVE_KIND = "mcptest.approve"
NAME_REQUEST = {
    "method": "elicitation/create",
    "params": {
        "mode": "form",
        "message": "Please enter your name.",
        "requestedSchema": {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
        },
    },
}


def _mark(marker: str | None, what: str, ctx) -> None:
    if marker:
        with Path(marker).open("a") as out:
            out.write(f"{what} {ctx.task.id} attempt={ctx.task.attempt_count} pid={os.getpid()}\n")


def add(ctx, a: int, b: int = 1) -> dict:
    """Add two integers."""
    return {"sum": a + b}


def explode(ctx, message: str) -> None:
    """Always fails with ``message``."""
    raise RuntimeError(message)


def greet(ctx, greeting: str = "Hello") -> str:
    """Ask the user's name, then greet them."""
    answer = ctx.input_responses.get("name")
    if answer is None:
        return Paused(
            "waiting_input", reason="asking a name", input_requests={"name": NAME_REQUEST}
        )
    if answer.get("action") != "accept":
        return f"{greeting}, stranger."
    return f"{greeting}, {answer['content']['name']}!"


def colour_request() -> dict:
    return {
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": "Your favourite colour?",
            "requestedSchema": {"type": "object", "properties": {"colour": {"type": "string"}}},
        },
    }


def survey(ctx) -> dict:
    """Ask two questions at once; answer with both answers."""
    answers = ctx.input_responses
    if not answers:
        return Paused(
            "waiting_input",
            input_requests={"name": NAME_REQUEST, "colour": colour_request()},
        )
    return {key: answers[key]["content"] for key in ("name", "colour")}


def plain(ctx, text: str) -> dict:
    """Echo ``text``; never a task handle."""
    return {"text": text}


def slow(ctx, seconds: float = 30.0, marker: str | None = None) -> dict:
    """Sleep ``seconds`` (stopping early when cancelled), reporting progress."""
    _mark(marker, "started", ctx)
    ctx.report_progress(0.5, "half way")
    cancelled = ctx.cancelled.wait(seconds)
    _mark(marker, "cancelled" if cancelled else "finished", ctx)
    return {"slept": not cancelled, "attempt": ctx.task.attempt_count}


def squares(ctx, n: int) -> dict:
    """Square 0..n-1 in parallel tasks, then sum the squares."""
    orch = ctx.orchestrator
    children = [t for t in orch.list_run_tasks(run_id=ctx.run.id) if t.kind == SQUARE_KIND]
    if not children:
        created = orch.enqueue_tasks(
            run_id=ctx.run.id, tasks=[{"kind": SQUARE_KIND, "input": i} for i in range(n)]
        )
        return Paused("blocked", reason="squaring", blocked_by=[t.id for t in created])
    return {"total": sum(child.output for child in children)}


def square(ctx) -> int:
    return ctx.input * ctx.input


def approval_request(item: str) -> dict:
    return {
        "method": "elicitation/create",
        "params": {
            "mode": "form",
            "message": f"Approve {item}?",
            "requestedSchema": {"type": "object", "properties": {}},
        },
    }


def approve_each(ctx, items: list[str]) -> dict:
    """Ask the user to approve each item, in a child task per item, then list the approved."""
    orch = ctx.orchestrator
    children = [t for t in orch.list_run_tasks(run_id=ctx.run.id) if t.kind == APPROVE_KIND]
    if not children:
        created = orch.enqueue_tasks(
            run_id=ctx.run.id, tasks=[{"kind": APPROVE_KIND, "input": item} for item in items]
        )
        return Paused("blocked", reason="asking", blocked_by=[t.id for t in created])
    return {"approved": [child.input for child in children if child.output]}


def approve(ctx) -> bool:
    """A plain handler (a fan-out child) that asks the tool's caller."""
    key = f"approve:{ctx.input}"
    answer = ctx.input_responses.get(key)
    if answer is None:
        return Paused("waiting_input", input_requests={key: approval_request(ctx.input)})
    return answer.get("action") == "accept"


def declare(
    registry: ToolRegistry = project_tools, handlers: HandlerRegistry = project_handlers
) -> None:
    def declared(name: str, function, task: str) -> None:
        tool(name, task=task, registry=registry, handlers=handlers)(function)

    declared("add", add, "optional")
    declared("explode", explode, "optional")
    declared("greet", greet, "required")
    declared("plain", plain, "forbidden")
    declared("survey", survey, "required")
    declared("slow", slow, "optional")
    declared("squares", squares, "optional")
    declared("approve_each", approve_each, "optional")
    handlers.register(SQUARE_KIND, square)
    handlers.register(APPROVE_KIND, approve)

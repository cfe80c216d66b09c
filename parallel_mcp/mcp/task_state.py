"""What an MCP client sees of a tool call's run: the status mapping and the shapes.

One function maps the run to the extension's task status (``mcp_status``), one builds the
task object (``task_object``) that ``tools/call``, ``tasks/get`` and the admin show, and one
turns the tool's task into its ``CallToolResult`` (``call_result``). No SDK import here: these
are plain JSON-ready dicts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from ..conf import app_settings
from ..contract import shapes
from ..contract.shapes import time_text
from ..states import TERMINAL_RUN_STATUSES, RunStatus, TaskStatus

# The extension's task statuses (io.modelcontextprotocol/tasks).
WORKING = "working"
INPUT_REQUIRED = "input_required"
COMPLETED = "completed"
CANCELLED = "cancelled"
FAILED = "failed"  # JSON-RPC errors only: never reached by a tool call's run


@dataclass(frozen=True)
class ToolCallState:
    """A tool call as read at one moment: its ``ToolCall`` row (with ``run`` and ``task``),
    the input its run's waiting tasks still ask for, and why it is not getting on, if it is
    not (``selectors.tool_call_notice``: stalled, or no worker for a kind)."""

    call: Any
    outstanding: dict[str, Any]
    notice: str | None = None

    @property
    def run(self) -> Any:
        return self.call.run

    @property
    def task(self) -> Any:
        return self.call.task

    @property
    def expired(self) -> bool:
        """Past its TTL and ended (``models.tool_calls.expired_calls``): gone for the client."""
        return bool(self.call.expired)


def mcp_status(*, run_status: str, task_status: str, asks_input: bool) -> str:
    """The MCP task status of a tool call's run, over the whole run: cancelled when the run (or
    the tool's own task) is; completed once the run is terminal (a failed run is a tool error,
    reported in the result); input_required while a waiting task asks for input; else
    working (queued, leased, running, blocked, or waiting without a request)."""
    if run_status == RunStatus.CANCELLED or task_status == TaskStatus.CANCELLED:
        return CANCELLED
    if run_status in TERMINAL_RUN_STATUSES:
        return COMPLETED
    if asks_input:
        return INPUT_REQUIRED
    return WORKING


def status_of(state: ToolCallState) -> str:
    return mcp_status(
        run_status=state.run.status,
        task_status=state.task.status,
        asks_input=bool(state.outstanding),
    )


def tool_result(output: Any) -> dict[str, Any]:
    """A tool's return value as a ``CallToolResult``: an object is structured content (and its
    JSON as text), a string is text, anything else its JSON as text."""
    if output is None:
        return {"content": [], "isError": False}
    if isinstance(output, str):
        return {"content": [{"type": "text", "text": output}], "isError": False}
    text = json.dumps(output)
    result: dict[str, Any] = {"content": [{"type": "text", "text": text}], "isError": False}
    if isinstance(output, dict):
        result["structuredContent"] = output
    return result


def tool_error(code: str, message: str, details: dict[str, Any] | None = None) -> dict[str, Any]:
    """A tool error (``isError``) of this server, any tool: its only content is one text block
    holding the error shape of every door (``contract.shapes.error``) as JSON, and it has no
    ``structuredContent`` (docs/mcp.md, "Results and errors")."""
    text = json.dumps(shapes.error(code, message, details))
    return {"content": [{"type": "text", "text": text}], "isError": True}


def call_result(state: ToolCallState) -> dict[str, Any]:
    """The ``CallToolResult`` of a finished call: the tool task's output, or a tool error."""
    task, run, tool = state.task, state.run, state.call.tool
    if task.status == TaskStatus.COMPLETED:
        return tool_result(task.output)
    details = {"tool": tool, "run_id": str(run.pk), "task_id": str(task.pk)}
    if task.status == TaskStatus.FAILED:
        return tool_error(
            "tool_failed", f"{tool} failed: {task.error}", {**details, "error": task.error}
        )
    return tool_error(
        "tool_not_finished",
        f"{tool} did not finish: its run ended {run.status} while its task was {task.status}.",
        {**details, "run_status": run.status, "task_status": task.status},
    )


def status_message(state: ToolCallState, status: str) -> str | None:
    run, task = state.run, state.task
    if status == WORKING:
        # What stops the call goes before a progress message it may have outlived.
        if state.notice:
            return state.notice
        if task.progress_message:
            return task.progress_message
        return f"{run.tasks_completed} of {run.tasks_total} tasks completed."
    if status == INPUT_REQUIRED:
        return "Waiting for input: " + ", ".join(state.outstanding) + "."
    if status == CANCELLED:
        return f"Cancelled: {run.cancel_reason}" if run.cancel_reason else "Cancelled."
    return None


def task_object(state: ToolCallState) -> dict[str, Any]:
    """The extension's ``DetailedTask`` for a tool call: the task id is the run id."""
    status = status_of(state)
    shape: dict[str, Any] = {
        "taskId": str(state.run.pk),
        "status": status,
        "createdAt": time_text(state.call.created_at),
        "lastUpdatedAt": time_text(state.run.updated_at),
        "ttlMs": state.call.ttl_ms,
        "pollIntervalMs": app_settings.MCP_TASK_POLL_INTERVAL_MS,
    }
    message = status_message(state, status)
    if message is not None:
        shape["statusMessage"] = message
    if status == INPUT_REQUIRED:
        shape["inputRequests"] = state.outstanding
    elif status == COMPLETED:
        shape["result"] = call_result(state)
    return shape

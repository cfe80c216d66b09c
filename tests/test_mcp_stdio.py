"""The MCP server over stdio: a spawned ``pmcp_mcp`` driven by the SDK's client session."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid

import anyio
import pytest

from parallel_mcp.mcp.tools import tool_specs, tools_in
from tests.mcp_support import (
    SERVER,
    UNKNOWN,
    call,
    error_of,
    fail,
    full_run,
    stdio_session,
    tool_names,
    typescript_client_check,
)
from tests.subprocesses import REPO, subprocess_env

pytestmark = pytest.mark.django_db(transaction=True)


def test_tool_listing_and_a_full_run_over_stdio():
    async def scenario():
        async with stdio_session() as session:
            tools = {tool.name: tool for tool in (await session.list_tools()).tools}
            assert set(tools) == set(tool_specs())
            required = {
                name: set(tool.input_schema.get("required", [])) for name, tool in tools.items()
            }
            assert required["create_run"] == set()
            assert required["enqueue_task"] == {"run_id", "kind"}
            assert required["claim_next_task"] == {"worker_id"}
            assert required["complete_task"] == {"task_id", "lease_id", "worker_id"}
            assert required["pause_task"] == {"task_id", "lease_id", "worker_id", "status"}
            assert required["report_progress"] == {"task_id", "lease_id", "worker_id", "progress"}
            assert tools["get_run"].annotations.read_only_hint is True
            assert tools["cancel_run"].annotations.destructive_hint is True
            assert all(tool.output_schema["type"] == "object" for tool in tools.values())
            assert all(tool.description for tool in tools.values())
            await full_run(session, session, session)

    anyio.run(scenario)


def test_every_error_path_is_a_tool_error_and_the_server_keeps_serving():
    async def scenario():
        async with stdio_session() as s:
            # Unknown ids: reads answer null, writes fail with not_found.
            assert await call(s, "get_run", run_id=UNKNOWN) == {"run": None}
            assert await call(s, "get_task", task_id=UNKNOWN) == {"task": None}
            assert await call(s, "get_current_context_snapshot", run_id=UNKNOWN) == {
                "snapshot": None
            }
            error = await fail(s, "cancel_run", {"run_id": UNKNOWN})
            assert error["code"] == "not_found" and error["details"]["run_id"] == UNKNOWN
            assert (await fail(s, "enqueue_task", {"run_id": UNKNOWN, "kind": "k"}))[
                "code"
            ] == "not_found"
            refs = {"task_id": UNKNOWN, "lease_id": UNKNOWN, "worker_id": "w"}
            assert (await fail(s, "mark_task_running", refs))["code"] == "not_found"
            assert (await fail(s, "explain_task", {"task_id": UNKNOWN}))["code"] == "not_found"
            # The lists of one run, as the HTTP API's runs/{run_id}/tasks and …/events (404).
            for tool in ("list_run_tasks", "list_run_events"):
                error = await fail(s, tool, {"run_id": UNKNOWN})
                assert error["code"] == "not_found" and error["details"]["run_id"] == UNKNOWN

            # Malformed ids never reach the orchestrator.
            for tool, arguments in [
                ("get_run", {"run_id": "not-a-uuid"}),
                ("get_task", {"task_id": "1234"}),
                ("mark_task_running", {**refs, "lease_id": 7}),
                ("list_pending_tasks", {"run_id": "x"}),
            ]:
                error = await fail(s, tool, arguments)
                assert error["code"] == "validation_error", (tool, error)
                assert error["details"]["errors"]

            run = (await call(s, "create_run", namespace="errors"))["run"]
            task = (await call(s, "enqueue_task", run_id=run["id"], kind="k", key="a"))["task"]
            error = await fail(
                s, "enqueue_task", {"run_id": run["id"], "kind": "k", "depends_on": ["zzz"]}
            )
            assert error["code"] == "validation_error" and error["details"]["field"] == (
                "depends_on.0"
            )

            # Schema violations: missing, unknown, wrong type, out of bounds, bad enum, naive time.
            cases = [
                ("enqueue_task", {"run_id": run["id"]}, None, "'kind' is a required property"),
                ("list_runs", {"colour": "red"}, None, "'colour' was unexpected"),
                (
                    "enqueue_task",
                    {"run_id": run["id"], "kind": "k", "priority": "high"},
                    "priority",
                    "",
                ),
                ("list_runs", {"limit": 0}, "limit", "minimum"),
                ("list_runs", {"limit": 100_000}, "limit", "maximum"),
                ("list_runs", {"statuses": ["running"]}, "statuses.0", ""),
                ("claim_next_task", {"worker_id": "w", "lease_ms": 0}, "lease_ms", ""),
                ("claim_next_task", {"worker_id": ""}, "worker_id", ""),
                ("report_progress", {**refs, "progress": 1.5}, "progress", ""),
                ("pause_task", {**refs, "status": "sleeping"}, "status", ""),
                ("fail_task", {**refs}, None, "'error' is a required property"),
                (
                    "enqueue_task",
                    {"run_id": run["id"], "kind": "k", "not_before": "2026-01-01T00:00:00"},
                    "not_before",
                    "date-time",
                ),
                ("prune_runs", {"older_than": "soon"}, "older_than", ""),
                ("prune_runs", {"older_than": "7d", "statuses": ["active"]}, "statuses.0", ""),
                ("list_events_since", {"after_id": -1}, "after_id", ""),
            ]
            for tool, arguments, field, fragment in cases:
                error = await fail(s, tool, arguments)
                assert error["code"] == "validation_error", (tool, error)
                assert error["details"]["tool"] == tool
                assert error["details"]["field"] == field, (tool, error)
                assert fragment in error["message"], (tool, error)

            # Validation done by the orchestrator itself.
            error = await fail(s, "enqueue_task", {"run_id": run["id"], "kind": "   "})
            assert error["code"] == "validation_error" and error["details"]["field"] == "kind"

            # Batches: a cycle, a duplicate key.
            error = await fail(
                s,
                "enqueue_tasks",
                {
                    "run_id": run["id"],
                    "tasks": [
                        {"kind": "k", "key": "x", "depends_on": ["y"]},
                        {"kind": "k", "key": "y", "depends_on": ["x"]},
                    ],
                },
            )
            assert error["code"] == "dependency_cycle"
            error = await fail(s, "enqueue_task", {"run_id": run["id"], "kind": "k", "key": "a"})
            assert error["code"] == "duplicate_task_key"

            # Lease conflict, invalid transitions, lease expiry.
            assert (await fail(s, "resume_task", {"task_id": task["id"]}))[
                "code"
            ] == "invalid_transition"
            claim = (await call(s, "claim_next_task", worker_id="w1"))["claim"]
            held = {"task_id": task["id"], "lease_id": claim["lease"]["id"], "worker_id": "w1"}
            error = await fail(s, "mark_task_running", {**held, "worker_id": "w2"})
            assert error["code"] == "lease_conflict" and error["details"]["task_id"] == task["id"]
            error = await fail(s, "complete_task", {**held, "lease_id": UNKNOWN})
            assert error["code"] == "lease_conflict"
            await call(s, "mark_task_running", **held)
            assert (await fail(s, "mark_task_running", held))["code"] == "invalid_transition"
            await call(s, "release_task", **held, reason="not now")
            short = (await call(s, "claim_next_task", worker_id="w1", lease_ms=1))["claim"]
            await anyio.sleep(0.05)
            error = await fail(
                s,
                "heartbeat_lease",
                {"task_id": task["id"], "lease_id": short["lease"]["id"], "worker_id": "w1"},
            )
            assert error["code"] == "lease_expired"

            # A finished run takes no new tasks.
            await call(s, "cancel_run", run_id=run["id"], reason="enough")
            error = await fail(s, "enqueue_task", {"run_id": run["id"], "kind": "k"})
            assert error["code"] == "run_terminal"

            error = await fail(s, "no_such_tool", {})
            assert error["code"] == "unknown_tool"

            # Still serving.
            assert await tool_names(s) == set(tool_specs())
            assert (await call(s, "list_runs", namespace="errors"))["runs"][0]["status"] == (
                "cancelled"
            )

    anyio.run(scenario)


def test_read_only_mode_lists_and_allows_only_reading_tools():
    async def scenario():
        async with stdio_session("--read-only") as s:
            read = {spec.name for spec in tools_in(("read",))}
            assert await tool_names(s) == read
            for tool in ("create_run", "claim_next_task", "cancel_run", "prune_runs"):
                error = await fail(s, tool, {})
                assert error["code"] == "forbidden" and "read-only" in error["message"]
            assert await call(s, "list_runs") == {"runs": []}
            templates = await s.list_resource_templates()
            assert len(templates.resource_templates) == 2

    anyio.run(scenario)


def _rpc(ident: int | None, method: str, params: dict | None = None) -> str:
    message = {"jsonrpc": "2.0", "method": method}
    if ident is not None:
        message["id"] = ident
    if params is not None:
        message["params"] = params
    return json.dumps(message) + "\n"


def test_stdout_carries_only_protocol_messages_even_with_debug_logging():
    process = subprocess.Popen(
        [*SERVER, "-v", "3"],
        cwd=REPO,
        env=subprocess_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    watchdog = threading.Timer(60, process.kill)
    watchdog.start()
    lines: list[str] = []

    def send_and_wait(ident: int | None, text: str) -> None:
        process.stdin.write(text)
        process.stdin.flush()
        while ident is not None:
            line = process.stdout.readline()
            assert line, f"server closed stdout:\n{process.stderr.read()}"
            lines.append(line)
            if json.loads(line).get("id") == ident:
                return

    try:
        send_and_wait(
            1,
            _rpc(
                1,
                "initialize",
                {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "1"},
                },
            ),
        )
        send_and_wait(None, _rpc(None, "notifications/initialized"))
        send_and_wait(2, _rpc(2, "tools/list"))
        send_and_wait(3, _rpc(3, "tools/call", {"name": "create_run", "arguments": {}}))
        send_and_wait(4, _rpc(4, "tools/call", {"name": "get_run", "arguments": {"run_id": 1}}))
        send_and_wait(None, "this is not json\n")
        send_and_wait(5, _rpc(5, "tools/call", {"name": "nope"}))
        send_and_wait(6, _rpc(6, "resources/read", {"uri": f"pmcp://runs/{uuid.uuid4()}"}))
        send_and_wait(7, _rpc(7, "tools/call", {"name": "list_runs", "arguments": {}}))
        rest, errors = process.communicate(timeout=30)  # closes stdin: the server exits
    finally:
        watchdog.cancel()
        if process.poll() is None:
            process.kill()
            process.wait()
    lines += rest.splitlines(keepends=True)
    assert process.returncode == 0, errors
    for line in lines:
        message = json.loads(line)  # every line of stdout is one JSON-RPC message
        assert message["jsonrpc"] == "2.0"
    answered = {json.loads(line).get("id"): json.loads(line) for line in lines}
    assert len(answered[2]["result"]["tools"]) == len(tool_specs())
    assert answered[3]["result"]["isError"] is False
    schemas = {tool["name"]: tool.get("outputSchema") for tool in answered[2]["result"]["tools"]}
    for ident, tool in [(3, "create_run"), (4, "get_run"), (5, "nope"), (7, "list_runs")]:
        typescript_client_check(tool, schemas.get(tool), answered[ident]["result"])
    assert error_of("get_run", answered[4]["result"])["code"] == "validation_error"
    assert error_of("nope", answered[5]["result"])["code"] == "unknown_tool"
    assert answered[6]["error"]["code"] == -32002
    assert len(answered[7]["result"]["structuredContent"]["runs"]) == 1
    assert "MCP server on stdio" in errors  # the logs went to stderr


def test_stdio_refuses_http_only_options_with_one_line():
    result = subprocess.run(
        [*SERVER, "--port", "9000"],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode != 0 and result.stdout == ""
    assert result.stderr.strip().splitlines() == [
        "CommandError: --port applies only to --transport http"
    ]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))

"""Helpers for the MCP tests: spawn the real server (stdio or HTTP) and talk to it with the SDK's
own client session."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

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


def stdio_parameters(*options: str) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=SERVER[1:] + list(options),
        env=subprocess_env(),
        cwd=str(REPO),
    )


@asynccontextmanager
async def stdio_session(*options: str) -> AsyncIterator[ClientSession]:
    """An initialized client session with a freshly spawned ``pmcp_mcp`` over stdio."""
    with tempfile.TemporaryFile(mode="w+") as errlog:
        async with stdio_client(stdio_parameters(*options), errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


@asynccontextmanager
async def http_session(url: str, token: str | None = None) -> AsyncIterator[ClientSession]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0)) as http:
        async with streamable_http_client(url, http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                yield session


async def call(session: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """The structured result of a successful call (the SDK checks it against the schema)."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, f"{tool} failed: {result.structured_content}"
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def fail(session: ClientSession, tool: str, arguments: Any = None) -> dict[str, Any]:
    """The ``error`` object of a call that must fail as a tool error."""
    result = await session.call_tool(tool, {} if arguments is None else arguments)
    assert result.is_error, f"{tool} unexpectedly succeeded: {result.structured_content}"
    error = result.structured_content["error"]
    assert set(error) == {"code", "message", "details"}
    assert isinstance(error["message"], str) and error["message"]
    return error


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
    default), with the test settings or another settings module."""

    def __init__(
        self,
        *options: str,
        host: str | None = None,
        settings: str = "tests.settings",
        wait: bool = True,
    ) -> None:
        self.port = free_port()
        self.address = connect_address(host or "127.0.0.1")
        shown = f"[{self.address}]" if ":" in self.address else self.address
        self.url = f"http://{shown}:{self.port}/mcp"
        self.stderr = tempfile.TemporaryFile(mode="w+")
        command = [*SERVER[:-1], f"--settings={settings}", "--transport", "http"]
        if host is not None:
            command += ["--host", host]
        self.process = subprocess.Popen(
            [*command, "--port", str(self.port), *options],
            cwd=REPO,
            env=subprocess_env(),
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

"""MCP clients other than the Python SDK: every tool result, errors included, checked as the
TypeScript SDK 1.x ``Client.callTool`` checks it (the MCP Inspector 0.15 and 2.x, most
JavaScript hosts); the tool schemas as the Inspector's ``--strict`` portability check reads
them; what such clients ask on connect (``prompts/list``); and the answers MCP must give as the
HTTP API gives them (an unknown run, a lease lost to a cancellation)."""

from __future__ import annotations

import json
from collections import defaultdict

import anyio
import jsonschema
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError

from parallel_mcp.mcp.server import build_server
from parallel_mcp.mcp.tools import tool_specs, tools_in
from tests.mcp_support import (
    AJV_FORMATS,
    UNKNOWN,
    call,
    fail,
    portability_findings,
    typescript_client_check,
)

READ = {spec.name for spec in tools_in(("read",))}
WORKER_CALLS = {
    "mark_task_running": {},
    "heartbeat_lease": {},
    "report_progress": {"progress": 0.5},
    "pause_task": {"status": "blocked"},
    "complete_task": {},
    "fail_task": {"error": "boom"},
    "release_task": {},
}
# Tools that can only fail on their arguments: they take no id, or answer null for an unknown
# one (get_*), and every value the schema lets through is one they accept.
ARGUMENT_ERRORS_ONLY = {
    "create_run",
    "get_run",
    "list_runs",
    "prune_runs",
    "expire_leases",
    "get_task",
    "list_pending_tasks",
    "list_dead_tasks",
    "list_stuck_tasks",
    "get_current_context_snapshot",
    "list_events_since",
}


def _text(data: object) -> list[dict]:
    return [{"type": "text", "text": json.dumps(data)}]


def test_the_check_fails_where_typescript_clients_fail():
    """The helper refuses what ``Client.callTool`` refuses, so the tests using it can fail."""
    schema = tool_specs()["get_task"].output_schema
    envelope = {"error": {"code": "not_found", "message": "No.", "details": {}}}
    # The error form of the issue: the envelope as structuredContent, checked against the schema.
    with pytest.raises(AssertionError, match="'task' is a required property"):
        typescript_client_check(
            "get_task",
            schema,
            {"isError": True, "content": _text(envelope), "structuredContent": envelope},
        )
    with pytest.raises(AssertionError, match="did not return structured content"):
        typescript_client_check("get_task", schema, {"content": _text({"task": None})})
    events = tool_specs()["list_run_events"].output_schema
    event = {
        "id": 1,
        "run_id": UNKNOWN,
        "task_id": None,
        "attempt_id": None,
        "event_type": "run.created",
        "payload": {"any": ["json"]},
        "created_at": "2026-01-01T12:00:00Z",
        "actor": None,
    }
    typescript_client_check("list_run_events", events, {"structuredContent": {"events": [event]}})
    for field, value, reason in [
        ("run_id", "7", "is not a 'uuid'"),
        ("created_at", "2026-01-01T12:00:00", "is not a 'date-time'"),
        ("id", "1", "is not of type 'integer'"),
    ]:
        wrong = {"structuredContent": {"events": [{**event, field: value}]}}
        with pytest.raises(AssertionError, match=f"data/events/0/{field} .* {reason}"):
            typescript_client_check("list_run_events", events, wrong)
    typescript_client_check("get_task", schema, {"isError": True, "content": _text(envelope)})
    typescript_client_check("get_task", schema, {"structuredContent": {"task": None}})
    typescript_client_check("get_task", None, {"structuredContent": envelope})  # not listed
    # ajv-formats' date-time wants a time zone, as the server always writes one.
    assert AJV_FORMATS.conforms("2026-01-01T12:00:00.123456Z", "date-time")
    assert AJV_FORMATS.conforms("2026-01-01t12:00:00+02:00", "date-time")
    assert not AJV_FORMATS.conforms("2026-01-01T12:00:00", "date-time")
    assert not AJV_FORMATS.conforms("2026-02-30T12:00:00Z", "date-time")


@pytest.mark.django_db(transaction=True)
def test_every_tool_fails_readably_for_typescript_clients():
    """Bad arguments, unknown ids, conflicts and refusals, for every tool: each result is one
    that ``Client.callTool`` accepts, with the error readable in its text."""
    codes: dict[str, set[str]] = defaultdict(set)

    async def refused(session, tool, arguments, code):
        error = await fail(session, tool, arguments)  # checked as a TypeScript client checks
        assert error["code"] == code, (tool, arguments, error)
        codes[tool].add(code)
        return error

    async def scenario():
        async with Client(build_server(), mode="legacy") as client:
            s = client.session
            for tool in tool_specs():
                error = await refused(s, tool, {"no_such_argument": 1}, "validation_error")
                assert "no_such_argument" in error["message"]
                assert error["details"]["tool"] == tool
            await refused(s, "get_run", {"run_id": "not-a-uuid"}, "validation_error")
            await refused(
                s, "prune_runs", {"older_than": "1d", "statuses": ["active"]}, "validation_error"
            )
            await refused(s, "list_stuck_tasks", {"running_longer_than_ms": -1}, "validation_error")

            # Unknown ids.
            refs = {"task_id": UNKNOWN, "lease_id": UNKNOWN, "worker_id": "w"}
            for tool, arguments in [
                ("cancel_run", {"run_id": UNKNOWN}),
                ("copy_run", {"run_id": UNKNOWN}),
                ("enqueue_task", {"run_id": UNKNOWN, "kind": "k"}),
                ("enqueue_tasks", {"run_id": UNKNOWN, "tasks": [{"kind": "k"}]}),
                ("append_context_snapshot", {"run_id": UNKNOWN, "payload": {}}),
                ("list_run_tasks", {"run_id": UNKNOWN}),
                ("list_run_events", {"run_id": UNKNOWN}),
                ("resume_task", {"task_id": UNKNOWN}),
                ("cancel_task", {"task_id": UNKNOWN}),
                ("retry_task", {"task_id": UNKNOWN}),
                ("requeue_dead_task", {"task_id": UNKNOWN}),
                ("explain_task", {"task_id": UNKNOWN}),
                *((tool, {**refs, **extra}) for tool, extra in WORKER_CALLS.items()),
            ]:
                await refused(s, tool, arguments, "not_found")

            # Conflicts.
            run = (await call(s, "create_run", namespace="interop"))["run"]["id"]
            task = (await call(s, "enqueue_task", run_id=run, kind="k", key="a"))["task"]["id"]
            await refused(
                s, "enqueue_task", {"run_id": run, "kind": "k", "key": "a"}, "duplicate_task_key"
            )
            cycle = [
                {"kind": "k", "key": "x", "depends_on": ["y"]},
                {"kind": "k", "key": "y", "depends_on": ["x"]},
            ]
            await refused(s, "enqueue_tasks", {"run_id": run, "tasks": cycle}, "dependency_cycle")
            for tool in ("resume_task", "retry_task", "requeue_dead_task"):
                await refused(s, tool, {"task_id": task}, "invalid_transition")
            claim = (await call(s, "claim_next_task", worker_id="w1", client_token="t"))["claim"]
            await refused(
                s,
                "claim_next_task",
                {"worker_id": "w2", "client_token": "t"},
                "idempotency_conflict",
            )
            await call(s, "enqueue_task", run_id=run, kind="k")
            await call(s, "claim_next_tasks", worker_id="w1", limit=1, client_token="b")
            await refused(
                s,
                "claim_next_tasks",
                {"worker_id": "w2", "limit": 1, "client_token": "b"},
                "idempotency_conflict",
            )
            held = {"task_id": task, "lease_id": claim["lease"]["id"], "worker_id": "w1"}
            for tool, extra in WORKER_CALLS.items():
                error = await refused(
                    s, tool, {**held, "worker_id": "w2", **extra}, "lease_conflict"
                )
                assert error["details"]["cancelled"] is False
            await call(s, "cancel_run", run_id=run)
            await refused(s, "cancel_task", {"task_id": task}, "invalid_transition")
            await refused(s, "enqueue_task", {"run_id": run, "kind": "k"}, "run_terminal")
            await refused(
                s, "enqueue_tasks", {"run_id": run, "tasks": [{"kind": "k"}]}, "run_terminal"
            )
            for tool, extra in WORKER_CALLS.items():
                error = await refused(s, tool, {**held, **extra}, "lease_conflict")
                assert error["details"]["cancelled"] is True

        # Refusals: a read-only server lists only the reading tools. A TypeScript client has no
        # output schema for the others, and the error is in the text all the same.
        async with Client(build_server(read_only=True), mode="legacy") as client:
            for tool in set(tool_specs()) - READ:
                error = await refused(client.session, tool, {}, "forbidden")
                assert "read-only" in error["message"]
            await refused(client.session, "no_such_tool", {}, "unknown_tool")

    anyio.run(scenario)
    assert set(tool_specs()) <= set(codes)
    beyond_arguments = {tool for tool in tool_specs() if codes[tool] - {"validation_error"}}
    assert beyond_arguments | ARGUMENT_ERRORS_ONLY == set(tool_specs())


def test_tool_schemas_pass_the_inspector_strict_check():
    """No `type` arrays, no schema that accepts anything without saying so ("any JSON" is one
    branch per JSON type), no boolean schemas, no remote references."""
    for name, spec in tool_specs().items():
        assert portability_findings(spec.input_schema, "inputSchema") == [], name
        assert portability_findings(spec.output_schema, "outputSchema") == [], name
    # "Any JSON" still means any JSON value, as the services accept it.
    output = tool_specs()["complete_task"].input_schema["properties"]["output"]
    task = tool_specs()["get_task"].output_schema["properties"]["task"]["anyOf"][0]
    for schema in (output, task["properties"]["input"]):
        for value in ({"a": [1]}, [None], "text", 0, 1.5, True, False, None):
            jsonschema.Draft202012Validator(schema).validate(value)


def test_the_strict_check_mirror_finds_what_the_inspector_reports():
    any_value = {"description": "Any JSON value."}
    assert portability_findings({"type": "object", "properties": {"x": any_value}}) == [
        ".properties.x: no validation keyword (accepts any value)"
    ]
    assert portability_findings({"type": ["string", "null"]}) == [
        ": `type` is an array ['string', 'null']"
    ]
    assert portability_findings({"anyOf": [{"type": "string"}, True]}) == [
        ".anyOf[1]: bare boolean schema"
    ]
    assert portability_findings({"type": "object", "additionalProperties": False}) == []
    assert portability_findings({"$ref": "https://example.com/s.json"}) == [
        ": remote $ref https://example.com/s.json"
    ]


@pytest.mark.django_db(transaction=True)
def test_prompts_list_is_answered_with_no_prompts():
    async def scenario():
        async with Client(build_server(), mode="legacy") as client:
            assert client.session.server_capabilities.prompts is not None
            assert (await client.session.list_prompts()).prompts == []
            with pytest.raises(MCPError) as unknown:
                await client.session.get_prompt("plan_a_run")
            assert unknown.value.code == -32602 and "plan_a_run" in str(unknown.value)

    anyio.run(scenario)

"""The MCP tool catalogue: one tool per Orchestrator method with matching, described schemas;
every tool exercised through the SDK's client session against the server in process."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from types import SimpleNamespace

import anyio
import jsonschema
import pytest
from django.contrib.auth.models import Permission, User
from mcp import Client

from parallel_mcp import Orchestrator
from parallel_mcp.contract import protocol
from parallel_mcp.mcp import docs
from parallel_mcp.mcp.auth import allowed_tools
from parallel_mcp.mcp.server import ParallelMcpServer, build_server
from parallel_mcp.mcp.tools import GROUPS, tool_specs, tools_in
from tests.mcp_support import UNKNOWN, call, error_of, fail, tool_names, wire

DOCS = Path(__file__).resolve().parent.parent / "docs" / "mcp.md"
WORKER_PROTOCOL = {
    "claim_next_task",
    "claim_next_tasks",
    "mark_task_running",
    "heartbeat_lease",
    "report_progress",
    "pause_task",
    "complete_task",
    "fail_task",
    "release_task",
}


def public_methods() -> dict[str, inspect.Signature]:
    """The orchestrator's methods, as the protocol both orchestrators implement lists them
    (``transaction()`` is not one: a database transaction cannot span tool calls)."""
    return {name: protocol.signature(name) for name in protocol.method_names()}


def test_every_orchestrator_method_is_a_tool_with_its_arguments():
    methods = public_methods()
    assert set(tool_specs()) == set(methods)
    for name, spec in tool_specs().items():
        parameters = {
            param.name: param
            for param in methods[name].parameters.values()
            if param.name not in ("self", "now")
        }
        properties = spec.input_schema["properties"]
        assert set(properties) == set(parameters), name
        required = {
            p for p, param in parameters.items() if param.default is inspect.Parameter.empty
        }
        assert set(spec.input_schema.get("required", [])) == required, name


def test_schemas_are_valid_strict_and_described():
    for spec in tool_specs().values():
        schema = spec.input_schema
        jsonschema.Draft202012Validator.check_schema(schema)
        jsonschema.Draft202012Validator.check_schema(spec.output_schema)
        assert schema["type"] == "object" and schema["additionalProperties"] is False
        assert spec.output_schema["type"] == "object"
        assert len(spec.description) > 30, spec.name
        for name, prop in schema["properties"].items():
            assert prop.get("description"), f"{spec.name}.{name} has no description"
        assert spec.group in GROUPS


def test_bounds_and_enums_are_in_the_schemas():
    specs = tool_specs()
    lease = specs["claim_next_task"].input_schema["properties"]["lease_ms"]
    assert lease["anyOf"][1] == {"type": "null"}
    assert lease["anyOf"][0]["type"] == "integer" and lease["anyOf"][0]["minimum"] == 1
    progress = specs["report_progress"].input_schema["properties"]["progress"]
    assert (progress["minimum"], progress["maximum"]) == (0, 1)
    batch = specs["claim_next_tasks"].input_schema
    assert (batch["properties"]["limit"]["minimum"], batch["properties"]["limit"]["maximum"]) == (
        1,
        100,
    )
    assert batch["required"] == ["worker_id", "limit"]
    assert batch["properties"]["start"]["type"] == "boolean"
    assert specs["claim_next_task"].input_schema["properties"]["start"]["type"] == "boolean"
    limit = specs["list_runs"].input_schema["properties"]["limit"]
    assert (limit["minimum"], limit["maximum"]) == (1, 1000)
    statuses = specs["list_runs"].input_schema["properties"]["statuses"]
    assert statuses["anyOf"][0]["items"]["enum"] == [
        "pending",
        "active",
        "waiting",
        "completed",
        "failed",
        "cancelled",
    ]
    assert specs["pause_task"].input_schema["properties"]["status"]["enum"] == [
        "blocked",
        "waiting_input",
    ]
    assert specs["get_run"].input_schema["properties"]["run_id"]["format"] == "uuid"


def test_groups():
    assert {spec.name for spec in tools_in(("worker",))} == WORKER_PROTOCOL
    read = {spec.name for spec in tools_in(("read",))}
    assert read == {
        "get_run",
        "list_runs",
        "get_task",
        "list_run_tasks",
        "list_pending_tasks",
        "list_dead_tasks",
        "explain_task",
        "list_stuck_tasks",
        "get_current_context_snapshot",
        "list_run_events",
        "list_events_since",
    }
    assert all(spec.read_only == (spec.group == "read") for spec in tool_specs().values())


def test_the_docs_tool_reference_is_up_to_date(capsys):
    assert docs.main(["--check", str(DOCS)]) == 0, capsys.readouterr().err
    text = DOCS.read_text()
    for name in tool_specs():
        assert f"| [`{name}`](#{name}) |" in text
        assert f"#### {name}\n" in text


def test_the_docs_check_notices_a_stale_reference(tmp_path, capsys):
    stale = tmp_path / "mcp.md"
    stale.write_text(DOCS.read_text().replace("#### claim_next_task", "#### claim_a_task"))
    assert docs.main(["--check", str(stale)]) == 1
    assert "out of date" in capsys.readouterr().err
    assert docs.main(["--write", str(stale)]) == 0
    assert docs.main(["--check", str(stale)]) == 0


@pytest.mark.django_db
def test_roles_and_permissions_pick_the_tools():
    admin = User.objects.create_superuser("root", password="pw")
    assert allowed_tools(role="full", user=admin) == set(tool_specs())
    assert allowed_tools(role="read", user=admin) == {s.name for s in tools_in(("read",))}
    assert allowed_tools(role="worker", user=admin) == WORKER_PROTOCOL | {
        s.name for s in tools_in(("read",))
    }
    assert allowed_tools(role="bogus", user=admin) == set()
    clerk = User.objects.create_user("clerk", password="pw")
    assert allowed_tools(role="full", user=clerk) == set()
    clerk.user_permissions.add(
        Permission.objects.get(codename="view_task"),
        Permission.objects.get(codename="operate_runs"),
    )
    clerk = User.objects.get(pk=clerk.pk)  # permissions are cached per instance
    assert allowed_tools(role="full", user=clerk) == {s.name for s in tools_in(("write",))} | {
        "get_task",
        "list_run_tasks",
        "list_pending_tasks",
        "list_dead_tasks",
        "explain_task",
        "list_stuck_tasks",
    }
    # A worker token reads with its user's view permissions; clerk may not work.
    assert allowed_tools(role="worker", user=clerk) == {
        "get_task",
        "list_run_tasks",
        "list_pending_tasks",
        "list_dead_tasks",
        "explain_task",
        "list_stuck_tasks",
    }


def test_with_auth_required_a_request_without_a_token_is_allowed_nothing():
    server = ParallelMcpServer(orchestrator=Orchestrator(), auth_required=True)
    assert server.allowed(SimpleNamespace(request=None)) == set()
    assert ParallelMcpServer(orchestrator=Orchestrator()).allowed(None) == set(tool_specs())


@pytest.mark.django_db(transaction=True)
def test_every_tool_through_the_client_session_in_process():
    """Each call's structured result is checked by the SDK client against its output schema."""
    used: set[str] = set()

    async def run(session, tool, **arguments):
        used.add(tool)
        return await call(session, tool, **arguments)

    async def scenario():
        async with Client(build_server(), mode="legacy") as client:
            s = client.session
            run_ = (await run(s, "create_run", namespace="tools", max_parallel=5))["run"]
            rid = run_["id"]
            assert run_["max_parallel"] == 5
            batch = (
                await run(
                    s,
                    "enqueue_tasks",
                    run_id=rid,
                    tasks=[
                        {"kind": "a", "key": "a", "max_attempts": 1, "timeout_ms": 1},
                        {"kind": "b", "key": "b", "depends_on": ["a"], "priority": 3},
                        {
                            "kind": "c",
                            "key": "c",
                            "depends_on": [{"task_id": "a", "required": False}],
                            "not_before": "2000-01-01T00:00:00Z",
                            "retry": {"delay_ms": 0, "backoff": "fixed"},
                        },
                    ],
                )
            )["tasks"]
            a, b, c = batch
            assert b["depends_on_task_ids"] == [a["id"]] and c["not_before"].startswith("2000")
            pending = (
                await run(s, "list_pending_tasks", run_id=rid, ready_by="2030-01-01T00:00:00+00:00")
            )["tasks"]
            assert [task["key"] for task in pending] == ["a"]
            snapshot = (
                await run(s, "append_context_snapshot", run_id=rid, payload={"k": 1}, label="l1")
            )["snapshot"]
            assert snapshot["scope"] == "run"
            claim = (await run(s, "claim_next_task", worker_id="w", kinds=["a"]))["claim"]
            refs = {"task_id": a["id"], "lease_id": claim["lease"]["id"], "worker_id": "w"}
            await run(s, "mark_task_running", **refs)
            await run(s, "heartbeat_lease", **refs)
            await run(s, "report_progress", **refs, progress=0.25)
            await anyio.sleep(0.01)
            stuck = (await run(s, "list_stuck_tasks", running_longer_than_ms=0))["tasks"]
            assert [task["id"] for task in stuck] == [a["id"]] and stuck[0]["running_for_ms"] >= 0
            failed = (await run(s, "fail_task", **refs, error="boom", retry=True))["task"]
            assert failed["status"] == "failed" and failed["dead"] is True
            dead = (await run(s, "list_dead_tasks", run_id=rid))["tasks"]
            assert [task["id"] for task in dead] == [a["id"]]
            explained = (await run(s, "explain_task", task_id=b["id"]))["blockers"]
            assert explained[0]["kind"] == "dependency_failed"
            requeued = (await run(s, "requeue_dead_task", task_id=a["id"], reason="again"))["task"]
            assert requeued["status"] == "queued" and requeued["attempt_count"] == 0
            claim = (await run(s, "claim_next_task", worker_id="w", kinds=["a"]))["claim"]
            refs = {
                "task_id": claim["task"]["id"],
                "lease_id": claim["lease"]["id"],
                "worker_id": "w",
            }
            paused = (await run(s, "pause_task", **refs, status="waiting_input", reason="?"))[
                "task"
            ]
            assert paused["status"] == "waiting_input"
            resumed = (await run(s, "resume_task", task_id=paused["id"], input={"answer": 1}))[
                "task"
            ]
            assert resumed["status"] == "queued" and resumed["input"] == {"answer": 1}
            claim = (await run(s, "claim_next_task", worker_id="w", kinds=["a"]))["claim"]
            refs = {
                "task_id": claim["task"]["id"],
                "lease_id": claim["lease"]["id"],
                "worker_id": "w",
            }
            released = (await run(s, "release_task", **refs, reason="later"))["task"]
            assert released["status"] == "queued"
            claim = (await run(s, "claim_next_task", worker_id="w", kinds=["a"]))["claim"]
            refs = {
                "task_id": claim["task"]["id"],
                "lease_id": claim["lease"]["id"],
                "worker_id": "w",
            }
            blocked = (await run(s, "pause_task", **refs, status="blocked", blocked_by=[c["id"]]))[
                "task"
            ]
            assert blocked["status"] == "blocked"
            cancelled = (await run(s, "cancel_task", task_id=c["id"], reason="no"))["task"]
            assert cancelled["status"] == "cancelled"
            retried = (await run(s, "retry_task", task_id=c["id"], cascade=False))["task"]
            assert retried["status"] == "queued"
            # max_parallel runs are claimed one task per batch: use a run without it.
            other = (await run(s, "create_run", namespace="tools"))["run"]["id"]
            await run(s, "enqueue_task", run_id=other, kind="f")
            await run(s, "enqueue_task", run_id=other, kind="f")
            claims = (
                await run(s, "claim_next_tasks", worker_id="w", limit=5, kinds=["f"], start=True)
            )["claims"]
            assert len(claims) == 2 and {c["task"]["status"] for c in claims} == {"running"}
            for item in claims:
                refs = {
                    "task_id": item["task"]["id"],
                    "lease_id": item["lease"]["id"],
                    "worker_id": "w",
                }
                await run(s, "complete_task", **refs)
            await run(s, "enqueue_task", run_id=rid, kind="e", max_attempts=3)
            short = (await run(s, "claim_next_task", worker_id="w", kinds=["e"], lease_ms=1))[
                "claim"
            ]
            await anyio.sleep(0.02)
            expired = await run(s, "expire_leases")
            assert expired["count"] == 1 and expired["expired_task_ids"] == [short["task"]["id"]]
            copy = (await run(s, "copy_run", run_id=rid))["run"]
            assert copy["id"] != rid and copy["tasks_total"] == 4
            assert (await run(s, "cancel_run", run_id=copy["id"]))["run"]["status"] == "cancelled"
            pruned = await run(s, "prune_runs", older_than="2999-01-01T00:00:00+00:00")
            assert sorted(pruned["pruned_run_ids"]) == sorted([copy["id"], other])
            assert pruned["count"] == 2
            assert (await run(s, "prune_runs", older_than="1d", statuses=["failed"]))["count"] == 0
            for tool, arguments in [
                ("get_run", {"run_id": rid}),
                ("get_task", {"task_id": a["id"]}),
                ("list_runs", {"namespace": "tools", "order_by": "created_at", "order_dir": "asc"}),
                ("list_run_tasks", {"run_id": rid}),
                ("get_current_context_snapshot", {"run_id": rid}),
                ("list_run_events", {"run_id": rid}),
                ("list_events_since", {"after_id": 0, "event_types": ["task.failed"]}),
                ("enqueue_task", {"run_id": rid, "kind": "d", "input": [1, 2], "metadata": None}),
            ]:
                await run(s, tool, **arguments)
            completed = (await run(s, "claim_next_task", worker_id="w", kinds=["d"]))["claim"]
            refs = {
                "task_id": completed["task"]["id"],
                "lease_id": completed["lease"]["id"],
                "worker_id": "w",
            }
            await run(s, "complete_task", **refs, output=None, client_token="tok-1")
            again = (await run(s, "complete_task", **refs, client_token="tok-1"))["task"]
            assert again["status"] == "completed"  # replayed, not re-applied
            error = await fail(s, "fail_task", {**refs, "error": "x", "client_token": "tok-1"})
            assert error["code"] in ("idempotency_conflict", "lease_conflict")
            assert (await fail(s, "get_run", {"run_id": 5}))["code"] == "validation_error"
            assert await call(s, "get_task", task_id=UNKNOWN) == {"task": None}

    anyio.run(scenario)
    assert used == set(tool_specs())


@pytest.mark.django_db(transaction=True)
def test_the_modern_protocol_path_works_too():
    async def scenario():
        async with Client(build_server()) as client:  # mode="auto": no initialize handshake
            assert await tool_names(client.session) == set(tool_specs())
            result = await client.call_tool("create_run", {"namespace": "modern"})
            assert not result.is_error and result.structured_content["run"]["namespace"] == "modern"
            result = await client.call_tool("cancel_run", {"run_id": UNKNOWN})
            assert error_of("cancel_run", wire(result))["code"] == "not_found"

    anyio.run(scenario)


@pytest.mark.django_db(transaction=True)
def test_an_unexpected_exception_is_an_internal_error_and_the_server_goes_on():
    handlers = ParallelMcpServer()

    def boom(orchestrator, arguments):
        raise RuntimeError("database on fire")

    handlers.specs = dict(handlers.specs)
    handlers.specs["list_runs"] = dataclasses.replace(handlers.specs["list_runs"], call=boom)
    server = handlers.build()

    async def scenario():
        async with Client(server, mode="legacy") as client:
            error = await fail(client.session, "list_runs", {})
            assert error["code"] == "internal_error" and "RuntimeError" in error["message"]
            assert "on fire" not in error["message"]  # internals stay in the log
            await call(client.session, "create_run")

    anyio.run(scenario)


@pytest.mark.django_db(transaction=True)
def test_pause_task_asks_the_tool_callers_client_through_input_requests():
    from parallel_mcp.selectors import outstanding_input_requests
    from parallel_mcp.services.tool_calls import start_tool_call

    call_row = start_tool_call(
        using="default", tool="t", kind="k.tool", input={}, principal="local", ttl_ms=None
    )
    request = {"method": "sampling/createMessage", "params": {"maxTokens": 10, "messages": []}}

    async def scenario():
        async with Client(build_server(), mode="legacy") as client:
            s = client.session
            claim = (await call(s, "claim_next_task", worker_id="w", kinds=["k.tool"]))["claim"]
            refs = {"task_id": claim["task"]["id"], "lease_id": claim["lease"]["id"]}
            refs["worker_id"] = "w"
            # The schema refuses a method the extension does not know; the services a pause
            # that is not waiting_input.
            bad = {"q": {"method": "tools/call"}}
            error = await fail(
                s, "pause_task", {**refs, "status": "waiting_input", "input_requests": bad}
            )
            assert error["code"] == "validation_error"
            assert error["details"]["field"].startswith("input_requests")
            error = await fail(
                s, "pause_task", {**refs, "status": "blocked", "input_requests": {"q": request}}
            )
            assert error["code"] == "validation_error" and "waiting_input" in error["message"]
            paused = await call(
                s, "pause_task", **refs, status="waiting_input", input_requests={"q": request}
            )
            assert paused["task"]["status"] == "waiting_input"

    anyio.run(scenario)
    assert outstanding_input_requests(using="default", run_id=call_row.run_id) == {"q": request}

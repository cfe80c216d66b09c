"""The TTL of MCP tasks (io.modelcontextprotocol/tasks): ``ttlMs`` counts from the call, as
the extension says; a task past it whose run has ended has expired (``tasks/get`` answers
"Task has expired"), and ``pmcp_prune --expired`` deletes its run. A run still going on stays
visible past its TTL."""

from __future__ import annotations

import io
import uuid
from datetime import datetime, timedelta

import anyio
import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import CommandError, call_command
from django.utils import timezone
from mcp import Client
from mcp.shared.exceptions import MCPError

from parallel_mcp import Orchestrator
from parallel_mcp.mcp.declare import ToolRegistry, tool
from parallel_mcp.mcp.server import ParallelMcpServer
from parallel_mcp.models import InputRequest, Run, Task, ToolCall
from parallel_mcp.services import prune_expired_tool_calls
from parallel_mcp.services.tool_calls import start_tool_call
from parallel_mcp.worker.registry import HandlerRegistry
from tests.mcp_support import (
    TasksExtension,
    call_for_task,
    cancel_task,
    eventually,
    get_task,
    listening,
    no_connection_left_open,  # noqa: F401 - autouse
    update_task,
)
from tests.mcptools.definitions import NAME_REQUEST, declare

pytestmark = pytest.mark.django_db(transaction=True)

HOUR_MS = 3_600_000


def call_made(
    *, ago: timedelta, ttl_ms: int | None, finished: bool, principal: str = "local"
) -> ToolCall:
    """A call of ``add`` made ``ago``, its run completed then (``finished``) or still queued
    (a kind of its own, so that no other call's task is claimed)."""
    made = timezone.now() - ago
    kind = f"ttl.{uuid.uuid4().hex}"
    call = start_tool_call(
        using="default", tool="add", kind=kind, input={"a": 1}, principal=principal,
        ttl_ms=ttl_ms, now=made,
    )  # fmt: skip
    if finished:
        orch = Orchestrator()
        claim = orch.claim_next_task(worker_id="w", kinds=[kind], now=made)
        assert claim is not None and claim.run.id == call.run_id
        orch.complete_task(
            task_id=claim.task.id, lease_id=claim.lease.id, worker_id="w", output=2, now=made
        )
    return call


def prune(*args: str) -> list[str]:
    out = io.StringIO()
    call_command("pmcp_prune", *args, stdout=out)
    return out.getvalue().split()


def client(tools: ToolRegistry, **options) -> Client:
    return Client(ParallelMcpServer(tools=tools).build(), extensions=[TasksExtension()], **options)


# -- how long a task lives -----------------------------------------------------------------------
def test_ttl_is_the_tools_own_or_the_setting_and_counts_from_the_call(settings):
    settings.PARALLEL_MCP = {"MCP_TASK_TTL_MS": 5 * HOUR_MS}
    tools, handlers = ToolRegistry(), HandlerRegistry()
    declare(tools, handlers)
    tool("brief", ttl_ms=60_000, registry=tools, handlers=handlers)(lambda ctx: 1)
    tool("forever", ttl_ms=None, registry=tools, handlers=handlers)(lambda ctx: 1)

    async def scenario():
        async with client(tools) as c:
            handles = {
                name: await call_for_task(c.session, name, **arguments)
                for name, arguments in [("add", {"a": 1}), ("brief", {}), ("forever", {})]
            }
            # Unlimited is null on the wire (the field is required).
            polled = await get_task(c.session, handles["forever"]["taskId"])
            assert "ttlMs" in polled and polled["ttlMs"] is None
            return handles

    handles = anyio.run(scenario)
    assert {name: handle.get("ttlMs") for name, handle in handles.items()} == {
        "add": 5 * HOUR_MS, "brief": 60_000, "forever": None,
    }  # fmt: skip
    for handle in handles.values():
        call = ToolCall.objects.get(pk=handle["taskId"])
        assert call.ttl_ms == handle.get("ttlMs")
        if call.ttl_ms is None:
            assert call.expires_at is None
        else:
            assert call.expires_at == call.created_at + timedelta(milliseconds=call.ttl_ms)


@pytest.mark.parametrize("ttl_ms", [0, -1, 1.5, True, "1d", 10**15])
def test_a_tool_ttl_is_milliseconds_or_none(ttl_ms):
    with pytest.raises(ImproperlyConfigured, match="ttl_ms must be None"):
        tool("t", ttl_ms=ttl_ms, registry=ToolRegistry(), handlers=HandlerRegistry())


def test_an_ended_task_past_its_ttl_has_expired_and_a_running_one_has_not():
    tools = ToolRegistry()
    declare(tools, HandlerRegistry())
    expired = call_made(ago=timedelta(hours=2), ttl_ms=HOUR_MS, finished=True)
    running = call_made(ago=timedelta(hours=2), ttl_ms=HOUR_MS, finished=False)
    fresh = call_made(ago=timedelta(minutes=2), ttl_ms=HOUR_MS, finished=True)
    unlimited = call_made(ago=timedelta(days=400), ttl_ms=None, finished=True)
    someone_elses = call_made(
        ago=timedelta(hours=2), ttl_ms=HOUR_MS, finished=True, principal="token:x"
    )
    acks: list = []

    async def on_message(message) -> None:
        if getattr(message, "method", None) == "notifications/subscriptions/acknowledged":
            acks.append(message.params.notifications.model_dump(by_alias=True, exclude_none=True))

    async def scenario():
        async with client(tools, message_handler=on_message) as c:
            for task_id, error in [
                (expired.run_id, "Task has expired"),
                (someone_elses.run_id, "Task not found"),  # expired too, but not theirs
            ]:
                for verb, send in [
                    ("retrieve task", lambda t: get_task(c.session, t)),
                    ("update task", lambda t: update_task(c.session, t, {"k": {"a": 1}})),
                    ("cancel task", lambda t: cancel_task(c.session, t)),
                ]:
                    with pytest.raises(MCPError) as refused:
                        await send(str(task_id))
                    assert refused.value.code == -32602
                    assert refused.value.error.message == f"Failed to {verb}: {error}"
            assert (await get_task(c.session, str(running.run_id)))["status"] == "working"
            for call in (fresh, unlimited):
                done = await get_task(c.session, str(call.run_id))
                assert done["status"] == "completed"
                assert done["result"]["content"] == [{"type": "text", "text": "2"}]
            # A listener is not told of an expired task: it is not acknowledged.
            ids = [str(expired.run_id), str(fresh.run_id)]
            async with listening(c.session, ids) as stream:
                await eventually(lambda: "result" in stream)

    anyio.run(scenario)
    assert acks == [{"taskIds": [str(fresh.run_id)]}]
    assert Run.objects.get(pk=running.run_id).status == "active"  # nothing interrupted


# -- pruning ---------------------------------------------------------------------------------------
@pytest.fixture
def calls() -> dict[str, ToolCall]:
    return {
        "expired": call_made(ago=timedelta(hours=2), ttl_ms=HOUR_MS, finished=True),
        "running": call_made(ago=timedelta(hours=2), ttl_ms=HOUR_MS, finished=False),
        "fresh": call_made(ago=timedelta(minutes=2), ttl_ms=HOUR_MS, finished=True),
        "unlimited": call_made(ago=timedelta(days=400), ttl_ms=None, finished=True),
    }


def test_pmcp_prune_expired_deletes_the_runs_of_expired_tasks_only(calls):
    expired = calls["expired"]
    InputRequest.objects.create(
        run_id=expired.run_id, task_id=expired.task_id, key="q", request=NAME_REQUEST,
        requested_at=expired.created_at,
    )  # fmt: skip
    plain = Orchestrator().create_run()  # not a tool call: --expired never touches it
    Run.objects.filter(pk=plain.id).update(status="completed")

    assert prune("--expired", "--dry-run") == ["would", "prune", "1", "run(s)", str(expired.run_id)]
    assert ToolCall.objects.count() == 4
    assert prune("--expired") == ["pruned", "1", "run(s)", str(expired.run_id)]
    assert not Run.objects.filter(pk=expired.run_id).exists()
    assert not ToolCall.objects.filter(pk=expired.run_id).exists()
    assert not Task.objects.filter(run_id=expired.run_id).exists()
    assert not InputRequest.objects.exists()
    kept = {call.run_id for name, call in calls.items() if name != "expired"} | {plain.id}
    assert set(Run.objects.values_list("pk", flat=True)) == kept
    assert prune("--expired") == ["pruned", "0", "run(s)"]


def test_pmcp_prune_expired_in_batches_and_with_older_than(calls):
    more = [
        call_made(ago=timedelta(hours=3), ttl_ms=HOUR_MS, finished=True).run_id for _ in range(2)
    ]
    pruned = prune("--expired", "--older-than", "300d", "--limit", "1", "-v", "0")
    assert pruned == ["pruned", "4", "run(s)"]  # 3 expired, 1 last updated 400 days ago
    left = set(Run.objects.values_list("pk", flat=True))
    assert left == {calls["running"].run_id, calls["fresh"].run_id}
    assert not left & set(more)


def test_pmcp_prune_needs_something_to_prune():
    with pytest.raises(CommandError, match="Give --older-than AGE, --expired, or both"):
        prune()
    with pytest.raises(CommandError, match="--status goes with --older-than"):
        prune("--expired", "--status", "completed")


def test_a_run_re_opened_after_it_expired_is_not_pruned(calls):
    """A finished call whose task is re-executed (retry_task) is going on again: it stays,
    however late."""
    expired = calls["expired"]
    Orchestrator().retry_task(task_id=expired.task_id, reason="once more")
    assert prune_expired_tool_calls(using="default").count == 0
    assert Run.objects.get(pk=expired.run_id).status == "active"
    later: datetime = timezone.now() + timedelta(days=1)
    pruned = prune_expired_tool_calls(using="default", now=later).pruned_run_ids
    assert pruned == [calls["fresh"].run_id]  # expired by then; the re-opened one is not
    assert Run.objects.filter(pk=expired.run_id).exists()


def test_the_migration_gives_calls_made_before_it_their_expiry():
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    before = ("parallel_mcp", "0009_write_fewer_index_entries")  # the one before the expiry
    limited = call_made(ago=timedelta(hours=2), ttl_ms=HOUR_MS, finished=True)
    unlimited = call_made(ago=timedelta(hours=2), ttl_ms=None, finished=True)
    executor = MigrationExecutor(connection)
    executor.migrate([before])
    try:
        assert "expires_at" not in {
            column.name
            for column in connection.introspection.get_table_description(
                connection.cursor(), "pmcp_tool_call"
            )
        }
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        # Forward to the newest migration, not just the expiry's: the rest of the session's
        # tests (and the worker processes they start) need every migration applied.
        executor.migrate(executor.loader.graph.leaf_nodes("parallel_mcp"))
    expiry = dict(ToolCall.objects.values_list("pk", "expires_at"))
    assert expiry == {
        limited.run_id: limited.created_at + timedelta(milliseconds=HOUR_MS),
        unlimited.run_id: None,
    }

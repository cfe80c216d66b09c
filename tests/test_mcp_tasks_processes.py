"""The io.modelcontextprotocol/tasks extension end to end: real ``pmcp_mcp`` processes (stdio,
streamable HTTP) and real ``pmcp_worker`` processes, driven by the official SDK client at the
low level (per-request capabilities, tasks/get, tasks/update, tasks/cancel)."""

from __future__ import annotations

import json
import signal
import uuid

import anyio
import httpx2
import pytest
from django.contrib.auth.models import Permission, User
from mcp.shared.exceptions import MCPError

from parallel_mcp.models import Event, ToolCall
from parallel_mcp.services.tokens import create_token
from tests.mcp_support import (
    LiveServer,
    call_for_task,
    cancel_task,
    eventually,
    get_task,
    http_session,
    http_tasks_session,
    in_db,
    listening,
    no_connection_left_open,  # noqa: F401 - autouse
    poll_task,
    settled,
    stdio_tasks_session,
    superuser_token,
    update_task,
    wire,
)
from tests.mcptools.definitions import NAME_REQUEST
from tests.workers import (
    event_counts,
    kill_leftover_processes,  # noqa: F401 - autouse
    marker_lines,
    start_command,
    start_worker,
    wait_until,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SETTINGS = "tests.mcp_tasks_settings"
ENV = {"DJANGO_SETTINGS_MODULE": SETTINGS}


def worker(*args: str):
    return start_worker("--concurrency", "2", *args, env=ENV)


def test_over_stdio_a_task_is_created_followed_answered_and_completed():
    workers = worker()

    async def scenario():
        async with stdio_tasks_session(settings=SETTINGS) as session:
            names = {tool.name for tool in (await session.list_tools()).tools}
            assert {"add", "greet", "squares", "create_run"} <= names

            added = await call_for_task(session, "add", a=40, b=2)
            done = await poll_task(session, added["taskId"], settled)
            assert done["result"]["structuredContent"] == {"sum": 42}

            greeting = await call_for_task(session, "greet")
            asking = await poll_task(
                session, greeting["taskId"], lambda t: t["status"] != "working"
            )
            assert asking["status"] == "input_required"
            assert asking["inputRequests"] == {"name": NAME_REQUEST}
            answer = {"action": "accept", "content": {"name": "Ada"}}
            await update_task(session, greeting["taskId"], {"name": answer})
            done = await poll_task(session, greeting["taskId"], settled)
            assert done["result"]["content"][0]["text"] == "Hello, Ada!"

            sleeping = await call_for_task(session, "slow", seconds=60)
            await poll_task(
                session, sleeping["taskId"], lambda t: t.get("statusMessage") == "half way"
            )
            assert set(await cancel_task(session, sleeping["taskId"])) <= {"resultType", "_meta"}
            cancelled = await poll_task(session, sleeping["taskId"], settled)
            assert cancelled["status"] == "cancelled"
            return sleeping["taskId"]

    cancelled = anyio.run(scenario)
    assert workers.poll() is None, workers.describe()
    assert ToolCall.objects.get(pk=cancelled).run.status == "cancelled"


def test_over_http_tasks_belong_to_the_token_that_created_them_and_any_replica_answers():
    alice, mallory = superuser_token("alice"), superuser_token("mallory")
    replicas = [LiveServer(settings=SETTINGS, wait=False) for _ in range(2)]
    for replica in replicas:
        replica.wait_until_listening()
    first, second = replicas

    async def scenario():
        async with http_tasks_session(first.url, alice) as on_first:
            handle = await call_for_task(on_first, "slow", seconds=0.2)
            task_id = handle["taskId"]
            asking = (await call_for_task(on_first, "greet"))["taskId"]
            sleeping = (await call_for_task(on_first, "slow", seconds=60))["taskId"]
        async with http_tasks_session(second.url, mallory) as intruder:
            for send in (get_task, cancel_task):
                with pytest.raises(MCPError) as missing:
                    await send(intruder, task_id)
                assert missing.value.code == -32602
            with pytest.raises(MCPError) as missing:
                await update_task(intruder, task_id, {"name": {"action": "accept"}})
            assert missing.value.code == -32602
        worker()
        async with http_tasks_session(second.url, alice) as on_second:
            done = await poll_task(on_second, task_id, settled)
            assert done["status"] == "completed"
            assert done["result"]["structuredContent"] == {"slept": True, "attempt": 1}
            # Created on the first replica, answered and cancelled on the second.
            await poll_task(on_second, asking, lambda t: t["status"] == "input_required")
            answer = {"action": "accept", "content": {"name": "Bo"}}
            await update_task(on_second, asking, {"name": answer})
            greeted = await poll_task(on_second, asking, settled)
            assert greeted["result"]["content"][0]["text"] == "Hello, Bo!"
            await cancel_task(on_second, sleeping)
            assert (await poll_task(on_second, sleeping, settled))["status"] == "cancelled"
        # A body nested deeper than the server parses: a JSON-RPC parse error, not a 5xx.
        events = await in_db(lambda: Event.objects.count())
        deep = '{"name": ' + '{"k": ' * 20_000 + "{}" + "}" * 20_000 + "}"
        body = json.dumps(
            {"jsonrpc": "2.0", "id": 9, "method": "tasks/update",
             "params": {"taskId": asking, "inputResponses": "DEEP"}}
        ).replace('"DEEP"', deep)  # fmt: skip
        headers = {
            "Authorization": f"Bearer {alice}",
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "Mcp-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tasks/update",
            "Mcp-Name": asking,
        }
        async with httpx2.AsyncClient(timeout=30) as http:
            response = await http.post(second.url, content=body.encode(), headers=headers)
        assert response.status_code == 400
        assert response.json()["error"]["code"] == -32700
        assert await in_db(lambda: Event.objects.count()) == events
        return task_id

    try:
        task_id = anyio.run(scenario)
    finally:
        for replica in replicas:
            replica.stop()
    call = ToolCall.objects.get(pk=task_id)
    assert call.principal.startswith("token:") and call.run.status == "completed"


def test_over_http_only_operating_tokens_see_and_call_the_declared_tools():
    """Roles as for the orchestrator's tools: a call creates a run, so it needs a ``full``
    token whose user may operate runs; ``read`` and ``worker`` tokens, and a ``full`` token of
    a user without that permission, neither list nor call them, and nothing is created."""
    admin = User.objects.create_superuser("root", password="pw")
    clerk = User.objects.create_user("clerk", password="pw")
    operator = User.objects.create_user("operator", password="pw")
    operator.user_permissions.add(Permission.objects.get(codename="operate_runs"))
    secrets = {
        name: create_token(using="default", user=user, name=name, role=role).secret
        for name, user, role in [
            ("read", admin, "read"), ("worker", admin, "worker"), ("clerk", clerk, "full"),
            ("operator", operator, "full"),
        ]
    }  # fmt: skip
    server = LiveServer(settings=SETTINGS)

    async def scenario():
        for name in ("read", "worker", "clerk"):
            async with http_tasks_session(server.url, secrets[name]) as session:
                assert "add" not in {t.name for t in (await session.list_tools()).tools}
                refused = wire(await session.call_tool("add", {"a": 1}, allow_claimed=True))
                assert refused["isError"] is True and "does not allow add" in str(refused), name
        async with http_tasks_session(server.url, secrets["operator"]) as session:
            assert "add" in {t.name for t in (await session.list_tools()).tools}
            return (await call_for_task(session, "add", a=1))["taskId"]

    try:
        task_id = anyio.run(scenario)
    finally:
        server.stop()
    assert list(ToolCall.objects.values_list("pk", flat=True)) == [uuid.UUID(task_id)]


def test_tools_only_leaves_another_principal_no_way_to_read_or_touch_a_call():
    """Two callers whose users may view and operate runs. Next to the orchestrator's tools,
    the other caller reads the call's arguments (list_run_tasks) and could cancel it (what
    docs/mcp-tasks.md, "Security", says); on a --tools-only server it has no tool, resource
    or task method that reaches it, and nothing it tries changes the call."""
    operate = ("operate_runs", "view_run", "view_task", "view_event", "view_contextsnapshot")
    secrets = {}
    for name in ("alice", "bob"):
        user = User.objects.create_user(name, password="pw")
        user.user_permissions.add(*Permission.objects.filter(codename__in=operate))
        secrets[name] = create_token(using="default", user=user, name=name, role="full").secret
    both = LiveServer(settings=SETTINGS, wait=False)
    alone = LiveServer("--tools-only", settings=SETTINGS, wait=False)
    both.wait_until_listening()
    alone.wait_until_listening()
    secret_input = {"greeting": "the secret greeting"}

    async def scenario():
        async with http_tasks_session(alone.url, secrets["alice"]) as session:
            task_id = (await call_for_task(session, "greet", **secret_input))["taskId"]
        async with http_tasks_session(both.url, secrets["bob"]) as intruder:
            read = wire(await intruder.call_tool("list_run_tasks", {"run_id": task_id}))
            assert "the secret greeting" in json.dumps(read["structuredContent"])
        async with http_tasks_session(alone.url, secrets["bob"]) as intruder:
            listed = {t.name for t in (await intruder.list_tools()).tools}
            assert "greet" in listed and not listed & {"list_runs", "get_run", "cancel_run"}
            for name, arguments in [
                ("list_runs", {"namespace": "mcp.tool"}),
                ("list_run_tasks", {"run_id": task_id}),
                ("get_run", {"run_id": task_id}),
                ("list_run_events", {"run_id": task_id}),
                ("list_events_since", {}),
                ("cancel_run", {"run_id": task_id}),
            ]:
                refused = wire(await intruder.call_tool(name, arguments, allow_claimed=True))
                assert refused["isError"] is True and "no tool named" in str(refused), name
            assert (await intruder.list_resources()).resources == []
            assert (await intruder.list_resource_templates()).resource_templates == []
            with pytest.raises(MCPError):
                await intruder.read_resource(f"pmcp://runs/{task_id}")
            for send in (get_task, cancel_task):
                with pytest.raises(MCPError) as missing:
                    await send(intruder, task_id)
                assert "Task not found" in str(missing.value)
        async with http_tasks_session(alone.url, secrets["alice"]) as session:
            return task_id, await get_task(session, task_id)

    try:
        task_id, seen = anyio.run(scenario)
    finally:
        both.stop()
        alone.stop()
    assert seen["status"] == "working"
    assert ToolCall.objects.get(pk=task_id).run.status != "cancelled"


def test_over_http_a_client_listening_on_another_replica_is_told_of_the_workers_progress():
    """notifications/tasks come from the event log: the task is created on replica A, a
    worker process runs it, and a client listening on replica B (a 2026-07-28 SSE stream) is
    told of each change until it completes."""
    alice = superuser_token("alice")
    replicas = [LiveServer(settings=SETTINGS, wait=False) for _ in range(2)]
    for replica in replicas:
        replica.wait_until_listening()
    first, second = replicas
    pushed: list[dict] = []

    async def on_task(params: dict) -> None:
        pushed.append(params)

    async def scenario():
        async with http_tasks_session(first.url, alice) as on_first:
            # "half way" is the state for `seconds`: several notification polls (500 ms), so
            # one of them sees it before the task completes.
            handle = await call_for_task(on_first, "slow", seconds=2)
        async with http_tasks_session(second.url, alice, on_task=on_task) as on_second:
            async with listening(on_second, [handle["taskId"]]) as stream:
                await eventually(lambda: pushed)
                assert pushed[0]["status"] == "working"
                worker()
                await eventually(lambda: "result" in stream)
        return handle["taskId"]

    try:
        task_id = anyio.run(scenario)
    finally:
        for replica in replicas:
            replica.stop()
    assert {p["taskId"] for p in pushed} == {task_id}
    assert "half way" in [p.get("statusMessage") for p in pushed]  # the worker's progress
    assert pushed[-1]["status"] == "completed"
    assert pushed[-1]["result"]["structuredContent"] == {"slept": True, "attempt": 1}


def test_a_worker_killed_mid_task_loses_nothing_and_the_task_completes_once(tmp_path):
    marker = tmp_path / "marker"
    server = LiveServer("--allow-unauthenticated", settings=SETTINGS)
    first = worker("--lease-ms", "1000")

    async def create():
        async with http_tasks_session(server.url) as session:
            handle = await call_for_task(session, "slow", seconds=3, marker=str(marker))
            return handle["taskId"]

    async def follow(task_id):
        async with http_tasks_session(server.url) as session:
            return await poll_task(session, task_id, settled, timeout=90)

    try:
        task_id = anyio.run(create)
        wait_until(lambda: marker_lines(marker, "started"), alive=[first])
        first.send_signal(signal.SIGKILL)
        first.wait(10)
        start_command("pmcp_expire_leases", "--interval-ms", "200", env=ENV)
        worker()
        done = anyio.run(follow, task_id)
    finally:
        server.stop()
    assert done["status"] == "completed"
    assert done["result"]["structuredContent"] == {"slept": True, "attempt": 2}
    assert len(marker_lines(marker, "started")) == 2
    assert len(marker_lines(marker, "finished")) == 1
    task = ToolCall.objects.get(pk=task_id).task
    assert set(event_counts(task_id, "task.completed").values()) == {1}
    assert Event.objects.filter(task_id=task.pk, event_type="task.lease_expired").count() == 1


def test_a_client_without_the_extension_gets_the_result_over_http():
    server = LiveServer("--allow-unauthenticated", "--tools-only", settings=SETTINGS)
    worker()

    async def scenario():
        async with http_session(server.url) as session:
            names = {tool.name for tool in (await session.list_tools()).tools}
            assert "create_run" not in names and "add" in names
            result = wire(await session.call_tool("squares", {"n": 3}))
            assert result["structuredContent"] == {"total": 5}
            with pytest.raises(MCPError) as refused:
                await session.call_tool("greet", {})
            assert refused.value.code == -32021

    try:
        anyio.run(scenario)
    finally:
        server.stop()

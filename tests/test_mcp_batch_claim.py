"""claim_next_tasks and claim_next_task(start=…) as MCP tools: through the SDK's client session
in process, and through the token checks of the HTTP transport."""

from __future__ import annotations

from types import SimpleNamespace

import anyio
import mcp_types as types
import pytest
from django.contrib.auth.models import Permission, User
from mcp import Client
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser

from parallel_mcp import Orchestrator
from parallel_mcp.mcp.auth import DjangoTokenVerifier
from parallel_mcp.mcp.server import ParallelMcpServer, build_server
from parallel_mcp.models import Event, Lease
from parallel_mcp.services.tokens import create_token
from tests.mcp_support import call, error_of, fail, wire

pytestmark = pytest.mark.django_db(transaction=True)


def session_scenario(scenario):
    async def main():
        async with Client(build_server(), mode="legacy") as client:
            await scenario(client.session)

    anyio.run(main)


def event_types(task_id) -> list[str]:
    return list(
        Event.objects.filter(task_id=task_id).order_by("id").values_list("event_type", flat=True)
    )


def test_a_batch_in_claim_order_each_under_its_own_lease():
    orch = Orchestrator()
    run = orch.create_run(context={"step": 1})
    low = orch.enqueue_task(run_id=run.pk, kind="k", priority=0)
    high = orch.enqueue_task(run_id=run.pk, kind="k", priority=5)
    orch.enqueue_task(run_id=run.pk, kind="other")
    third = orch.enqueue_task(run_id=run.pk, kind="k", priority=0)
    blocked = orch.enqueue_task(run_id=run.pk, kind="k", depends_on=[low.pk])

    async def scenario(s):
        claims = (await call(s, "claim_next_tasks", worker_id="w", limit=10, kinds=["k"]))["claims"]
        assert [c["task"]["id"] for c in claims] == [str(high.pk), str(low.pk), str(third.pk)]
        assert len({c["lease"]["id"] for c in claims}) == 3
        for item in claims:
            assert item["task"]["status"] == "leased" and item["attempt"]["status"] == "leased"
            assert item["lease"]["worker_id"] == "w" and item["lease"]["client_token"] is None
            assert item["task"]["lease_id"] == item["lease"]["id"] == item["attempt"]["id"]
            assert item["run"]["id"] == str(run.pk)
        assert (await call(s, "claim_next_tasks", worker_id="w", limit=10, kinds=["k"])) == {
            "claims": []
        }
        # limit is respected.
        one = (await call(s, "claim_next_tasks", worker_id="w", limit=1))["claims"]
        assert [c["task"]["kind"] for c in one] == ["other"]

    session_scenario(scenario)
    assert orch.get_task(task_id=blocked.pk).status == "queued"
    assert event_types(high.pk) == ["task.enqueued", "task.claimed"]


def test_the_same_client_token_replays_the_whole_batch():
    orch = Orchestrator()
    run = orch.create_run()
    for _ in range(3):
        orch.enqueue_task(run_id=run.pk, kind="k")

    async def scenario(s):
        first = (await call(s, "claim_next_tasks", worker_id="w", limit=2, client_token="b-1"))[
            "claims"
        ]
        assert [c["lease"]["client_token"] for c in first] == ["b-1#0", "b-1#1"]
        again = (await call(s, "claim_next_tasks", worker_id="w", limit=2, client_token="b-1"))[
            "claims"
        ]
        assert [c["lease"]["id"] for c in again] == [c["lease"]["id"] for c in first]
        error = await fail(
            s, "claim_next_tasks", {"worker_id": "intruder", "limit": 2, "client_token": "b-1"}
        )
        assert error["code"] == "idempotency_conflict"
        # A single claim's token replays the same way.
        single = (await call(s, "claim_next_task", worker_id="w", client_token="one"))["claim"]
        replay = (await call(s, "claim_next_task", worker_id="w", client_token="one"))["claim"]
        assert replay["lease"]["id"] == single["lease"]["id"]

    session_scenario(scenario)
    assert Lease.objects.count() == 3
    assert orch.list_pending_tasks(run_id=run.pk) == []


@pytest.mark.parametrize("limit", [0, 101, -1, "x", True, None, 2.5])
def test_a_bad_limit_is_a_validation_error(limit):
    orch = Orchestrator()
    run = orch.create_run()
    orch.enqueue_task(run_id=run.pk, kind="k")

    async def scenario(s):
        error = await fail(s, "claim_next_tasks", {"worker_id": "w", "limit": limit})
        assert error["code"] == "validation_error" and error["details"]["field"] == "limit"
        error = await fail(s, "claim_next_tasks", {"worker_id": "w"})
        assert error["code"] == "validation_error" and "limit" in error["message"]

    session_scenario(scenario)
    assert orch.list_pending_tasks(run_id=run.pk)[0].status == "queued"


@pytest.mark.parametrize("tool", ["claim_next_task", "claim_next_tasks"])
def test_start_must_be_a_boolean(tool):
    async def scenario(s):
        arguments = {"worker_id": "w", "start": "yes"}
        if tool == "claim_next_tasks":
            arguments["limit"] = 1
        error = await fail(s, tool, arguments)
        assert error["code"] == "validation_error" and error["details"]["field"] == "start"

    session_scenario(scenario)


def test_a_batch_token_too_long_for_its_suffix_is_refused():
    async def scenario(s):
        error = await fail(
            s, "claim_next_tasks", {"worker_id": "w", "limit": 2, "client_token": "t" * 198}
        )
        assert error["code"] == "validation_error" and error["details"]["field"] == "client_token"
        assert await call(s, "claim_next_tasks", worker_id="w", limit=2, client_token="t" * 197)

    session_scenario(scenario)


def test_start_claims_straight_into_running():
    orch = Orchestrator()
    run = orch.create_run()
    single = orch.enqueue_task(run_id=run.pk, kind="one")
    batch = [orch.enqueue_task(run_id=run.pk, kind="many") for _ in range(2)]

    async def scenario(s):
        claim = (await call(s, "claim_next_task", worker_id="w", kinds=["one"], start=True))[
            "claim"
        ]
        assert claim["task"]["status"] == "running" and claim["attempt"]["status"] == "running"
        assert claim["task"]["started_at"] and claim["attempt"]["started_at"]
        claims = (
            await call(s, "claim_next_tasks", worker_id="w", limit=5, kinds=["many"], start=True)
        )["claims"]
        assert [c["task"]["status"] for c in claims] == ["running", "running"]
        assert {c["attempt"]["status"] for c in claims} == {"running"}
        # Already running: mark_task_running has nothing left to do, the outcome works.
        refs = {"task_id": claim["task"]["id"], "lease_id": claim["lease"]["id"], "worker_id": "w"}
        assert (await call(s, "complete_task", **refs))["task"]["status"] == "completed"

    session_scenario(scenario)
    for task in (single, *batch):
        assert event_types(task.pk)[:3] == ["task.enqueued", "task.claimed", "task.running"]
    assert orch.get_task(task_id=batch[0].pk).status == "running"


# -- tokens (the HTTP transport's checks, without the transport) ------------------------------


def ctx_for(secret: str) -> SimpleNamespace:
    access = DjangoTokenVerifier().verify_sync(secret)
    assert access is not None
    return SimpleNamespace(request=SimpleNamespace(scope={"user": AuthenticatedUser(access)}))


def user_with(*codenames: str, superuser: bool = False) -> User:
    if superuser:
        return User.objects.create_superuser("root", password="pw")
    user = User.objects.create_user("u-" + "-".join(codenames or ("none",)), password="pw")
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    return User.objects.get(pk=user.pk)


def call_as(secret: str, tool: str, arguments: dict) -> types.CallToolResult:
    server = ParallelMcpServer(orchestrator=Orchestrator(), auth_required=True)
    params = types.CallToolRequestParams(name=tool, arguments=arguments)
    return anyio.run(server.call_tool, ctx_for(secret), params)


@pytest.mark.parametrize("tool", ["claim_next_task", "claim_next_tasks"])
def test_read_tokens_and_users_without_work_tasks_cannot_claim(tool):
    orch = Orchestrator()
    run = orch.create_run()
    orch.enqueue_task(run_id=run.pk, kind="k")
    arguments = {"worker_id": "w", "limit": 1} if tool == "claim_next_tasks" else {"worker_id": "w"}
    root = user_with(superuser=True)
    clerk = user_with("view_task", "operate_runs")
    refused = [
        create_token(using="default", user=root, name="read", role="read").secret,
        create_token(using="default", user=clerk, name="full", role="full").secret,
        create_token(using="default", user=clerk, name="worker", role="worker").secret,
    ]
    for secret in refused:
        result = call_as(secret, tool, arguments)
        assert error_of(tool, wire(result))["code"] == "forbidden"
    assert orch.list_pending_tasks(run_id=run.pk)[0].status == "queued"

    worker = user_with("work_tasks")
    secret = create_token(using="default", user=worker, name="worker", role="worker").secret
    result = call_as(secret, tool, arguments)
    assert not result.is_error, result.structured_content
    assert orch.list_pending_tasks(run_id=run.pk) == []

"""The MCP server over streamable HTTP: a live ``pmcp_mcp --transport http`` subprocess, bearer
tokens, roles and permissions, driven by the SDK's client session."""

from __future__ import annotations

from datetime import timedelta

import anyio
import httpx2
import pytest
from django.contrib.auth.models import Permission, User
from mcp.shared.exceptions import MCPError

from parallel_mcp.mcp.tools import tool_specs, tools_in
from parallel_mcp.services.tokens import create_token, revoke_token
from tests.conftest import at
from tests.mcp_support import INITIALIZE, LiveServer, call, fail, full_run, http_session, tool_names

pytestmark = pytest.mark.django_db(transaction=True)

READ = {spec.name for spec in tools_in(("read",))}
WORKER = {spec.name for spec in tools_in(("worker",))}
ACCEPT = {"Accept": "application/json, text/event-stream"}


@pytest.fixture(scope="module")
def live(django_db_setup, django_db_blocker):
    server = LiveServer()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def open_live(django_db_setup, django_db_blocker):
    server = LiveServer("--allow-unauthenticated", "--read-only")
    yield server
    server.stop()


def token(role: str = "full", *, user: User | None = None, **kwargs) -> str:
    if user is None:
        user = User.objects.filter(username="admin").first() or User.objects.create_superuser(
            "admin", password="pw"
        )
    return create_token(
        using="default", user=user, name=f"{role} token", role=role, **kwargs
    ).secret


def post(url: str, secret: str | None = None, *, header: str | None = None, **extra):
    headers = dict(ACCEPT)
    if header is not None:
        headers["Authorization"] = header
    elif secret is not None:
        headers["Authorization"] = f"Bearer {secret}"
    headers.update(extra)
    return httpx2.post(url, json=INITIALIZE, headers=headers, timeout=30)


def test_a_full_run_with_one_token_per_role(live):
    planner, worker, reader = token("full"), token("worker"), token("read")

    async def scenario():
        async with (
            http_session(live.url, planner) as p,
            http_session(live.url, worker) as w,
            http_session(live.url, reader) as r,
        ):
            tools = {tool.name: tool for tool in (await p.list_tools()).tools}
            assert set(tools) == set(tool_specs())
            assert set(tools["enqueue_task"].input_schema["required"]) == {"run_id", "kind"}
            await full_run(p, w, r)

    anyio.run(scenario)


def test_each_role_lists_and_may_call_only_its_tools(live):
    reader, worker = token("read"), token("worker")

    async def scenario():
        async with http_session(live.url, reader) as r:
            assert await tool_names(r) == READ
            for tool in ("create_run", "claim_next_task", "cancel_run"):
                error = await fail(r, tool, {})
                assert error["code"] == "forbidden" and error["details"] == {"tool": tool}
            assert await call(r, "list_runs") == {"runs": []}
        async with http_session(live.url, worker) as w:
            # The worker protocol, and the reads a worker's handlers make.
            assert await tool_names(w) == WORKER | READ
            for tool in ("create_run", "cancel_run", "enqueue_task"):
                assert (await fail(w, tool, {}))["code"] == "forbidden"
            assert await call(w, "claim_next_task", worker_id="remote") == {"claim": None}
            assert await call(w, "list_runs") == {"runs": []}
            with pytest.raises(MCPError):
                await w.read_resource("pmcp://runs/00000000-0000-4000-8000-000000000000")

    anyio.run(scenario)


def test_a_full_token_gets_only_what_its_users_permissions_allow(live):
    viewer = User.objects.create_user("viewer", password="pw")
    viewer.user_permissions.add(
        Permission.objects.get(codename="view_run"),
        Permission.objects.get(codename="work_tasks"),
    )
    nobody = User.objects.create_user("nobody", password="pw")
    viewer_token, nobody_token = token("full", user=viewer), token("full", user=nobody)
    worker_without_permission = token("worker", user=nobody)

    async def scenario():
        async with http_session(live.url, viewer_token) as s:
            assert await tool_names(s) == {"get_run", "list_runs"} | WORKER
            assert (await fail(s, "create_run", {}))["code"] == "forbidden"
            assert (await fail(s, "list_run_tasks", {"run_id": "x"}))["code"] == "forbidden"
        for secret in (nobody_token, worker_without_permission):
            async with http_session(live.url, secret) as s:
                assert await tool_names(s) == set()
                assert (await fail(s, "claim_next_task", {"worker_id": "w"}))["code"] == (
                    "forbidden"
                )

    anyio.run(scenario)


def test_requests_without_a_valid_token_get_401(live):
    alice = User.objects.create_user("alice", password="pw")
    good = token("full", user=alice)
    revoked = create_token(using="default", user=alice, name="old")
    revoke_token(using="default", prefix=revoked.token.prefix)
    expired = token("full", user=alice, expires_in=timedelta(seconds=1), now=at(0))
    inactive_user = User.objects.create_user("gone", password="pw", is_active=False)
    inactive = token("full", user=inactive_user)
    prefix = good.split("_")[1]
    refused = {
        "no header": post(live.url),
        "bearer without token": post(live.url, header="Bearer"),
        "basic auth": post(live.url, header="Basic YWxpY2U6cHc="),
        "garbage": post(live.url, "not-a-token"),
        "wrong secret": post(live.url, f"pmcp_{prefix}_{'x' * 43}"),
        "revoked": post(live.url, revoked.secret),
        "expired": post(live.url, expired),
        "inactive user": post(live.url, inactive),
    }
    for case, response in refused.items():
        assert response.status_code == 401, case
        assert response.headers["www-authenticate"].startswith("Bearer "), case
        assert response.json()["error"] == "invalid_token", case
    accepted = post(live.url, good)
    assert accepted.status_code == 200, accepted.text
    assert "mcp-session-id" in accepted.headers

    # A session belongs to the token that opened it.
    session = {"mcp-session-id": accepted.headers["mcp-session-id"]}
    other = post(live.url, token("full", user=alice), **session)
    assert other.status_code == 404

    # A token revoked while its session is open is refused from the next request on.
    revoke_token(using="default", prefix=prefix)
    assert post(live.url, good, **session).status_code == 401

    async def scenario():
        with pytest.raises(Exception):  # noqa: B017 - the SDK's error type for 401 varies
            async with http_session(live.url, "pmcp_nope_nope") as s:
                await s.list_tools()

    anyio.run(scenario)


def test_error_paths_come_back_as_tool_errors_over_http(live):
    secret = token("full")

    async def scenario():
        async with http_session(live.url, secret) as s:
            error = await fail(s, "cancel_run", {"run_id": "00000000-0000-4000-8000-000000000000"})
            assert error["code"] == "not_found"
            error = await fail(s, "get_task", {"task_id": "nope"})
            assert error["code"] == "validation_error" and error["details"]["field"] == "task_id"
            run = (await call(s, "create_run"))["run"]
            task = (await call(s, "enqueue_task", run_id=run["id"], kind="k"))["task"]
            claim = (await call(s, "claim_next_task", worker_id="w1"))["claim"]
            error = await fail(
                s,
                "complete_task",
                {"task_id": task["id"], "lease_id": claim["lease"]["id"], "worker_id": "w2"},
            )
            assert error["code"] == "lease_conflict"
            assert (await fail(s, "resume_task", {"task_id": task["id"]}))["code"] == (
                "invalid_transition"
            )
            assert (await fail(s, "list_runs", {"limit": "ten"}))["code"] == "validation_error"
            assert await tool_names(s) == set(tool_specs())

    anyio.run(scenario)


def test_unauthenticated_read_only_server_on_loopback(open_live):
    async def scenario():
        async with http_session(open_live.url) as s:
            assert await tool_names(s) == READ
            error = await fail(s, "create_run", {})
            assert error["code"] == "forbidden" and "read-only" in error["message"]
            assert await call(s, "list_runs") == {"runs": []}

    anyio.run(scenario)

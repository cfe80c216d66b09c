"""Durable MCP tasks survive the server and the workers dying (issue 16): a task created on
one ``pmcp_mcp`` process is followed on another after the first was SIGKILLed, while the two
workers (one of them running it) are SIGKILLed mid-task; two new workers take over and the
task completes exactly once."""

from __future__ import annotations

import signal

import anyio
import pytest

from parallel_mcp.models import Event, ToolCall
from tests.mcp_support import (
    LiveServer,
    call_for_task,
    get_task,
    http_tasks_session,
    no_connection_left_open,  # noqa: F401 - autouse
    poll_task,
    settled,
)
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


def test_the_server_and_the_worker_killed_mid_task_lose_nothing(tmp_path):
    marker = tmp_path / "marker"
    first_server = LiveServer("--allow-unauthenticated", settings=SETTINGS)
    first_workers = [
        start_worker("--concurrency", "2", "--lease-ms", "1000", env=ENV) for _ in range(2)
    ]

    async def create(url):
        async with http_tasks_session(url) as session:
            handle = await call_for_task(session, "slow", seconds=3, marker=str(marker))
            polled = await get_task(session, handle["taskId"])
            assert polled["status"] == "working"
            return handle["taskId"]

    async def follow(url, task_id):
        async with http_tasks_session(url) as session:
            return await poll_task(session, task_id, settled, timeout=90)

    second_server = None
    try:
        task_id = anyio.run(create, first_server.url)
        wait_until(lambda: marker_lines(marker, "started"), alive=first_workers)
        # All die at once, between two polls: nothing of the task lived in any of them.
        first_server.process.send_signal(signal.SIGKILL)
        for process in first_workers:
            process.send_signal(signal.SIGKILL)
        first_server.process.wait(10)
        for process in first_workers:
            process.wait(10)
        second_server = LiveServer("--allow-unauthenticated", settings=SETTINGS)
        start_command("pmcp_expire_leases", "--interval-ms", "200", env=ENV)
        for _ in range(2):
            start_worker("--concurrency", "2", env=ENV)
        done = anyio.run(follow, second_server.url, task_id)
    finally:
        first_server.stop()
        if second_server is not None:
            second_server.stop()
    assert done["status"] == "completed"
    assert done["result"]["structuredContent"] == {"slept": True, "attempt": 2}
    assert len(marker_lines(marker, "started")) == 2
    assert len(marker_lines(marker, "finished")) == 1
    task = ToolCall.objects.get(pk=task_id).task
    assert set(event_counts(task_id, "task.completed").values()) == {1}
    assert Event.objects.filter(task_id=task.pk, event_type="task.lease_expired").count() == 1

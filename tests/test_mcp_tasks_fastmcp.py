"""A client nobody here wrote: the ``fastmcp`` 4.x ``Client`` with ``fastmcp-tasks`` (its tasks
client extension, registered on every Client once the package is imported) against a real
``pmcp_mcp --transport http`` and a real ``pmcp_worker``. The client half of fastmcp-tasks needs
no Redis (only its server half runs on docket)."""

from __future__ import annotations

import anyio
import pytest
from fastmcp import Client
from fastmcp.exceptions import ToolError
from fastmcp_tasks import ToolTask, call_tool_task

from parallel_mcp.models import InputRequest, ToolCall
from tests.mcp_support import (
    LiveServer,
    no_connection_left_open,  # noqa: F401 - autouse
    superuser_token,
)
from tests.workers import (
    kill_leftover_processes,  # noqa: F401 - autouse
    start_worker,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SETTINGS = "tests.mcp_tasks_settings"
ENV = {"DJANGO_SETTINGS_MODULE": SETTINGS}


def test_fastmcp_follows_answers_and_cancels_tasks_over_streamable_http():
    token = superuser_token("alice")
    server = LiveServer(settings=SETTINGS)  # tokens required, as over HTTP by default
    start_worker("--concurrency", "4", env=ENV)
    asked: list[str] = []

    async def answer(message, response_type, params, context):
        asked.append(message)
        return {"name": "Ada"}

    async def scenario():
        # The form docs/mcp-tasks.md shows: the token as ``auth=`` (sent as a bearer token).
        async with Client(server.url, auth=token, elicitation_handler=answer) as client:
            names = {tool.name for tool in await client.list_tools()}
            assert {"add", "greet", "slow"} <= names

            # The handle: status, wait, result.
            task = await call_tool_task(client, "add", {"a": 2, "b": 3})
            assert isinstance(task, ToolTask)
            assert (await task.status()).status in ("working", "completed")
            finished = await task.wait(timeout=60)
            assert finished.status == "completed"
            result = await task.result()
            assert result.structured_content == {"sum": 5} and not result.is_error

            # A transparent call of a tool that asks: answered by the elicitation handler.
            greeted = await client.call_tool("greet", {"greeting": "Hi"})
            assert greeted.content[0].text == "Hi, Ada!"
            assert asked == ["Please enter your name."]

            # Arguments that break the schema: a tool error, not a task (nothing is created);
            # fastmcp-tasks reports it as a call that "did not run as a task" (docs/mcp-tasks.md).
            with pytest.raises(ToolError, match="did not run as a task"):
                await call_tool_task(client, "add", {"a": "not a number"})
            refused = await client.call_tool("add", {"a": "not a number"}, raise_on_error=False)
            assert refused.is_error and "validation_error" in refused.content[0].text

            # Cancel: the run is cancelled, the handle says so, result() raises.
            slow = await call_tool_task(client, "slow", {"seconds": 30})
            working = await slow.wait(state="working", timeout=60)
            assert working.task_id == slow.task_id
            await slow.cancel()
            assert (await slow.wait(timeout=60)).status == "cancelled"
            with pytest.raises(ToolError, match="cancelled"):
                await slow.result()
            return slow.task_id

    try:
        cancelled = anyio.run(scenario)
    finally:
        server.stop()
    assert ToolCall.objects.get(pk=cancelled).run.status == "cancelled"
    assert ToolCall.objects.count() == 3  # add, greet, slow: the refused calls created nothing
    answered = InputRequest.objects.get(key="name")
    assert answered.response == {"action": "accept", "content": {"name": "Ada"}}

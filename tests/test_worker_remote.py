"""A worker with no database access runs a fan-out run end to end through the HTTP API
(``pmcp_worker --api URL --token TOKEN``), against a live server."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.contrib.auth.models import Permission, User

from parallel_mcp import Orchestrator
from parallel_mcp.models import Attempt, Event
from parallel_mcp.services.tokens import create_token
from tests.subprocesses import REPO

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _worker_token(role: str = "worker") -> str:
    user = User.objects.create_user("remote-worker")
    user.user_permissions.add(Permission.objects.get(codename="work_tasks"))
    return create_token(using="default", user=user, name="remote", role=role).secret


def _run_remote_worker(url: str, token: str, *extra: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "tests.remote_worker_settings"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PMCP_API_TOKEN"] = token
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "django",
            "pmcp_worker",
            "--api",
            f"{url}/api/pmcp/",
            "--burst",
            "--concurrency",
            "3",
            "--lease-ms",
            "5000",
            *extra,
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_remote_worker_completes_a_fan_out_run(live_server):
    orch = Orchestrator()
    run = orch.create_run(context={"step": 0})
    parse = orch.enqueue_task(run_id=run.id, kind="test.context", key="parse")
    fetches = [
        orch.enqueue_task(
            run_id=run.id, kind="test.echo", key=f"fetch-{n}", input={"n": n}, depends_on=[parse.id]
        )
        for n in range(5)
    ]
    orch.enqueue_task(
        run_id=run.id, kind="test.echo", key="aggregate", depends_on=[task.id for task in fetches]
    )
    flaky = orch.enqueue_task(
        run_id=run.id, kind="test.flaky", key="flaky", max_attempts=3, input={"succeed_on": 2}
    )

    result = _run_remote_worker(live_server.url, _worker_token())

    assert result.returncode == 0, result.stderr
    run.refresh_from_db()
    assert run.status == "completed", result.stderr
    tasks = {task.key: task for task in orch.list_run_tasks(run_id=run.id)}
    assert tasks["parse"].output == {"seen": {"step": 0}}  # ctx.context came with the claim
    assert tasks["fetch-3"].output["echo"] == {"n": 3}
    assert orch.get_current_context_snapshot(run_id=run.id).payload == {"step": 1}
    assert orch.get_task(task_id=flaky.id).attempt_count == 2
    completed = Event.objects.filter(run_id=run.id, event_type="task.completed")
    assert completed.count() == 8  # every task exactly once
    assert Attempt.objects.filter(task_id=flaky.id, status="failed").count() == 1
    assert "ConnectionError: transient" in result.stderr  # the traceback went to the log


def test_remote_worker_with_a_bad_token_fails_without_touching_tasks(live_server):
    orch = Orchestrator()
    run = orch.create_run()
    task = orch.enqueue_task(run_id=run.id, kind="test.echo")

    result = _run_remote_worker(live_server.url, "pmcp_nope_nope")

    assert result.returncode != 0
    assert orch.get_task(task_id=task.id).status == "queued"
    assert "pmcp_nope_nope" not in result.stderr  # the token never reaches the logs


def test_remote_worker_sees_cancellation_through_the_heartbeat(live_server):
    orch = Orchestrator()
    run = orch.create_run()
    task = orch.enqueue_task(run_id=run.id, kind="test.sleep", input={"seconds": 30})
    token = _worker_token()
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = "tests.remote_worker_settings"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PMCP_API_TOKEN"] = token
    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "django",
            "pmcp_worker",
            "--api",
            f"{live_server.url}/api/pmcp/",
            "--burst",
            "--lease-ms",
            "1500",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        import time

        deadline = time.monotonic() + 30
        while orch.get_task(task_id=task.id).status != "running":
            assert time.monotonic() < deadline, "the remote worker never started the task"
            time.sleep(0.05)
        orch.cancel_run(run_id=run.id, reason="stop")
        _out, err = worker.communicate(timeout=30)
    finally:
        if worker.poll() is None:
            worker.kill()
    assert worker.returncode == 0, err
    assert "lost 1" in err  # the summary: the heartbeat told it the lease was gone
    assert orch.get_task(task_id=task.id).status == "cancelled"

"""A worker with no database access runs a fan-out run end to end through the HTTP API
(``pmcp_worker --api URL --token TOKEN``), against a live server."""

from __future__ import annotations

import subprocess
import time

import pytest
from django.contrib.auth.models import User

from parallel_mcp import Orchestrator, exceptions
from parallel_mcp.exceptions import PermissionDeniedError
from parallel_mcp.models import Attempt, Event
from parallel_mcp.selectors import outstanding_input_requests
from parallel_mcp.services.tokens import create_token
from parallel_mcp.services.tool_calls import answer_input, start_tool_call
from parallel_mcp.worker.remote import RemoteClaim
from tests.api_helpers import OPERATOR_PERMS, WORKER_PERMS, make_user, token_for
from tests.mcptools.definitions import NAME_REQUEST, approval_request
from tests.remote_support import (
    UNREACHABLE,
    reading_worker_token,
    remote_for,
    remote_worker_env,
    run_remote_worker,
    worker_command,
    worker_token,
)
from tests.subprocesses import REPO

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def _api(live_server) -> str:
    return f"{live_server.url}/api/pmcp/"


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
        run_id=run.id,
        kind="test.aggregate",  # reads through ctx.orchestrator: get_task, list_run_tasks
        key="aggregate",
        depends_on=[task.id for task in fetches],
    )
    flaky = orch.enqueue_task(
        run_id=run.id, kind="test.flaky", key="flaky", max_attempts=3, input={"succeed_on": 2}
    )

    result = run_remote_worker(_api(live_server), reading_worker_token())

    assert result.returncode == 0, result.stderr
    run.refresh_from_db()
    assert run.status == "completed", result.stderr
    tasks = {task.key: task for task in orch.list_run_tasks(run_id=run.id)}
    assert tasks["parse"].output == {"seen": {"step": 0}}  # ctx.context came with the claim
    assert tasks["fetch-3"].output["echo"] == {"n": 3}
    aggregate = tasks["aggregate"].output
    assert aggregate["echoed"] == [{"n": n} for n in range(5)]
    assert {"parse", "fetch-0", "fetch-4"} <= set(aggregate["completed_keys"])
    assert aggregate["unknown"] is None
    assert orch.get_current_context_snapshot(run_id=run.id).payload == {"step": 1}
    assert orch.get_task(task_id=flaky.id).attempt_count == 2
    completed = Event.objects.filter(run_id=run.id, event_type="task.completed")
    assert completed.count() == 8  # every task exactly once
    assert Attempt.objects.filter(task_id=flaky.id, status="failed").count() == 1
    assert "ConnectionError: transient" in result.stderr  # the traceback went to the log


def test_a_handler_whose_user_may_not_read_fails_clearly(live_server):
    """A worker whose user holds only ``work_tasks``: a handler's read is refused with the
    reason, and the task fails with it (no AttributeError, no traceback as the error)."""
    orch = Orchestrator()
    run = orch.create_run()
    task = orch.enqueue_task(run_id=run.id, kind="test.aggregate")

    result = run_remote_worker(_api(live_server), worker_token())

    assert result.returncode == 0, result.stderr
    failed = orch.get_task(task_id=task.id)
    assert failed.status == "failed"
    assert failed.error.startswith(
        "PermissionDeniedError: This needs the permission parallel_mcp.view_task"
    ), failed.error


def test_the_demo_fan_in_runs_on_a_remote_worker(live_server, monkeypatch):
    """example_project's handlers under ``pmcp_worker --api``: parse passes the plan on as
    context, the fetches report progress, aggregate reads the fetches with
    ctx.orchestrator.get_task."""
    monkeypatch.syspath_prepend(str(REPO / "example_project"))
    from demo.seed import seed_demo_run

    orch = Orchestrator()
    run = seed_demo_run(orch, fetches=3)

    result = run_remote_worker(
        _api(live_server),
        reading_worker_token(),
        "--kinds",
        "demo.parse,demo.fetch,demo.aggregate",
        settings="tests.remote_demo_settings",
    )

    assert result.returncode == 0, result.stderr
    tasks = {task.key: task for task in orch.list_run_tasks(run_id=run.id)}
    fetched = [tasks[f"fetch-page-0{n}"] for n in (1, 2, 3)]
    assert [(t.status, t.progress) for t in fetched] == [("completed", 1.0)] * 3, [
        (t.status, t.progress, t.error, t.attempt_count) for t in fetched
    ]
    aggregate = tasks["aggregate"]
    assert aggregate.status == "completed", aggregate.error
    assert aggregate.output["items"] == 3
    assert aggregate.output["words"] == sum(task.output["words"] for task in fetched)
    summary = orch.get_current_context_snapshot(run_id=run.id).payload["summary"]
    assert summary == aggregate.output
    # the demo's other kinds were not asked for
    assert tasks["flaky"].status == tasks["approve"].status == "queued"


def test_a_remote_worker_retries_an_unreachable_api_then_gives_up():
    """Connection errors are transient: the claim is retried (logged), and a burst worker
    that never gets through exits 1 without a traceback of the token."""
    result = run_remote_worker(UNREACHABLE, "pmcp_secret_token", "--worker-id", "lonely")

    assert result.returncode == 1, result.stderr
    assert "API hiccup during" in result.stderr and "retry 1 of" in result.stderr
    assert "API unreachable: ConnectError" in result.stderr
    assert "pmcp_secret_token" not in result.stderr


def test_remote_worker_with_a_bad_token_fails_without_touching_tasks(live_server):
    orch = Orchestrator()
    run = orch.create_run()
    task = orch.enqueue_task(run_id=run.id, kind="test.echo")

    result = run_remote_worker(_api(live_server), "pmcp_nope_nope")

    assert result.returncode != 0
    assert orch.get_task(task_id=task.id).status == "queued"
    assert "pmcp_nope_nope" not in result.stderr  # the token never reaches the logs


@pytest.mark.parametrize("burst", [False, True])
def test_a_remote_worker_whose_token_is_refused_stops_with_one_line(live_server, burst):
    """A refused token is not retried: every try would count toward the API's per-address
    limit, which then locks out every client behind the same address. A long-running worker
    stops too, with one error line and no traceback."""
    orch = Orchestrator()
    task = orch.enqueue_task(run_id=orch.create_run().id, kind="test.echo")

    result = subprocess.run(
        worker_command(_api(live_server), *(["--burst"] if burst else [])),
        cwd=REPO,
        env=remote_worker_env("pmcp_000000000000_nope"),
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 1, result.stderr
    refused = [line for line in result.stderr.splitlines() if "refused this worker" in line]
    assert len(refused) == 1 and "HTTP 401" in refused[0], result.stderr
    assert "Traceback" not in result.stderr
    assert "pmcp_000000000000_nope" not in result.stderr
    assert orch.get_task(task_id=task.id).status == "queued"


def test_remote_worker_sees_cancellation_through_the_heartbeat(live_server):
    orch = Orchestrator()
    run = orch.create_run()
    task = orch.enqueue_task(run_id=run.id, kind="test.sleep", input={"seconds": 30})
    worker = subprocess.Popen(
        worker_command(_api(live_server), "--burst", "--lease-ms", "1500"),
        cwd=REPO,
        env=remote_worker_env(worker_token()),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
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


# -- RemoteOrchestrator in process: start and batch claims ------------------------------------


def _event_types(task_id) -> list[str]:
    return list(
        Event.objects.filter(task_id=task_id).order_by("id").values_list("event_type", flat=True)
    )


def test_remote_batch_claims_with_start_and_replay(live_server):
    orch = Orchestrator()
    run = orch.create_run(context={"step": 3})
    low = orch.enqueue_task(run_id=run.id, kind="k", input={"n": 1})
    high = orch.enqueue_task(run_id=run.id, kind="k", priority=2)
    orch.enqueue_task(run_id=run.id, kind="k")
    remote = remote_for(live_server, worker_token())
    try:
        claims = remote.claim_next_tasks(
            worker_id="rw", limit=2, kinds=["k"], lease_ms=60_000, start=True, client_token="b"
        )
        assert [claim.task.pk for claim in claims] == [high.id, low.id]
        for claim in claims:
            assert isinstance(claim, RemoteClaim) and claim.context == {"step": 3}
            assert claim.task.status == "running" and claim.attempt.status == "running"
            assert claim.lease.client_token.startswith("b#") and claim.run.pk == run.id
        assert claims[1].task.input == {"n": 1}
        assert _event_types(high.id) == ["task.enqueued", "task.claimed", "task.running"]
        again = remote.claim_next_tasks(worker_id="rw", limit=2, client_token="b", start=True)
        assert [claim.lease.pk for claim in again] == [claim.lease.pk for claim in claims]
        with pytest.raises(exceptions.IdempotencyConflictError):
            remote.claim_next_tasks(worker_id="other", limit=2, client_token="b")
        for bad in (0, 101, "x", True):
            with pytest.raises(exceptions.ValidationError) as refused:
                remote.claim_next_tasks(worker_id="rw", limit=bad)
            assert "limit" in refused.value.details["fields"]
        last = remote.claim_next_tasks(worker_id="rw", limit=5)
        assert len(last) == 1 and last[0].task.status == "leased"
        assert remote.claim_next_tasks(worker_id="rw", limit=5) == []
        done = remote.complete_task(
            task_id=claims[0].task.pk, lease_id=claims[0].lease.pk, worker_id="rw"
        )
        assert done.status == "completed"
    finally:
        remote.close()


def test_remote_single_claim_with_start(live_server):
    orch = Orchestrator()
    run = orch.create_run()
    task = orch.enqueue_task(run_id=run.id, kind="k")
    remote = remote_for(live_server, worker_token())
    try:
        claim = remote.claim_next_task(worker_id="rw", start=True)
        assert claim.task.pk == task.id and claim.task.status == "running"
        assert claim.attempt.status == "running" and claim.context is None
        assert _event_types(task.id) == ["task.enqueued", "task.claimed", "task.running"]
        assert remote.claim_next_task(worker_id="rw", start=True) is None
    finally:
        remote.close()


def test_remote_start_against_a_server_that_ignores_it(live_server, monkeypatch):
    """Worker bodies ignore unknown fields: an older server leaves the claim leased, and the
    client starts it itself."""
    from parallel_mcp.api.serializers import inputs

    class OldClaimIn(inputs.ClaimIn):
        start = None  # the field of a newer client, unknown here

    monkeypatch.setattr(inputs, "ClaimIn", OldClaimIn)
    orch = Orchestrator()
    run = orch.create_run()
    task = orch.enqueue_task(run_id=run.id, kind="k")
    remote = remote_for(live_server, worker_token())
    try:
        claim = remote.claim_next_task(worker_id="rw", start=True)
        assert claim.task.status == "running" and claim.attempt.status == "running"
        assert claim.attempt.started_at == claim.task.started_at is not None
    finally:
        remote.close()
    assert _event_types(task.id) == ["task.enqueued", "task.claimed", "task.running"]
    assert orch.get_task(task_id=task.id).status == "running"


def test_remote_claims_need_a_worker_token(live_server):
    orch = Orchestrator()
    run = orch.create_run()
    orch.enqueue_task(run_id=run.id, kind="k")
    for role in ("read", "worker"):
        user = User.objects.create_user(f"no-work-{role}")
        if role == "read":  # every permission, but a read token
            user.is_superuser = True
            user.save()
        token = create_token(using="default", user=user, name=role, role=role).secret
        remote = remote_for(live_server, token)
        try:
            for method, extra in (("claim_next_tasks", {"limit": 1}), ("claim_next_task", {})):
                # The API's 403 is the orchestrator's own PermissionDeniedError.
                with pytest.raises(PermissionDeniedError) as refused:
                    getattr(remote, method)(worker_id="rw", **extra)
                assert refused.value.code == "permission_denied"
        finally:
            remote.close()
    assert orch.list_pending_tasks(run_id=run.id)[0].status == "queued"


def test_a_remote_worker_asks_the_mcp_client_and_reads_its_answers(live_server):
    """MCP tools under ``pmcp_worker --api``: the tool and a fan-out child pause with
    input_requests through the API, and read the client's answers (ctx.input_responses)
    through the orchestrator's get_task, with no database of their own."""
    orch = Orchestrator()

    def call(tool: str, arguments: dict):
        return start_tool_call(
            using="default",
            tool=tool,
            kind=f"mcp.tool.{tool}",
            input=arguments,
            principal="local",
            ttl_ms=None,
        )

    greet = call("greet", {"greeting": "Hi"})
    approve = call("approve_each", {"items": ["a", "b"]})

    # The fan-out enqueues into the tool's run: a full token whose user also operates runs
    # (docs/workers.md).
    token = token_for(make_user("fanning-worker", [*WORKER_PERMS, *OPERATOR_PERMS]))

    def work() -> None:
        result = run_remote_worker(
            _api(live_server), token, settings="tests.remote_mcp_tasks_settings"
        )
        assert result.returncode == 0, result.stderr

    work()
    assert outstanding_input_requests(using="default", run_id=greet.run_id) == {
        "name": NAME_REQUEST
    }
    assert outstanding_input_requests(using="default", run_id=approve.run_id) == {
        "approve:a": approval_request("a"),
        "approve:b": approval_request("b"),
    }
    answer_input(
        using="default",
        run_id=greet.run_id,
        responses={"name": {"action": "accept", "content": {"name": "Ada"}}},
    )
    answer_input(
        using="default",
        run_id=approve.run_id,
        responses={"approve:a": {"action": "decline"}, "approve:b": {"action": "accept"}},
    )
    work()
    done = orch.get_task(task_id=greet.task_id)
    assert (done.status, done.output) == ("completed", "Hi, Ada!"), done.error
    done = orch.get_task(task_id=approve.task_id)
    assert (done.status, done.output) == ("completed", {"approved": ["b"]}), done.error

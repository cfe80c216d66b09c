"""The ``statusMessage`` of a working tool call: a call that cannot get on says why (stalled
on a failed or cancelled task, or no running worker for a kind), in a bounded number of
queries; otherwise the tool's progress, else "n of m tasks completed"."""

from __future__ import annotations

import uuid

import pytest

from parallel_mcp import Orchestrator
from parallel_mcp.mcp.task_state import task_object
from parallel_mcp.mcp.task_tools import read_state
from parallel_mcp.services.tool_calls import start_tool_call
from parallel_mcp.services.workers import record_worker_presence

pytestmark = pytest.mark.django_db

KIND = "mcp.tool.fan"
CHILD = "test.child"


@pytest.fixture
def orch() -> Orchestrator:
    return Orchestrator()


def serve(*kinds: str) -> None:
    """A running worker process handling ``kinds`` (its presence row)."""
    record_worker_presence(
        using="default",
        process_id=uuid.uuid4(),
        worker_id="w",
        hostname="host",
        kinds=list(kinds),
        interval_ms=60_000,
    )


def call(orch: Orchestrator):
    return start_tool_call(
        using="default", tool="fan", kind=KIND, input={}, principal="local", ttl_ms=None
    )


def seen(run_id) -> dict:
    state = read_state("default", run_id, "local")
    assert state is not None
    return task_object(state)


def fan_out(orch: Orchestrator, run_id, n: int = 2) -> list:
    """The tool's task claimed, its children enqueued, and it paused blocked on them."""
    claim = orch.claim_next_task(worker_id="w", kinds=[KIND])
    children = orch.enqueue_tasks(run_id=run_id, tasks=[{"kind": CHILD} for _ in range(n)])
    orch.pause_task(
        task_id=claim.task.id,
        lease_id=claim.lease.id,
        worker_id="w",
        status="blocked",
        blocked_by=[child.id for child in children],
    )
    return children


def finish_children(orch: Orchestrator, *, fail: str | None = None, cancel: bool = False):
    """Complete every child but the first, which fails with ``fail`` or is cancelled."""
    first = None
    while (claim := orch.claim_next_task(worker_id="w", kinds=[CHILD])) is not None:
        lease = {"task_id": claim.task.id, "lease_id": claim.lease.id, "worker_id": "w"}
        if first is None:
            first = claim.task
            if fail is not None:
                orch.fail_task(**lease, error=fail)
                continue
            if cancel:
                orch.cancel_task(task_id=claim.task.id)
                continue
        orch.complete_task(**lease, output=1)
    return first


def test_a_call_blocked_by_a_failed_child_says_it_is_stalled_and_why(orch):
    serve(KIND, CHILD)
    run_id = call(orch).run_id
    fan_out(orch, run_id)
    assert seen(run_id)["statusMessage"] == "0 of 3 tasks completed."
    failed = finish_children(orch, fail="ValueError: 13 is unlucky")
    assert orch.get_run(run_id=run_id).status == "waiting"
    shown = seen(run_id)
    assert shown["status"] == "working"
    assert shown["statusMessage"] == (
        f"Stalled: blocked by task {failed.id} ({CHILD}), which failed: ValueError: 13 is "
        "unlucky. It stays blocked until an operator re-executes that task (retry_task, or "
        "the admin's Re-execute action) or resumes this one; or cancel this task."
    )
    # The operator re-executes the child: the call is no longer stalled.
    orch.retry_task(task_id=failed.id)
    assert seen(run_id)["statusMessage"] == "1 of 3 tasks completed."


def test_a_call_blocked_by_a_cancelled_child_says_so(orch):
    serve(KIND, CHILD)
    run_id = call(orch).run_id
    fan_out(orch, run_id)
    cancelled = finish_children(orch, cancel=True)
    message = seen(run_id)["statusMessage"]
    assert message.startswith(
        f"Stalled: blocked by task {cancelled.id} ({CHILD}), which was cancelled. "
    )


def test_a_long_error_is_cut_short_in_the_message(orch):
    serve(KIND, CHILD)
    run_id = call(orch).run_id
    fan_out(orch, run_id, n=1)
    finish_children(orch, fail="x" * 5000)
    message = seen(run_id)["statusMessage"]
    assert "x" * 299 + "…." in message and "x" * 300 not in message


def test_a_task_paused_with_nothing_to_resume_it_stalls_the_call(orch):
    serve(KIND)
    run_id = call(orch).run_id
    claim = orch.claim_next_task(worker_id="w", kinds=[KIND])
    orch.pause_task(task_id=claim.task.id, lease_id=claim.lease.id, worker_id="w", status="blocked")
    assert seen(run_id)["statusMessage"] == (
        f"Stalled: task {claim.task.id} ({KIND}) is blocked and nothing will resume it; an "
        "operator can resume it (resume_task), or cancel this task."
    )


def test_without_a_running_worker_for_a_kind_the_message_says_so(orch):
    run_id = call(orch).run_id
    message = seen(run_id)["statusMessage"]
    assert message.startswith(f"No running worker handles kind '{KIND}': start a pmcp_worker")
    serve(KIND)  # a worker for the tool, none for its children
    assert seen(run_id)["statusMessage"] == "0 of 1 tasks completed."
    fan_out(orch, run_id)
    assert seen(run_id)["statusMessage"].startswith(f"No running worker handles kind '{CHILD}'")
    serve(CHILD)
    assert seen(run_id)["statusMessage"] == "0 of 3 tasks completed."


def test_progress_is_the_message_of_a_call_that_gets_on(orch):
    serve(KIND)
    run_id = call(orch).run_id
    claim = orch.claim_next_task(worker_id="w", kinds=[KIND])
    orch.report_progress(
        task_id=claim.task.id, lease_id=claim.lease.id, worker_id="w", progress=0.5, message="half"
    )
    assert seen(run_id)["statusMessage"] == "half"


@pytest.mark.parametrize("stalled", [False, True])
def test_the_state_is_read_in_a_bounded_number_of_queries(
    orch, stalled, django_assert_max_num_queries
):
    serve(KIND, CHILD)
    run_id = call(orch).run_id
    fan_out(orch, run_id, n=50)
    if stalled:
        finish_children(orch, fail="boom")
    # The call (with its run and task), its outstanding input, and at most two for the notice.
    with django_assert_max_num_queries(4):
        shown = seen(run_id)
    assert shown["statusMessage"].startswith("Stalled" if stalled else "0 of 51")

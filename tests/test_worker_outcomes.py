"""What a handler's result does, seen from outside a real ``pmcp_worker`` process: each result
type, exceptions, timeouts, retries with backoff, dead-lettering, pause and resume, and which
kinds a worker claims."""

from __future__ import annotations

import signal
from datetime import datetime

import pytest

from parallel_mcp import Orchestrator
from parallel_mcp.models import Attempt, ClientTokenRecord, Event, Lease, Task
from tests.workers import (
    event_counts,
    kill_leftover_processes,  # noqa: F401 - autouse fixture
    marker_lines,
    start_worker,
    wait_until,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

TERMINAL = ("completed", "failed", "cancelled")


@pytest.fixture
def orch():
    return Orchestrator()


@pytest.fixture
def run(orch):
    return orch.create_run(namespace="outcomes")


def burst(*args: str) -> str:
    """Run a ``--burst`` worker to its end; return its stderr."""
    worker = start_worker("--burst", "--worker-id", "bursty", *args)
    assert worker.finish() == 0, worker.describe()
    return worker.err


def events(run_id, task_id=None) -> list[Event]:
    found = Event.objects.filter(run_id=run_id).order_by("id")
    if task_id is not None:
        found = found.filter(task_id=task_id)
    return list(found)


def types(run_id, task_id) -> list[str]:
    return [event.event_type for event in events(run_id, task_id)]


def attempt_statuses(task_id) -> list[str]:
    return list(
        Attempt.objects.filter(task_id=task_id)
        .order_by("leased_at")
        .values_list("status", flat=True)
    )


# -- result types -----------------------------------------------------------------------------


def test_a_plain_value_completes_the_task(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="test.echo", input={"x": 1})
    burst()
    task = Task.objects.get(pk=task.id)
    assert task.status == "completed"
    assert task.output == {"echo": {"x": 1}, "attempt": 1}
    assert task.progress == 1.0
    assert task.error is None
    assert (task.lease_id, task.leased_by) == (None, None)
    assert types(run.id, task.id) == [
        "task.enqueued",
        "task.claimed",
        "task.running",
        "task.completed",
    ]
    assert attempt_statuses(task.id) == ["completed"]
    assert Attempt.objects.get(task_id=task.id).worker_id == "bursty"
    assert Lease.objects.get(task_id=task.id).status == "released"
    assert orch.get_run(run_id=run.id).status == "completed"
    # The worker reports with a client token, so a lost reply can be replayed safely.
    assert ClientTokenRecord.objects.get(task_id=task.id).outcome == "completed"


def test_completed_with_next_context_appends_a_current_snapshot(orch):
    run = orch.create_run(namespace="outcomes", context={"step": 1})
    initial = orch.get_current_context_snapshot(run_id=run.id)
    task = orch.enqueue_task(run_id=run.id, kind="test.context")
    burst()
    task = Task.objects.get(pk=task.id)
    assert task.status == "completed"
    assert task.output == {"seen": {"step": 1}}  # ctx.context is the current snapshot payload
    current = orch.get_current_context_snapshot(run_id=run.id)
    assert current.id != initial.id
    assert current.payload == {"step": 2}
    assert current.label == "test.context.next"
    assert current.task_id == task.id
    assert current.parent_snapshot_id == initial.id
    assert current.scope == "run"


def test_failed_without_retry_is_terminal_even_with_attempts_left(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="test.failed", max_attempts=3)
    burst()
    task = Task.objects.get(pk=task.id)
    assert (task.status, task.error, task.dead, task.attempt_count) == (
        "failed",
        "handler said no",
        False,
        1,
    )
    assert task.metadata == {"why": "test"}
    assert event_counts(run.id, "task.failed") == {task.id: 1}
    assert not event_counts(run.id, "task.retry_scheduled")
    assert attempt_statuses(task.id) == ["failed"]
    assert orch.get_run(run_id=run.id).status == "failed"


def test_failed_with_retry_is_retried_then_dead_lettered(orch, run):
    task = orch.enqueue_task(
        run_id=run.id, kind="test.failed", max_attempts=2, input={"retry": True}
    )
    burst()
    task = Task.objects.get(pk=task.id)
    assert (task.status, task.dead, task.attempt_count, task.error) == (
        "failed",
        True,
        2,
        "handler said no",
    )
    assert event_counts(run.id, "task.retry_scheduled") == {task.id: 1}
    assert event_counts(run.id, "task.dead_lettered") == {task.id: 1}
    assert attempt_statuses(task.id) == ["failed", "failed"]
    assert [t.id for t in orch.list_dead_tasks(run_id=run.id)] == [task.id]


def test_paused_waits_for_input_and_resumes_with_the_updated_input(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="test.pause", input={"question": "ok?"})
    burst()
    task = Task.objects.get(pk=task.id)
    assert task.status == "waiting_input"
    assert (task.lease_id, task.leased_by) == (None, None)
    (waiting,) = [e for e in events(run.id, task.id) if e.event_type == "task.waiting_input"]
    assert waiting.payload["reason"] == "need an answer"
    assert orch.get_run(run_id=run.id).status == "waiting"
    assert attempt_statuses(task.id) == ["released"]

    # The answer arrives with the resume: the handler sees the new input.
    resumed = orch.resume_task(task_id=task.id, input={"question": "ok?", "resumed": True})
    assert (resumed.status, resumed.input) == ("queued", {"question": "ok?", "resumed": True})
    burst()
    task = Task.objects.get(pk=task.id)
    assert (task.status, task.output) == ("completed", "resumed")
    assert event_counts(run.id, "task.resumed") == {task.id: 1}
    assert event_counts(run.id, "task.completed") == {task.id: 1}
    assert attempt_statuses(task.id) == ["released", "completed"]
    assert orch.get_run(run_id=run.id).status == "completed"


def test_released_goes_back_to_the_queue_without_using_an_attempt(orch, run, tmp_path):
    marker = tmp_path / "marker"
    task = orch.enqueue_task(
        run_id=run.id, kind="test.release_once", max_attempts=1, input={"marker": str(marker)}
    )
    burst()
    task = Task.objects.get(pk=task.id)
    # max_attempts=1 and two runs of the handler: the release did not use the attempt up.
    assert (task.status, task.output, task.attempt_count) == (
        "completed",
        {"after_release": True},
        1,
    )
    (released,) = [e for e in events(run.id, task.id) if e.event_type == "task.released"]
    assert released.payload["reason"] == "not yet"
    assert attempt_statuses(task.id) == ["released", "completed"]
    assert len(marker_lines(marker, "released")) == 1
    assert len(marker_lines(marker, "ran")) == 1


def test_an_exception_fails_the_task_with_its_text_and_logs_the_traceback(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="test.raise")
    err = burst()
    task = Task.objects.get(pk=task.id)
    assert task.status == "failed"
    assert task.error == "ValueError: boom on attempt 1"
    assert "Traceback" not in task.error and "\n" not in task.error
    assert not task.dead  # no max_attempts: terminal, not dead-lettered
    assert not event_counts(run.id, "task.retry_scheduled")
    attempt = Attempt.objects.get(task_id=task.id)
    assert (attempt.status, attempt.error) == ("failed", "ValueError: boom on attempt 1")
    # The worker's log has the whole traceback, naming the handler.
    assert "Traceback (most recent call last)" in err
    assert "in boom" in err
    assert "ValueError: boom on attempt 1" in err


def test_an_exception_is_retried_when_the_task_has_max_attempts_then_dead_lettered(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="test.raise", max_attempts=3)
    burst()
    task = Task.objects.get(pk=task.id)
    assert (task.status, task.dead, task.attempt_count) == ("failed", True, 3)
    assert task.error == "ValueError: boom on attempt 3"
    assert event_counts(run.id, "task.retry_scheduled") == {task.id: 2}
    assert event_counts(run.id, "task.dead_lettered") == {task.id: 1}
    errors = Attempt.objects.filter(task_id=task.id).order_by("leased_at")
    assert list(errors.values_list("error", flat=True)) == [
        f"ValueError: boom on attempt {n}" for n in (1, 2, 3)
    ]


def test_an_unstorable_result_fails_the_task(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="test.bad_output")
    burst()
    task = Task.objects.get(pk=task.id)
    assert task.status == "failed"
    assert task.error.startswith("InvalidResult: ")
    assert not Task.objects.filter(pk=task.id, lease_id__isnull=False).exists()


def test_a_failure_the_orchestrator_refuses_still_ends_the_task(orch, run):
    """``Failed(error="")`` cannot be stored: the task must not be left leased (it would be
    re-run after every lease expiry, forever without max_attempts)."""
    task = orch.enqueue_task(run_id=run.id, kind="test.failed_empty")
    burst()
    task = Task.objects.get(pk=task.id)
    assert task.status == "failed"
    assert task.lease_id is None
    assert task.error.startswith("InvalidResult: ")


def test_progress_and_heartbeat_from_the_handler(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="test.progress")
    burst()
    (progress,) = [e for e in events(run.id, task.id) if e.event_type == "task.progress"]
    assert progress.payload["progress"] == 0.5
    assert progress.payload["message"] == "half way"
    assert progress.payload["worker_id"] == "bursty"
    assert event_counts(run.id, "task.lease_heartbeat")[task.id] >= 1
    task = Task.objects.get(pk=task.id)
    assert (task.status, task.progress) == ("completed", 1.0)


# -- timeouts and retries -----------------------------------------------------------------------


def test_a_timeout_without_max_attempts_is_a_terminal_failure(orch, run, tmp_path):
    marker = tmp_path / "marker"
    task = orch.enqueue_task(
        run_id=run.id,
        kind="test.sleep",
        timeout_ms=400,
        input={"seconds": 60, "marker": str(marker)},
    )
    worker = start_worker("--worker-id", "timer")  # stays up: the handler's last words count
    wait_until(lambda: Task.objects.get(pk=task.id).status in TERMINAL, alive=[worker])
    # The handler was told (ctx.cancelled, reason "timeout") and stopped.
    wait_until(lambda: marker_lines(marker, "cancelled:timeout"), timeout=5, alive=[worker])
    worker.send_signal(signal.SIGTERM)
    assert worker.finish() == 0, worker.describe()
    task = Task.objects.get(pk=task.id)
    assert task.status == "failed"
    assert task.error.startswith("TimeoutError: ")
    assert "400" in task.error
    assert not task.dead
    assert task.attempt_count == 1
    assert not event_counts(run.id, "task.retry_scheduled")
    assert not marker_lines(marker, "finished")


def test_a_timeout_is_retried_when_the_task_has_max_attempts(orch, run, tmp_path):
    marker = tmp_path / "marker"
    task = orch.enqueue_task(
        run_id=run.id,
        kind="test.sleep",
        timeout_ms=300,
        max_attempts=2,
        input={"seconds": 60, "marker": str(marker)},
    )
    burst()
    task = Task.objects.get(pk=task.id)
    assert (task.status, task.dead, task.attempt_count) == ("failed", True, 2)
    assert task.error.startswith("TimeoutError: ")
    assert event_counts(run.id, "task.retry_scheduled") == {task.id: 1}
    assert event_counts(run.id, "task.dead_lettered") == {task.id: 1}
    assert attempt_statuses(task.id) == ["failed", "failed"]
    assert len(marker_lines(marker, "started")) == 2


def test_retries_wait_for_their_backoff(orch, run):
    delay_ms = 300
    task = orch.enqueue_task(
        run_id=run.id,
        kind="test.flaky",
        max_attempts=5,
        retry={"delay_ms": delay_ms, "backoff": "exponential"},
        input={"succeed_on": 3},
    )
    # Not --burst: a burst worker stops as soon as only a backed-off retry is left.
    worker = start_worker("--worker-id", "patient")
    wait_until(lambda: Task.objects.get(pk=task.id).status in TERMINAL, alive=[worker])
    worker.send_signal(signal.SIGTERM)
    assert worker.finish() == 0, worker.describe()

    task = Task.objects.get(pk=task.id)
    assert (task.status, task.output, task.attempt_count) == (
        "completed",
        {"succeeded_on": 3},
        3,
    )
    task_events = events(run.id, task.id)
    scheduled = [e for e in task_events if e.event_type == "task.retry_scheduled"]
    claimed = [e for e in task_events if e.event_type == "task.claimed"]
    assert [e.payload["delay_ms"] for e in scheduled] == [delay_ms, 2 * delay_ms]
    assert [e.payload["error"] for e in scheduled] == ["ConnectionError: transient"] * 2
    assert len(claimed) == 3
    for retry, next_claim in zip(scheduled, claimed[1:], strict=True):
        not_before = datetime.fromisoformat(retry.payload["not_before"])
        assert next_claim.created_at >= not_before
        assert (not_before - retry.created_at).total_seconds() * 1000 == pytest.approx(
            retry.payload["delay_ms"], abs=1
        )
    assert attempt_statuses(task.id) == ["failed", "failed", "completed"]


# -- which tasks a worker claims ----------------------------------------------------------------


def test_a_kind_without_a_handler_is_never_claimed(orch, run):
    orphan = orch.enqueue_task(run_id=run.id, kind="test.nobody_handles_this", priority=5)
    echo = orch.enqueue_task(run_id=run.id, kind="test.echo")
    burst()
    assert Task.objects.get(pk=echo.id).status == "completed"
    orphan = Task.objects.get(pk=orphan.id)
    assert (orphan.status, orphan.attempt_count, orphan.leased_by) == ("queued", 0, None)
    assert types(run.id, orphan.id) == ["task.enqueued"]


def test_kinds_restricts_what_the_worker_claims(orch, run):
    echo = orch.enqueue_task(run_id=run.id, kind="test.echo")
    other = orch.enqueue_task(run_id=run.id, kind="test.context", priority=5)
    stderr = burst("--kinds", "test.echo")
    assert Task.objects.get(pk=echo.id).status == "completed"
    other = Task.objects.get(pk=other.id)
    assert (other.status, other.attempt_count) == ("queued", 0)
    assert "kinds test.echo," in stderr  # the start-up line names the kinds

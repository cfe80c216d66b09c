"""The django.tasks backend end to end: ``@task`` functions enqueued here, run by a real
``pmcp_worker`` process (``--settings=tests.tasks_settings``, which adds the TASKS setting),
their results read back through the framework's API."""

from __future__ import annotations

import importlib
import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from parallel_mcp import Orchestrator
from parallel_mcp.models import Event, Run, Task
from parallel_mcp.tasks_backend import ParallelMcpBackend
from parallel_mcp.tasks_compat import (
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
)
from tests import tasks_settings
from tests.workers import (
    kill_leftover_processes,  # noqa: F401 - autouse fixture
    marker_lines,
    start_worker,
)

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.django_entry,
]

SETTINGS = "--settings=tests.tasks_settings"


@pytest.fixture(autouse=True)
def tasks_setting():
    with override_settings(TASKS=tasks_settings.TASKS):
        yield


@pytest.fixture
def jobs():
    return importlib.import_module("tests.testapp.tasks")


def burst(*args: str) -> str:
    """Run a ``--burst`` worker (worker id "bursty") to its end; return its stderr."""
    worker = start_worker("--burst", "--worker-id", "bursty", SETTINGS, *args)
    assert worker.finish(60) == 0, worker.describe()
    return worker.err


def result_of(result):
    return task_backends[result.backend].get_result(result.id)


def test_enqueue_then_get_result_before_and_after_the_worker_ran_it(jobs, tmp_path):
    marker = tmp_path / "marker"
    result = jobs.add.enqueue(2, 3, marker=str(marker))
    before = jobs.add.get_result(result.id)
    assert before.status == TaskResultStatus.READY
    assert not before.is_finished and before.attempts == 0
    with pytest.raises(ValueError, match="not finished"):
        _ = before.return_value

    burst()

    after = jobs.add.get_result(result.id)
    assert after.status == TaskResultStatus.SUCCESSFUL
    assert after.return_value == 5
    assert (after.args, after.kwargs) == ([2, 3], {"marker": str(marker)})
    assert (after.worker_ids, after.attempts, after.errors) == (["bursty"], 1, [])
    assert after.enqueued_at == before.enqueued_at
    assert after.enqueued_at <= after.started_at <= after.finished_at
    assert after.last_attempted_at == after.started_at
    assert len(marker_lines(marker, "add")) == 1
    result.refresh()  # the TaskResult the caller holds catches up
    assert (result.status, result.return_value) == (TaskResultStatus.SUCCESSFUL, 5)
    # The same work, seen as parallel_mcp sees it.
    row = Task.objects.get(pk=result.id)
    assert (row.status, row.output, row.attempt_count, row.kind) == (
        "completed",
        5,
        1,
        "django.tasks:default",
    )
    assert Run.objects.get(pk=result.id).status == "completed"


def test_a_deferred_task_waits_for_run_after(jobs):
    run_after = timezone.now() + timedelta(seconds=5)
    result = jobs.add.using(run_after=run_after).enqueue(1, 1)
    burst()  # nothing is due yet: the worker finds nothing to claim
    if timezone.now() < run_after:
        assert result_of(result).status == TaskResultStatus.READY
        assert result_of(result).attempts == 0
        time.sleep((run_after - timezone.now()).total_seconds() + 0.05)
    burst()
    done = result_of(result)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.started_at >= run_after
    assert done.task.run_after == run_after


def test_higher_priority_runs_first(jobs, tmp_path):
    marker = tmp_path / "order"
    for name, priority in [("low", -100), ("zero", 0), ("top", 100), ("fifty", 50), ("neg", -1)]:
        jobs.record.using(priority=priority).enqueue(name, str(marker))
    burst("--concurrency", "1")
    assert marker_lines(marker) == ["top", "fifty", "zero", "neg", "low"]


def test_failures_are_retried_then_dead_lettered_with_class_path_and_traceback(jobs):
    result = jobs.always_fails.enqueue("it broke")
    burst()
    failed = result_of(result)
    assert failed.status == TaskResultStatus.FAILED
    assert failed.is_finished and failed.finished_at is not None
    assert (failed.attempts, failed.worker_ids) == (3, ["bursty"] * 3)  # MAX_ATTEMPTS = 3
    assert len(failed.errors) == 3
    for error in failed.errors:
        assert error.exception_class_path == "tests.testapp.tasks.Boom"
        assert error.exception_class is jobs.Boom
        assert error.traceback.startswith("Traceback (most recent call last):")
        assert "raise Boom(message)" in error.traceback
        assert error.traceback.rstrip().endswith("tests.testapp.tasks.Boom: it broke")
    with pytest.raises(ValueError, match="failed"):
        _ = failed.return_value
    row = Task.objects.get(pk=result.id)
    assert (row.status, row.dead, row.error) == ("failed", True, "Boom: it broke")
    assert [t.id for t in Orchestrator().list_dead_tasks()] == [row.id]
    types = list(
        Event.objects.filter(task_id=row.id).order_by("id").values_list("event_type", flat=True)
    )
    assert types.count("task.retry_scheduled") == 2
    assert types[-1] == "task.dead_lettered"


def test_one_attempt_only_is_dead_lettered_at_once(jobs):
    result = jobs.fails_once_only.enqueue("no second chance")
    burst()
    failed = result_of(result)
    assert failed.backend == "once"
    assert (failed.status, failed.attempts, len(failed.errors)) == (TaskResultStatus.FAILED, 1, 1)
    assert Task.objects.get(pk=result.id).dead is True


def test_a_retried_task_succeeds_with_the_earlier_error_kept(jobs):
    result = jobs.flaky.enqueue(succeed_on=2)
    burst()
    done = result_of(result)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == {"attempt": 2}
    assert done.attempts == 2
    [error] = done.errors
    assert error.exception_class is ConnectionError
    assert "transient failure on attempt 1" in error.traceback


def test_async_functions_run(jobs):
    result = jobs.async_multiply.enqueue(6, 7)
    burst()
    done = result_of(result)
    assert (done.status, done.return_value) == (TaskResultStatus.SUCCESSFUL, 42)


def test_context_taking_tasks_see_their_result_and_attempt(jobs):
    result = jobs.introspect.using(priority=7).enqueue("hello")
    burst()
    done = result_of(result)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.return_value == {
        "label": "hello",
        "id": result.id,
        "attempt": 1,
        "status": "RUNNING",
        "running": True,
        "args": ["hello"],
        "kwargs": {},
        "worker_ids": ["bursty"],
        "backend": "default",
        "queue_name": "default",
        "priority": 7,
        "name": "introspect",
        "started": True,
    }


def test_a_return_value_json_cannot_hold_fails_without_a_retry(jobs):
    result = jobs.returns_a_set.enqueue()
    burst()
    failed = result_of(result)
    assert (failed.status, failed.attempts) == (TaskResultStatus.FAILED, 1)
    [error] = failed.errors
    assert error.exception_class is TypeError
    row = Task.objects.get(pk=result.id)
    assert (row.status, row.dead) == ("failed", False)  # the function ran: not run again


def test_workers_pick_queues_by_kind(jobs):
    email = jobs.send_email.enqueue("someone@example.com")
    sum_ = jobs.add.enqueue(1, 1)
    burst("--kinds", "django.tasks:default")
    assert result_of(sum_).status == TaskResultStatus.SUCCESSFUL
    assert result_of(email).status == TaskResultStatus.READY
    burst("--kinds", "django.tasks:emails")
    assert result_of(email).return_value == {"sent": "someone@example.com"}


def test_enqueue_in_a_rolled_back_transaction_leaves_nothing_to_run(jobs, tmp_path):
    marker = tmp_path / "marker"
    heard = []

    def listener(sender, task_result, **kwargs):
        heard.append(task_result.id)

    task_enqueued.connect(listener)
    try:
        with pytest.raises(RuntimeError), transaction.atomic():
            lost = jobs.add.enqueue(1, 2, marker=str(marker))
            raise RuntimeError("roll back")
        with transaction.atomic():
            kept = jobs.add.enqueue(3, 4, marker=str(marker))
            assert heard == []  # not before the commit
    finally:
        task_enqueued.disconnect(listener)
    assert heard == [kept.id]
    assert list(Task.objects.values_list("id", flat=True)) == [Task.objects.get(pk=kept.id).id]
    with pytest.raises(TaskResultDoesNotExist):
        task_backends["default"].get_result(lost.id)
    err = burst()
    assert "claimed 1," in err
    assert marker_lines(marker, "add") and len(marker_lines(marker)) == 1
    assert result_of(kept).return_value == 7
    assert isinstance(task_backends["default"], ParallelMcpBackend)

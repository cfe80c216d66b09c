"""parallel_mcp as a django.tasks backend, in this process: what enqueue writes, how
get_result maps every state of a parallel_mcp task, the framework's validation errors, the
backend's system checks and the worker registry hook. The worker side, end to end through a
real ``pmcp_worker`` process, is in test_tasks_backend_worker.py."""

from __future__ import annotations

import importlib
import uuid
from datetime import timedelta

import django
import pytest
from asgiref.sync import async_to_sync
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from parallel_mcp import Orchestrator, tasks_compat
from parallel_mcp.models import Attempt, Event, Run, Task
from parallel_mcp.tasks_backend import (
    KIND_PREFIX,
    OPTION_DEFAULTS,
    LeaseExpired,
    ParallelMcpBackend,
    TaskCancelled,
    TaskFailed,
    check_task_backends,
    queue_kind,
)
from parallel_mcp.tasks_compat import (
    InvalidTask,
    TaskError,
    TaskResultDoesNotExist,
    TaskResultStatus,
    task_backends,
    task_enqueued,
)
from parallel_mcp.tasks_compat import Task as FrameworkTask
from parallel_mcp.worker.registry import HandlerRegistry, load_task_backend_handlers
from tests import tasks_settings

pytestmark = pytest.mark.django_db

try:
    from django.tasks import task
    from django.tasks.exceptions import TaskResultMismatch
except ImportError:
    from django_tasks import task
    from django_tasks.exceptions import TaskResultMismatch


@pytest.fixture(autouse=True)
def tasks_setting():
    with override_settings(TASKS=tasks_settings.TASKS):
        yield


@pytest.fixture
def jobs():
    """The @task functions (importing them needs the TASKS setting)."""
    return importlib.import_module("tests.testapp.tasks")


@pytest.fixture
def orch():
    return Orchestrator()


def backend(alias: str = "default") -> ParallelMcpBackend:
    return task_backends[alias]


# -- the backend ------------------------------------------------------------------------------


def test_django_6_runs_the_backend_on_its_own_tasks_framework_not_the_backport(jobs):
    """The test extra installs the backport everywhere; from Django 6 on it must go unused."""
    framework = "django.tasks" if django.VERSION >= (6, 0) else "django_tasks"
    assert tasks_compat.FRAMEWORK == framework
    base = ParallelMcpBackend.__mro__[1]
    assert (base.__name__, base.__module__) == ("BaseTaskBackend", f"{framework}.backends.base")
    assert type(jobs.add).__module__ == f"{framework}.base"  # what @task makes
    assert jobs.add.get_backend() is backend()
    assert isinstance(jobs.add.enqueue(1, 2, marker=None), tasks_compat.TaskResult)


def test_the_backend_supports_everything_the_framework_asks_about():
    b = backend()
    assert isinstance(b, ParallelMcpBackend)
    assert (b.supports_defer, b.supports_async_task, b.supports_get_result) == (True, True, True)
    assert b.supports_priority is True
    assert b.queues == {"default", "emails"}
    assert list(b.check()) == []


def test_enqueue_writes_one_run_with_one_task(jobs):
    result = jobs.add.enqueue(2, 3, marker=None)
    assert result.status == TaskResultStatus.READY
    assert (result.args, result.kwargs) == ([2, 3], {"marker": None})
    assert (result.backend, result.errors, result.worker_ids, result.attempts) == (
        "default",
        [],
        [],
        0,
    )
    assert result.enqueued_at is not None
    assert (result.started_at, result.finished_at, result.last_attempted_at) == (None,) * 3
    with pytest.raises(ValueError, match="not finished"):
        _ = result.return_value

    row = Task.objects.get(pk=result.id)  # the TaskResult id is the task's id ...
    run = Run.objects.get(pk=result.id)  # ... and its run's
    assert row.run_id == run.id
    assert row.kind == "django.tasks:default" == queue_kind("default")
    assert row.input == {
        "func": "tests.testapp.tasks.add",
        "args": [2, 3],
        "kwargs": {"marker": None},
        "takes_context": False,
        "backend": "default",
        "queue_name": "default",
        "priority": 0,
        "run_after": None,
    }
    assert (row.status, row.priority, row.not_before, row.created_at) == (
        "queued",
        0,
        None,
        result.enqueued_at,
    )
    # OPTIONS of the "default" alias: three attempts, retried at once.
    assert (row.max_attempts, row.retry_delay_ms, row.retry_backoff, row.timeout_ms) == (
        3,
        None,
        None,
        None,
    )
    assert (run.namespace, run.external_id, run.status) == (
        "django.tasks",
        "tests.testapp.tasks.add",
        "active",
    )
    assert run.metadata == {
        "django_tasks": {"backend": "default", "queue_name": "default", "task": row.input["func"]}
    }
    assert Run.objects.count() == 1 and Task.objects.count() == 1
    assert [e.event_type for e in Event.objects.filter(run_id=run.id).order_by("id")] == [
        "run.created",
        "task.enqueued",
        "run.status.changed",
    ]


def test_the_documented_defaults_apply_without_options(jobs):
    assert OPTION_DEFAULTS["MAX_ATTEMPTS"] == 3
    row = Task.objects.get(pk=jobs.with_defaults.enqueue().id)
    assert (row.max_attempts, row.retry_delay_ms, row.retry_backoff, row.retry_max_delay_ms) == (
        3,
        1_000,
        "exponential",
        300_000,
    )
    assert row.timeout_ms is None
    assert row.input["backend"] == "defaults"


def test_options_set_attempts_retry_timeout_and_namespace(jobs):
    options = {
        "MAX_ATTEMPTS": 5,
        "RETRY": {"delay_ms": 250, "backoff": "fixed"},
        "TIMEOUT_MS": 60_000,
        "NAMESPACE": "jobs",
    }
    setting = {"default": {"BACKEND": tasks_settings.BACKEND, "OPTIONS": options}}
    with override_settings(TASKS=setting):
        result = jobs.add.enqueue(1, 1)
    row = Task.objects.get(pk=result.id)
    assert (row.max_attempts, row.retry_delay_ms, row.retry_backoff, row.timeout_ms) == (
        5,
        250,
        "fixed",
        60_000,
    )
    assert row.run.namespace == "jobs"


def test_priority_is_kept_as_is_and_queues_become_kinds(jobs):
    low = jobs.add.using(priority=-100).enqueue(1, 1)
    high = jobs.add.using(priority=100).enqueue(1, 1)
    email = jobs.send_email.enqueue("a@example.com")
    assert Task.objects.get(pk=low.id).priority == -100
    assert Task.objects.get(pk=high.id).priority == 100
    assert Task.objects.get(pk=email.id).kind == "django.tasks:emails"
    assert backend().get_result(high.id).task.priority == 100
    assert backend().get_result(email.id).task.queue_name == "emails"


def test_run_after_becomes_not_before(jobs):
    when = timezone.now() + timedelta(hours=1)
    result = jobs.add.using(run_after=when).enqueue(1, 1)
    row = Task.objects.get(pk=result.id)
    assert row.not_before == when
    assert row.input["run_after"] == when.isoformat()
    again = backend().get_result(result.id)
    assert again.task.run_after == when
    assert again.status == TaskResultStatus.READY


def test_enqueue_in_a_rolled_back_transaction_leaves_nothing(jobs):
    heard = []

    def listener(sender, task_result, **kwargs):
        heard.append(task_result.id)

    task_enqueued.connect(listener)
    try:
        with pytest.raises(RuntimeError), transaction.atomic():
            result = jobs.add.enqueue(1, 2)
            assert Task.objects.filter(pk=result.id).exists()  # visible inside
            raise RuntimeError("roll back")
    finally:
        task_enqueued.disconnect(listener)
    assert not Run.objects.exists() and not Task.objects.exists() and not Event.objects.exists()
    with pytest.raises(TaskResultDoesNotExist):
        backend().get_result(result.id)
    assert heard == []


def test_task_enqueued_is_sent_after_commit(jobs, django_capture_on_commit_callbacks):
    heard = []

    def listener(sender, task_result, **kwargs):
        heard.append((sender, task_result.id, task_result.status))

    task_enqueued.connect(listener)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            result = jobs.add.enqueue(1, 2)
            assert heard == []
    finally:
        task_enqueued.disconnect(listener)
    assert heard == [(ParallelMcpBackend, result.id, TaskResultStatus.READY)]


def test_aenqueue_and_aget_result(jobs):
    result = async_to_sync(jobs.add.aenqueue)(4, 5)
    assert Task.objects.filter(pk=result.id).exists()
    again = async_to_sync(jobs.add.aget_result)(result.id)
    assert (again.id, again.status, again.args) == (result.id, TaskResultStatus.READY, [4, 5])


# -- invalid tasks: the framework's errors --------------------------------------------------------


def test_invalid_tasks_are_refused_with_the_frameworks_error(jobs):
    def local_function():
        pass

    with pytest.raises(InvalidTask, match="module level"):
        task()(local_function)
    with pytest.raises(InvalidTask, match="Queue 'nowhere' is not valid"):
        jobs.add.using(queue_name="nowhere")
    with pytest.raises(InvalidTask, match="priority"):
        jobs.add.using(priority=101)
    with pytest.raises(InvalidTask, match="priority"):
        jobs.add.using(priority=-101)
    with pytest.raises(InvalidTask, match="aware"):
        jobs.add.using(run_after=timezone.now().replace(tzinfo=None))
    with pytest.raises(InvalidTask, match="context"):
        task(takes_context=True)(jobs.undecorated)
    assert not Task.objects.exists()


def test_a_task_not_found_at_its_dotted_path_is_refused(jobs):
    # Valid for the framework, but a worker could never import it by its path.
    stray = FrameworkTask(
        func=jobs.undecorated,
        priority=0,
        backend="default",
        queue_name="default",
        run_after=None,
    )
    with pytest.raises(InvalidTask, match="does not name this task"):
        stray.enqueue(1)
    assert not Task.objects.exists()


def test_a_task_of_another_backend_is_refused(jobs):
    with pytest.raises(InvalidTask, match="for backend 'default', not 'defaults'"):
        backend("defaults").enqueue(jobs.add, (1, 2), {})


def test_arguments_must_be_json(jobs):
    with pytest.raises(TypeError, match="Unsupported type"):
        jobs.add.enqueue(timezone.now(), 1)
    with pytest.raises(TypeError, match="Unsupported type"):
        jobs.add.enqueue(1, 2, marker={1, 2})
    assert not Run.objects.exists() and not Task.objects.exists()


def test_unknown_results_do_not_exist(jobs, orch):
    with pytest.raises(TaskResultDoesNotExist):
        backend().get_result(str(uuid.uuid4()))
    with pytest.raises(TaskResultDoesNotExist):
        backend().get_result("not-a-uuid")
    # A parallel_mcp task that is not a django task.
    run = orch.create_run()
    other = orch.enqueue_task(run_id=run.id, kind="test.echo")
    with pytest.raises(TaskResultDoesNotExist):
        backend().get_result(str(other.id))
    with pytest.raises(TaskResultDoesNotExist):
        jobs.add.get_result(str(other.id))


def test_a_result_read_through_another_task_is_a_mismatch(jobs):
    result = jobs.add.enqueue(1, 2)
    assert jobs.add.get_result(result.id).id == result.id
    with pytest.raises(TaskResultMismatch):
        jobs.send_email.get_result(result.id)


# -- get_result: every parallel_mcp state ---------------------------------------------------------


def lease(claim) -> dict:
    return {
        "task_id": claim.task.id,
        "lease_id": claim.lease.id,
        "worker_id": claim.lease.worker_id,
    }


def test_result_through_claim_run_and_completion(jobs, orch):
    result = jobs.add.enqueue(2, 2)
    claim = orch.claim_next_task(worker_id="w1", kinds=[KIND_PREFIX + "default"])
    leased = backend().get_result(result.id)
    assert leased.status == TaskResultStatus.RUNNING
    assert (leased.worker_ids, leased.attempts, leased.started_at) == (["w1"], 1, None)
    assert leased.last_attempted_at == Attempt.objects.get(pk=claim.lease.id).leased_at

    orch.mark_task_running(**lease(claim))
    running = backend().get_result(result.id)
    assert running.status == TaskResultStatus.RUNNING
    assert running.started_at is not None
    assert running.last_attempted_at == running.started_at
    assert not running.is_finished

    orch.complete_task(**lease(claim), output=4)
    done = jobs.add.get_result(result.id)
    assert done.status == TaskResultStatus.SUCCESSFUL
    assert done.is_finished and done.return_value == 4
    assert done.finished_at == Task.objects.get(pk=result.id).completed_at
    assert (done.errors, done.worker_ids) == ([], ["w1"])
    # refresh() reloads the framework's fields in place.
    result.refresh()
    assert (result.status, result.return_value, result.worker_ids) == (
        TaskResultStatus.SUCCESSFUL,
        4,
        ["w1"],
    )


def test_each_failed_attempt_is_an_error_and_the_last_one_fails_the_result(jobs, orch):
    result = jobs.add.enqueue(1, 1)
    recorded = {
        "django_tasks": {
            "error": {"exception_class_path": "builtins.KeyError", "traceback": "Traceback …"}
        }
    }
    for worker in ("w1", "w2"):
        claim = orch.claim_next_task(worker_id=worker)
        orch.fail_task(**lease(claim), error="KeyError: 'x'", retry=True, metadata=recorded)
    middle = backend().get_result(result.id)
    assert middle.status == TaskResultStatus.READY  # retried: ready to run again
    assert (
        middle.errors
        == [TaskError(exception_class_path="builtins.KeyError", traceback="Traceback …")] * 2
    )
    assert middle.worker_ids == ["w1", "w2"]
    claim = orch.claim_next_task(worker_id="w3")
    orch.fail_task(**lease(claim), error="TimeoutError: task exceeded timeout_ms=5", retry=True)
    final = backend().get_result(result.id)
    assert final.status == TaskResultStatus.FAILED
    assert final.finished_at is not None
    assert final.attempts == 3 and final.worker_ids == ["w1", "w2", "w3"]
    # Without a recorded exception (the worker's timeout), the error is named after its text.
    assert final.errors[-1] == TaskError(
        exception_class_path="builtins.TimeoutError",
        traceback="TimeoutError: task exceeded timeout_ms=5",
    )
    assert final.errors[-1].exception_class is TimeoutError
    with pytest.raises(ValueError, match="failed"):
        _ = final.return_value
    assert Task.objects.get(pk=result.id).dead is True  # in the dead-letter queue


def test_an_expired_lease_is_an_error_and_a_released_attempt_is_not_counted(jobs, orch):
    result = jobs.add.enqueue(1, 1)
    claim = orch.claim_next_task(worker_id="gone", lease_ms=1_000)
    orch.expire_leases(now=timezone.now() + timedelta(seconds=5))
    expired = backend().get_result(result.id)
    assert expired.status == TaskResultStatus.READY
    assert expired.worker_ids == ["gone"]
    [error] = expired.errors
    assert error.exception_class is LeaseExpired
    assert "worker gone stopped renewing its lease" in error.traceback
    assert str(claim.lease.id) not in error.traceback

    claim = orch.claim_next_task(worker_id="draining")
    orch.release_task(**lease(claim), reason="worker stopped")
    released = backend().get_result(result.id)
    assert released.status == TaskResultStatus.READY
    assert released.worker_ids == ["gone"]  # the release gave the attempt back

    claim = orch.claim_next_task(worker_id="w2")
    orch.fail_task(**lease(claim), error="InvalidResult: output is too large", retry=False)
    failed = backend().get_result(result.id)
    assert failed.status == TaskResultStatus.FAILED
    assert [e.exception_class for e in failed.errors] == [LeaseExpired, TaskFailed]
    assert failed.errors[-1].traceback == "InvalidResult: output is too large"


def test_a_cancelled_task_is_failed_with_the_reason(jobs, orch):
    result = jobs.add.enqueue(1, 1)
    orch.cancel_task(task_id=result.id, reason="not needed any more")
    cancelled = backend().get_result(result.id)
    assert cancelled.status == TaskResultStatus.FAILED
    assert cancelled.finished_at is not None
    [error] = cancelled.errors
    assert error.exception_class is TaskCancelled
    assert error.traceback.endswith("TaskCancelled: not needed any more")


def test_a_requeued_dead_task_is_ready_again_with_its_history(jobs, orch):
    result = jobs.fails_once_only.enqueue("x")
    claim = orch.claim_next_task(worker_id="w1")
    orch.fail_task(**lease(claim), error="Boom: x", retry=True)
    assert backend("once").get_result(result.id).status == TaskResultStatus.FAILED
    orch.requeue_dead_task(task_id=result.id)
    again = backend("once").get_result(result.id)
    assert again.status == TaskResultStatus.READY
    assert again.finished_at is None
    assert len(again.errors) == 1 and again.worker_ids == ["w1"]


# -- configuration and system checks --------------------------------------------------------------


def messages(params: dict, alias: str = "bad") -> list:
    return list(ParallelMcpBackend(alias, params).check())


def test_check_reports_misconfiguration():
    assert messages({}) == []
    assert messages({"QUEUES": ["default", "emails"], "OPTIONS": {"MAX_ATTEMPTS": 1}}) == []

    [empty] = messages({"QUEUES": []})
    assert empty.id == "parallel_mcp.E102" and "QUEUES'] is empty" in empty.msg
    [not_a_list] = messages({"QUEUES": "default"})
    assert not_a_list.id == "parallel_mcp.E102"
    [a_mapping] = messages({"QUEUES": {"default": 1}})  # its keys are not taken for names
    assert a_mapping.id == "parallel_mcp.E102" and "must be a list" in a_mapping.msg
    [comma] = messages({"QUEUES": ["a,b"]})
    assert comma.id == "parallel_mcp.E102" and "without commas" in comma.msg

    [not_a_dict] = messages({"OPTIONS": ["MAX_ATTEMPTS"]})
    assert not_a_dict.id == "parallel_mcp.E103"
    [typo] = messages({"OPTIONS": {"MAX_ATTEMPT": 2}})
    assert typo.id == "parallel_mcp.E103"
    assert typo.msg == "Unknown option 'MAX_ATTEMPT' in TASKS['bad']['OPTIONS']."
    assert typo.hint == "Did you mean 'MAX_ATTEMPTS'?"
    [lease] = messages({"OPTIONS": {"LEASE_MS": 60_000}})
    assert "pmcp_worker --lease-ms" in lease.hint

    bad_values = messages(
        {
            "OPTIONS": {
                "MAX_ATTEMPTS": 0,
                "RETRY": {"delay_ms": -1},
                "TIMEOUT_MS": "1s",
                "NAMESPACE": "",
            }
        }
    )
    assert [m.id for m in bad_values] == ["parallel_mcp.E104"] * 4
    assert [m.msg.split("]")[2] for m in bad_values] == [
        "['MAX_ATTEMPTS'",
        "['RETRY'",
        "['TIMEOUT_MS'",
        "['NAMESPACE'",
    ]
    assert messages({"OPTIONS": {"MAX_ATTEMPTS": True}})[0].id == "parallel_mcp.E104"
    assert messages({"OPTIONS": {"RETRY": {"backoff": "linear"}}})[0].id == "parallel_mcp.E104"


def test_check_requires_parallel_mcp_in_installed_apps(monkeypatch):
    from django.apps import apps

    real = apps.is_installed
    monkeypatch.setattr(apps, "is_installed", lambda name: name != "parallel_mcp" and real(name))
    [missing] = messages({})
    assert missing.id == "parallel_mcp.E101"


def test_a_misconfigured_backend_refuses_to_enqueue(jobs):
    setting = {"default": {"BACKEND": tasks_settings.BACKEND, "OPTIONS": {"RETRIES": 3}}}
    with override_settings(TASKS=setting):
        with pytest.raises(ImproperlyConfigured, match="Unknown option 'RETRIES'"):
            jobs.add.enqueue(1, 2)
    assert not Task.objects.exists()


def test_the_backends_problems_reach_manage_py_check_once():
    from django.core.checks import run_checks

    setting = {"default": {"BACKEND": tasks_settings.BACKEND, "QUEUES": []}}
    with override_settings(TASKS=setting):
        ids = [message.id for message in run_checks()]
    # From the framework's own check (Django 6, or the backport's app when installed), or
    # from parallel_mcp's when that one does not run: once either way.
    assert ids.count("parallel_mcp.E102") == 1


def test_parallel_mcp_checks_only_when_the_framework_does_not():
    from django.core.checks.registry import registry

    framework_checks = any(
        check.__module__ in ("django.tasks.checks", "django_tasks.checks")
        for check in registry.get_checks(include_deployment_checks=True)
    )
    assert check_task_backends() == []
    setting = {
        "default": {"BACKEND": tasks_settings.BACKEND, "QUEUES": []},
        "other": {"BACKEND": "tests.nowhere.Backend"},  # not ours: not imported, not checked
    }
    with override_settings(TASKS=setting):
        ids = [message.id for message in check_task_backends()]
    assert ids == ([] if framework_checks else ["parallel_mcp.E102"])


# -- the worker registry hook -------------------------------------------------------------------


def test_the_registry_hook_registers_a_handler_per_queue():
    from parallel_mcp.tasks_backend import run_django_task

    target = HandlerRegistry()
    load_task_backend_handlers(target=target)
    assert target.kinds() == ["django.tasks:default", "django.tasks:emails"]
    assert target.get("django.tasks:emails") is run_django_task
    load_task_backend_handlers(target=target)  # again: the same function, no duplicate

    with override_settings(TASKS={}):
        empty = HandlerRegistry()
        load_task_backend_handlers(target=empty)
        assert len(empty) == 0
    immediate = {"default": {"BACKEND": "django_tasks.backends.immediate.ImmediateBackend"}}
    with override_settings(TASKS=immediate):
        load_task_backend_handlers(target=empty)
        assert len(empty) == 0


# -- the handler, called here (the worker tests run it in a real worker) ------------------------


def test_the_handler_sends_the_frameworks_signals_and_returns_an_outcome(jobs, orch):
    from parallel_mcp import Completed, Failed
    from parallel_mcp.tasks_backend import run_django_task
    from parallel_mcp.tasks_compat import task_finished, task_started
    from parallel_mcp.worker.context import HandlerContext

    heard = []

    def listener(which, sender, task_result, **kwargs):
        heard.append((which, sender, task_result.status, task_result.attempts))

    def started(**kwargs):
        listener("started", **kwargs)

    def finished(**kwargs):
        listener("finished", **kwargs)

    task_started.connect(started)
    task_finished.connect(finished)
    try:
        ok, bad = jobs.add.enqueue(1, 2), jobs.always_fails.enqueue("nope")
        outcomes = []
        for _ in range(2):
            claim = orch.claim_next_task(worker_id="here")
            orch.mark_task_running(**lease(claim))
            ctx = HandlerContext(
                orchestrator=orch,
                task=claim.task,
                run=claim.run,
                lease=claim.lease,
                worker_id="here",
                lease_ms=30_000,
            )
            outcomes.append((str(claim.task.id), run_django_task(ctx)))
    finally:
        task_started.disconnect(started)
        task_finished.disconnect(finished)
    by_id = dict(outcomes)
    assert by_id[ok.id] == Completed(output=3)
    failure = by_id[bad.id]
    assert isinstance(failure, Failed) and failure.retry is True
    assert failure.error == "Boom: nope"
    recorded = failure.metadata["django_tasks"]["error"]
    assert recorded["exception_class_path"] == "tests.testapp.tasks.Boom"
    assert "Traceback (most recent call last)" in recorded["traceback"]
    assert sorted((which, sender, str(status), n) for which, sender, status, n in heard) == [
        ("finished", ParallelMcpBackend, "FAILED", 1),
        ("finished", ParallelMcpBackend, "SUCCESSFUL", 1),
        ("started", ParallelMcpBackend, "RUNNING", 1),
        ("started", ParallelMcpBackend, "RUNNING", 1),
    ]


def test_without_database_access_the_handler_builds_the_context_from_its_claim(jobs, orch):
    from types import SimpleNamespace

    from parallel_mcp import Completed
    from parallel_mcp.tasks_backend import run_django_task

    result = jobs.introspect.enqueue("remote")
    claim = orch.claim_next_task(worker_id="far-away")
    # An orchestrator that is not the local one (pmcp_worker --api): nothing is read back.
    ctx = SimpleNamespace(
        input=claim.task.input, task=claim.task, orchestrator=object(), worker_id="far-away"
    )
    outcome = run_django_task(ctx)
    assert isinstance(outcome, Completed)
    seen = outcome.output
    assert (seen["id"], seen["attempt"], seen["worker_ids"]) == (result.id, 1, ["far-away"])
    assert seen["running"] is True and seen["started"] is True


def test_a_task_that_cannot_be_loaded_fails_the_attempt(orch):
    from parallel_mcp import Failed
    from parallel_mcp.tasks_backend import run_django_task

    run = orch.create_run()
    orch.enqueue_task(
        run_id=run.id,
        kind="django.tasks:default",
        input={"func": "tests.testapp.tasks.gone", "args": [], "kwargs": {}, "backend": "default"},
    )
    claim = orch.claim_next_task(worker_id="w1")
    outcome = run_django_task(
        type("Ctx", (), {"input": claim.task.input, "task": claim.task, "orchestrator": orch})()
    )
    assert isinstance(outcome, Failed) and outcome.retry is True
    assert "does not point to a Task instance" in outcome.error
    assert outcome.metadata["django_tasks"]["error"]["exception_class_path"] == (
        InvalidTask.__module__ + "." + InvalidTask.__qualname__
    )

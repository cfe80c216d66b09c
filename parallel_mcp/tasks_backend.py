"""parallel_mcp as a backend for Django's Tasks framework (``django.tasks`` on Django 6+, the
``django-tasks`` backport on Django 5.2): ``@task`` functions run as durable parallel_mcp
tasks, with leases, retries with backoff, the dead-letter queue and crash recovery.

    TASKS = {
        "default": {
            "BACKEND": "parallel_mcp.tasks_backend.ParallelMcpBackend",
            "QUEUES": ["default", "emails"],
            "OPTIONS": {"MAX_ATTEMPTS": 3, "RETRY": {...}, "TIMEOUT_MS": None},
        }
    }

How the framework's concepts map (docs/django-tasks.md has the whole story):

- Each enqueue creates one run (namespace ``OPTIONS["NAMESPACE"]``, ``"django.tasks"`` by
  default; ``external_id`` the task's dotted path) holding one task. The run, the task and the
  ``TaskResult`` share one id. Runs are small rows; a run per enqueue keeps every row lock
  private to its task (no hot shared row), lets a finished run be pruned like any other, and
  makes each result one line in the admin and the API.
- The task's kind is ``"django.tasks:<queue name>"``, so ``pmcp_worker --kinds`` picks queues;
  its input is ``{"func", "args", "kwargs", "takes_context", "backend", "queue_name",
  "priority", "run_after"}``. ``run_after`` becomes ``not_before``; the priority is kept as is.
- The worker runs :func:`run_django_task` for those kinds. A return value completes the task
  (it is the result's ``return_value``); an exception fails the attempt with ``retry=True``:
  queued again after the backoff while attempts remain, then failed and dead-lettered. The
  exception's class path and traceback are stored on the attempt (``metadata["django_tasks"]``)
  and become the result's ``errors``.
"""

from __future__ import annotations

import difflib
import json
import logging
import traceback
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core import checks
from django.core.checks.registry import registry as check_registry
from django.core.exceptions import ImproperlyConfigured
from django.db import transaction
from django.utils import timezone
from django.utils.module_loading import import_string

from .contract.validation import is_list_like
from .ids import new_id, parse_id
from .states import AttemptStatus, TaskStatus
from .tasks_compat import (
    BaseTaskBackend,
    InvalidTask,
    Task,
    TaskContext,
    TaskError,
    TaskResult,
    TaskResultDoesNotExist,
    TaskResultStatus,
    normalize_json,
    task_backends,
    task_enqueued,
    task_finished,
    task_started,
)

logger = logging.getLogger("parallel_mcp.tasks")

KIND_PREFIX = "django.tasks:"
METADATA_KEY = "django_tasks"
DEFAULT_QUEUE_NAME = "default"
MAX_KIND_LENGTH = 200

OPTION_DEFAULTS: dict[str, Any] = {
    # Attempts per task, the first included (>= 1). An exception or a crashed worker uses one;
    # the last failure dead-letters the task.
    "MAX_ATTEMPTS": 3,
    # Delay before each retry: delay_ms, x2 per attempt when exponential, capped by max_delay_ms.
    # None retries at once.
    "RETRY": {"delay_ms": 1_000, "backoff": "exponential", "max_delay_ms": 300_000},
    # Longest a single attempt may run (milliseconds) before the worker fails it; None = no limit.
    "TIMEOUT_MS": None,
    # Namespace of the runs this backend creates.
    "NAMESPACE": "django.tasks",
}

STATUS_MAP: dict[str, Any] = {
    TaskStatus.QUEUED: TaskResultStatus.READY,
    TaskStatus.BLOCKED: TaskResultStatus.READY,
    TaskStatus.WAITING_INPUT: TaskResultStatus.READY,
    TaskStatus.LEASED: TaskResultStatus.RUNNING,
    TaskStatus.RUNNING: TaskResultStatus.RUNNING,
    TaskStatus.COMPLETED: TaskResultStatus.SUCCESSFUL,
    TaskStatus.FAILED: TaskResultStatus.FAILED,
    TaskStatus.CANCELLED: TaskResultStatus.FAILED,
}

MAX_ERROR_CHARS = 10_000
MAX_TRACEBACK_CHARS = 100_000


# -- what TaskResult.errors names when there was no Python exception ---------------------------


class LeaseExpired(Exception):
    """The worker running an attempt stopped renewing its lease: it crashed, was killed or
    lost the database. The attempt is counted and the task retried (or dead-lettered)."""


class TaskCancelled(Exception):
    """The task (or its run) was cancelled by an operator before it could finish."""


class TaskFailed(Exception):
    """An attempt failed without a Python exception (e.g. its result could not be stored)."""


def queue_kind(queue_name: str) -> str:
    """The parallel_mcp task kind of a queue: ``pmcp_worker --kinds django.tasks:emails``."""
    return f"{KIND_PREFIX}{queue_name}"


def class_path(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# -- configuration ------------------------------------------------------------------------------


def _config_problems(alias: str, params: dict[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """The OPTIONS in effect (defaults where a value is missing or wrong) and the system-check
    messages about the backend's configuration."""
    from .services.enqueue import parse_retry

    where = f"TASKS[{alias!r}]"
    problems: list[Any] = []
    options = dict(OPTION_DEFAULTS)

    queues = params.get("QUEUES", [DEFAULT_QUEUE_NAME])
    if not is_list_like(queues):
        problems.append(
            checks.Error(
                f"{where}['QUEUES'] must be a list of queue names, got {queues!r}.",
                id="parallel_mcp.E102",
            )
        )
    else:
        queues = list(queues)
        if not queues:
            problems.append(
                checks.Error(
                    f"{where}['QUEUES'] is empty: every queue needs a name, so that workers "
                    "can be told which ones to run.",
                    hint=f"List the queues, e.g. ['{DEFAULT_QUEUE_NAME}'], or leave QUEUES out.",
                    id="parallel_mcp.E102",
                )
            )
        longest = MAX_KIND_LENGTH - len(KIND_PREFIX)
        for queue in queues:
            if (
                not isinstance(queue, str)
                or not queue.strip()
                or "," in queue
                or len(queue) > longest
            ):
                problems.append(
                    checks.Error(
                        f"{where}['QUEUES'] has {queue!r}: a queue name must be a non-empty "
                        f"string of at most {longest} characters without commas.",
                        id="parallel_mcp.E102",
                    )
                )

    raw = params.get("OPTIONS", {})
    if not isinstance(raw, dict):
        problems.append(
            checks.Error(
                f"{where}['OPTIONS'] must be a dict, got {type(raw).__name__}.",
                id="parallel_mcp.E103",
            )
        )
        raw = {}
    for key in raw:
        if key not in OPTION_DEFAULTS:
            close = difflib.get_close_matches(str(key), OPTION_DEFAULTS, n=1)
            hint = (
                f"Did you mean {close[0]!r}?"
                if close
                else f"Known options: {', '.join(OPTION_DEFAULTS)}."
            )
            if key == "LEASE_MS":
                hint = (
                    "The lease is the worker's: pmcp_worker --lease-ms (default "
                    "PARALLEL_MCP['DEFAULT_LEASE_MS']); run a worker per queue with "
                    "--kinds django.tasks:<queue> to give queues different leases."
                )
            problems.append(
                checks.Error(
                    f"Unknown option {key!r} in {where}['OPTIONS'].",
                    hint=hint,
                    id="parallel_mcp.E103",
                )
            )

    def bad(key: str, expected: str) -> None:
        problems.append(
            checks.Error(
                f"{where}['OPTIONS'][{key!r}] must be {expected}, got {raw[key]!r}.",
                id="parallel_mcp.E104",
            )
        )

    if "MAX_ATTEMPTS" in raw:
        value = raw["MAX_ATTEMPTS"]
        if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 1_000_000:
            options["MAX_ATTEMPTS"] = value
        else:
            bad("MAX_ATTEMPTS", "a whole number from 1 to 1000000")
    if "RETRY" in raw:
        try:
            parse_retry(raw["RETRY"])
        except ValueError as exc:
            bad("RETRY", f"None or a dict of delay_ms, backoff, max_delay_ms ({exc})")
        else:
            options["RETRY"] = raw["RETRY"]
    if "TIMEOUT_MS" in raw:
        value = raw["TIMEOUT_MS"]
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and value > 0):
            options["TIMEOUT_MS"] = value
        else:
            bad("TIMEOUT_MS", "None or a positive number of milliseconds")
    if "NAMESPACE" in raw:
        value = raw["NAMESPACE"]
        if isinstance(value, str) and value.strip() and len(value) <= 200:
            options["NAMESPACE"] = value
        else:
            bad("NAMESPACE", "a non-empty string of at most 200 characters")
    return options, problems


# -- the backend --------------------------------------------------------------------------------


class ParallelMcpBackend(BaseTaskBackend):
    """Enqueue ``@task`` functions as parallel_mcp tasks; ``pmcp_worker`` runs them."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        # Lenient here (settings are read at start-up); check() reports, enqueue refuses.
        self.config, self.problems = _config_problems(alias, params)

    # -- configuration ----------------------------------------------------------------------
    def check(self, **kwargs: Any) -> list[checks.CheckMessage]:
        messages = list(super().check(**kwargs))
        if not apps.is_installed("parallel_mcp"):
            messages.append(
                checks.Error(
                    f"TASKS[{self.alias!r}] uses parallel_mcp's backend, but 'parallel_mcp' is "
                    "not in INSTALLED_APPS.",
                    hint="Add 'parallel_mcp' to INSTALLED_APPS and run migrate.",
                    id="parallel_mcp.E101",
                )
            )
        messages.extend(self.problems)
        return messages

    def _require_valid_config(self) -> None:
        errors = [problem for problem in self.problems if problem.is_serious()]
        if errors:
            raise ImproperlyConfigured(
                "; ".join(f"{problem.msg} ({problem.id})" for problem in errors)
            )

    def _orchestrator(self) -> Any:
        from .orchestrator import Orchestrator

        return Orchestrator()

    def validate_task(self, task: Task) -> None:
        super().validate_task(task)
        if not self.queues:
            raise InvalidTask(f"Backend {self.alias!r} has no QUEUES to enqueue to.")
        if task.backend != self.alias:
            raise InvalidTask(
                f"Task {task.module_path} is for backend {task.backend!r}, not {self.alias!r}."
            )

    # -- enqueue ----------------------------------------------------------------------------
    def enqueue(self, task: Task, args: Any, kwargs: Any) -> TaskResult:
        """A run with one task, in the caller's transaction (a rollback leaves nothing)."""
        self.validate_task(task)
        self._require_valid_config()
        path = task_path(task)
        task_id = new_id()
        # The framework's own checks: args and kwargs must be JSON (TypeError otherwise).
        result: TaskResult[..., Any] = TaskResult(
            task=task,
            id=str(task_id),
            status=TaskResultStatus.READY,
            enqueued_at=None,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=list(args),
            kwargs=dict(kwargs),
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        run_after = task.run_after
        if run_after is not None and timezone.is_naive(run_after):
            run_after = timezone.make_aware(run_after)  # USE_TZ = False: the current zone
        spec = {
            "func": path,
            "args": result.args,
            "kwargs": result.kwargs,
            "takes_context": task.takes_context,
            "backend": self.alias,
            "queue_name": task.queue_name,
            "priority": task.priority,
            "run_after": run_after.isoformat() if run_after is not None else None,
        }
        orch = self._orchestrator()
        with orch.transaction():
            run = orch.create_run(
                id=task_id,
                namespace=self.config["NAMESPACE"],
                external_id=path if len(path) <= 200 else None,
                metadata={
                    METADATA_KEY: {
                        "backend": self.alias,
                        "queue_name": task.queue_name,
                        "task": path,
                    }
                },
            )
            row = orch.enqueue_task(
                run_id=run.id,
                id=task_id,
                kind=queue_kind(task.queue_name),
                priority=task.priority,
                max_attempts=self.config["MAX_ATTEMPTS"],
                retry=self.config["RETRY"],
                timeout_ms=self.config["TIMEOUT_MS"],
                input=spec,
                not_before=run_after,
            )
        object.__setattr__(result, "enqueued_at", row.created_at)
        # Like parallel_mcp's own events: listeners hear of it once it is committed.
        transaction.on_commit(
            lambda: send_signal(task_enqueued, type(self), result), using=orch.using
        )
        return result

    # -- results ----------------------------------------------------------------------------
    def get_result(self, result_id: Any) -> TaskResult:
        from .models import Task as TaskRow

        using = self._orchestrator().using
        task_uuid = parse_id(result_id)
        row = None
        if task_uuid is not None:
            row = (
                TaskRow.objects.using(using)
                .filter(pk=task_uuid, kind__startswith=KIND_PREFIX)
                .first()
            )
        if row is None or not isinstance(row.input, dict) or "func" not in row.input:
            raise TaskResultDoesNotExist(result_id)
        return self.result_from_rows(row, attempts_of(using, row.pk))

    def result_from_rows(self, row: Any, attempts: list[Any]) -> TaskResult:
        """The framework's view of a parallel_mcp task and its attempts."""
        spec = row.input
        status = STATUS_MAP[row.status]
        counted = [a for a in attempts if a.status != AttemptStatus.RELEASED]
        errors = [error for error in map(attempt_error, counted) if error is not None]
        if row.status == TaskStatus.CANCELLED:
            reason = cancel_reason(row) or "cancelled"
            errors.append(
                TaskError(
                    exception_class_path=class_path(TaskCancelled),
                    traceback=f"{class_path(TaskCancelled)}: {reason}",
                )
            )
        last = counted[-1] if counted else None
        finished = status in (TaskResultStatus.SUCCESSFUL, TaskResultStatus.FAILED)
        result: TaskResult[..., Any] = TaskResult(
            task=load_task(spec),
            id=str(row.pk),
            status=status,
            enqueued_at=row.created_at,
            started_at=row.started_at,
            finished_at=(row.completed_at or row.updated_at) if finished else None,
            last_attempted_at=(last.started_at or last.leased_at) if last else None,
            args=spec.get("args") or [],
            kwargs=spec.get("kwargs") or {},
            backend=spec.get("backend", self.alias),
            errors=errors,
            worker_ids=[a.worker_id for a in counted],
        )
        if status == TaskResultStatus.SUCCESSFUL:
            object.__setattr__(result, "_return_value", row.output)
        return result


# -- between a Task and its dotted path ---------------------------------------------------------


def task_path(task: Task) -> str:
    """The path a worker imports the task by; refuses a task that cannot be found there."""
    path = task.module_path
    try:
        target = import_string(path)
    except ImportError:
        target = None
    if not isinstance(target, Task) or target.func is not task.func:
        raise InvalidTask(
            f"{path} does not name this task: workers import a task by its dotted path, so "
            "define it at module level with the @task decorator."
        )
    return path


def load_task(spec: dict[str, Any]) -> Task:
    """The Task an enqueued spec names, with the options it was enqueued with."""
    path = spec.get("func")
    try:
        target = import_string(path) if isinstance(path, str) else None
    except ImportError:
        target = None
    if not isinstance(target, Task):
        raise InvalidTask(f"{path!r} does not point to a Task instance.")
    changes: dict[str, Any] = {}
    for name in ("backend", "queue_name", "priority"):
        if spec.get(name) is not None and getattr(target, name) != spec[name]:
            changes[name] = spec[name]
    if spec.get("run_after"):
        changes["run_after"] = datetime.fromisoformat(spec["run_after"])
    return target.using(**changes) if changes else target


def cancel_reason(row: Any) -> str | None:
    """The reason given when the task (or its run) was cancelled: its last task.cancelled
    event says."""
    from .models import Event

    payload = (
        Event.objects.using(row._state.db or "default")
        .filter(run_id=row.run_id, task_id=row.pk, event_type="task.cancelled")
        .order_by("-id")
        .values_list("payload", flat=True)
        .first()
    )
    return payload.get("reason") if isinstance(payload, dict) else None


def attempts_of(using: str, task_id: Any) -> list[Any]:
    from .models import Attempt

    return list(Attempt.objects.using(using).filter(task_id=task_id).order_by("leased_at", "id"))


def attempt_error(attempt: Any) -> Any:
    """The TaskError of a failed or expired attempt (None for the others)."""
    if attempt.status == AttemptStatus.FAILED:
        metadata = attempt.metadata if isinstance(attempt.metadata, dict) else {}
        recorded = metadata.get(METADATA_KEY)
        error = recorded.get("error") if isinstance(recorded, dict) else None
        if isinstance(error, dict) and {"exception_class_path", "traceback"} <= set(error):
            return TaskError(
                exception_class_path=str(error["exception_class_path"]),
                traceback=str(error["traceback"]),
            )
        message = attempt.error or "failed"
        cls = TimeoutError if message.startswith("TimeoutError:") else TaskFailed
        return TaskError(exception_class_path=class_path(cls), traceback=message)
    if attempt.status == AttemptStatus.EXPIRED:
        return TaskError(
            exception_class_path=class_path(LeaseExpired),
            traceback=(
                f"{class_path(LeaseExpired)}: worker {attempt.worker_id} stopped renewing its "
                f"lease, which expired at {attempt.lease_expires_at.isoformat()} (the worker "
                "crashed, was killed or lost the database)."
            ),
        )
    return None


# -- running them: the worker side ----------------------------------------------------------------


def register_queue_handlers(target: Any) -> None:
    """Register :func:`run_django_task` for every queue of every backend in settings.TASKS that
    is a ParallelMcpBackend (called by the worker registry's autodiscover)."""
    configured = getattr(settings, "TASKS", None) or {}
    for alias, config in configured.items():
        if not isinstance(config, dict) or not isinstance(config.get("BACKEND"), str):
            continue
        try:
            backend_class = import_string(config["BACKEND"])
        except ImportError:
            continue  # the framework reports it when the backend is used
        if not (isinstance(backend_class, type) and issubclass(backend_class, ParallelMcpBackend)):
            continue
        backend = task_backends[alias]
        for queue in sorted(backend.queues):
            if isinstance(queue, str) and queue.strip():
                target.register(queue_kind(queue), run_django_task)


def run_django_task(ctx: Any) -> Any:
    """The handler of every ``django.tasks:<queue>`` kind: import the task, call it (with a
    TaskContext when it takes one; coroutines through async_to_sync), and return its result.

    An exception, raised by the task or on the way to calling it, fails the attempt with
    ``retry=True`` (queued again while attempts remain, then dead-lettered), recording the
    exception's class path and traceback. A return value JSON cannot hold fails the task for
    good (``retry=False``): the function did run, and running it again would repeat what it
    did."""
    spec = ctx.input if isinstance(ctx.input, dict) else {}
    backend_class: type = ParallelMcpBackend
    task_result = None
    try:
        backend = task_backends[spec.get("backend") or "default"]
        backend_class = type(backend)
        if not isinstance(backend, ParallelMcpBackend):
            raise InvalidTask(
                f"Backend {spec.get('backend')!r} is not a ParallelMcpBackend in this worker's "
                "settings.TASKS."
            )
        task = load_task(spec)
        task_result = _running_result(backend, ctx, task)
        send_signal(task_started, backend_class, task_result)
        args, kwargs = spec.get("args") or [], spec.get("kwargs") or {}
        if task.takes_context:
            value = task.call(TaskContext(task_result=task_result), *args, **kwargs)
        else:
            value = task.call(*args, **kwargs)
    except BaseException as exc:  # noqa: BLE001 - the task's failure, recorded and retried
        return _failed(exc, task_result, backend_class, retry=True)
    try:
        value = _json_result(value)
    except Exception as exc:  # noqa: BLE001 - an unstorable return value
        return _failed(exc, task_result, backend_class, retry=False)
    from .worker.results import Completed

    _finish(task_result, TaskResultStatus.SUCCESSFUL, return_value=value)
    send_signal(task_finished, backend_class, task_result)
    return Completed(output=value)


def _failed(exc: BaseException, task_result: Any, backend_class: type, *, retry: bool) -> Any:
    from .worker.results import Failed

    error = _task_error(exc)
    if task_result is not None:
        _finish(task_result, TaskResultStatus.FAILED, errors=[error])
        send_signal(task_finished, backend_class, task_result)
    return Failed(
        error=_truncate(f"{type(exc).__name__}: {exc}", MAX_ERROR_CHARS),
        retry=retry,
        metadata={
            METADATA_KEY: {
                "error": {
                    "exception_class_path": error.exception_class_path,
                    "traceback": _truncate(error.traceback, MAX_TRACEBACK_CHARS),
                }
            }
        },
    )


def _running_result(backend: ParallelMcpBackend, ctx: Any, task: Task) -> TaskResult:
    """The TaskResult a running task sees (``context.task_result``): read back from the
    database, so ``attempt``, ``worker_ids`` and earlier ``errors`` are exact. A worker without
    database access (``pmcp_worker --api``) builds it from its claim instead: earlier errors
    are then missing and earlier attempts carry this worker's id."""
    from .orchestrator import Orchestrator

    if isinstance(ctx.orchestrator, Orchestrator):
        from .models import Task as TaskRow

        using = ctx.orchestrator.using
        row = TaskRow.objects.using(using).get(pk=ctx.task.id)
        result = backend.result_from_rows(row, attempts_of(using, row.pk))
        object.__setattr__(result, "status", TaskResultStatus.RUNNING)
        return result
    now = timezone.now()
    spec = ctx.task.input
    return TaskResult(
        task=task,
        id=str(ctx.task.id),
        status=TaskResultStatus.RUNNING,
        enqueued_at=ctx.task.created_at,
        started_at=ctx.task.started_at or now,
        finished_at=None,
        last_attempted_at=now,
        args=spec.get("args") or [],
        kwargs=spec.get("kwargs") or {},
        backend=backend.alias,
        errors=[],
        worker_ids=[ctx.worker_id] * max(1, ctx.task.attempt_count or 1),
    )


def _json_result(value: Any) -> Any:
    """The return value as stored: the framework's JSON normalisation (TypeError for what JSON
    cannot hold), then parallel_mcp's checks (NaN, size)."""
    from .contract.validation import json_value

    value = normalize_json(value)
    json_value(value, "the task's return value")
    return json.loads(json.dumps(value))  # keys as JSON has them (1 -> "1")


def _finish(
    result: TaskResult, status: Any, *, errors: Iterable[Any] = (), return_value: Any = None
) -> None:
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", timezone.now())
    result.errors.extend(errors)
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", return_value)


def _task_error(exc: BaseException) -> Any:
    return TaskError(exception_class_path=class_path(type(exc)), traceback=_format(exc))


def _format(exc: BaseException) -> str:
    return "".join(traceback.format_exception(exc))


def _truncate(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    half = (limit - 40) // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half} characters cut ...]\n{text[-half:]}"


def send_signal(signal: Any, sender: type, task_result: TaskResult) -> None:
    """Send one of the framework's signals; a listener's exception is logged, never raised."""
    for receiver, response in signal.send_robust(sender=sender, task_result=task_result):
        if isinstance(response, Exception):
            logger.error(
                "task %s: signal receiver %r raised",
                task_result.id,
                receiver,
                exc_info=response,
            )


# -- system checks when the framework's own do not run ----------------------------------------


@checks.register(checks.Tags.compatibility)
def check_task_backends(app_configs: Any = None, **kwargs: Any) -> list[Any]:
    """The backport checks task backends only when ``django_tasks`` is in INSTALLED_APPS;
    without it, report this backend's problems here (once either way)."""
    registered = check_registry.get_checks(include_deployment_checks=True)
    if any(
        getattr(check, "__module__", "") in ("django.tasks.checks", "django_tasks.checks")
        for check in registered
    ):
        return []
    messages: list[Any] = []
    for alias, config in (getattr(settings, "TASKS", None) or {}).items():
        if isinstance(config, dict) and isinstance(config.get("BACKEND"), str):
            try:
                backend_class = import_string(config["BACKEND"])
            except ImportError:
                continue
            if isinstance(backend_class, type) and issubclass(backend_class, ParallelMcpBackend):
                messages.extend(task_backends[alias].check())
    return messages

"""The Tasks framework: ``django.tasks`` (Django 6+) or the ``django-tasks`` backport (Django
5.2), chosen once, at import. Everything parallel_mcp uses of the framework comes from here.

The two spell one exception differently: ``InvalidTask`` (Django) and ``InvalidTaskError``
(backport); ``InvalidTask`` below is whichever the running framework raises.

Type checkers see Django's own framework (django-stubs describes it whatever Django is
installed), never the backport branch: the backport is the package ``django.tasks`` was merged
from, with the same classes and signatures, and parallel_mcp uses only what the two share. The
test suite's Django 5.2 and Django 6 legs run the backend on each.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

try:  # Django 6.0 and later
    from django.tasks import signals as _signals
    from django.tasks import task_backends
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.base import (
        TASK_MAX_PRIORITY,
        TASK_MIN_PRIORITY,
        Task,
        TaskContext,
        TaskError,
        TaskResult,
        TaskResultStatus,
    )
    from django.tasks.exceptions import InvalidTask, TaskResultDoesNotExist
    from django.utils.json import normalize_json

    FRAMEWORK = "django.tasks"
except ImportError:
    if not TYPE_CHECKING:  # typed as Django's framework (see the module's docstring)
        try:  # Django 5.2 with the backport
            from django_tasks import signals as _signals
            from django_tasks import task_backends
            from django_tasks.backends.base import BaseTaskBackend
            from django_tasks.base import (
                TASK_MAX_PRIORITY,
                TASK_MIN_PRIORITY,
                Task,
                TaskContext,
                TaskError,
                TaskResult,
                TaskResultStatus,
            )
            from django_tasks.exceptions import InvalidTaskError as InvalidTask
            from django_tasks.exceptions import TaskResultDoesNotExist
            from django_tasks.utils import normalize_json
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError(
                "parallel_mcp's task backend needs Django's Tasks framework: Django 6.0 or "
                "later, or on Django 5.2 the backport (pip install 'django-tasks>=0.12')."
            ) from exc

    FRAMEWORK = "django_tasks"

task_enqueued = _signals.task_enqueued
task_started = _signals.task_started
task_finished = _signals.task_finished

__all__ = [
    "FRAMEWORK",
    "TASK_MAX_PRIORITY",
    "TASK_MIN_PRIORITY",
    "BaseTaskBackend",
    "InvalidTask",
    "Task",
    "TaskContext",
    "TaskError",
    "TaskResult",
    "TaskResultDoesNotExist",
    "TaskResultStatus",
    "normalize_json",
    "task_backends",
    "task_enqueued",
    "task_finished",
    "task_started",
]

"""``@task`` functions for the django.tasks backend tests (tests/test_tasks_backend*.py).

Importing this module needs ``settings.TASKS`` from tests/tasks_settings.py: the decorator
validates each task against its backend at once.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from parallel_mcp.tasks_compat import TaskResultStatus

try:
    from django.tasks import task
except ImportError:  # Django 5.2: the backport
    from django_tasks import task


class Boom(Exception):
    """What the failing tasks raise."""


def _mark(marker: str | None, line: str) -> None:
    if marker:
        with Path(marker).open("a") as out:
            out.write(f"{line}\n")


@task()
def add(a: int, b: int, marker: str | None = None) -> int:
    _mark(marker, f"add {a} {b} pid={os.getpid()}")
    return a + b


@task()
def record(name: str, marker: str) -> str:
    """Appends ``name`` to the marker file: the order tasks ran in."""
    _mark(marker, name)
    return name


@task(queue_name="emails")
def send_email(to: str) -> dict:
    return {"sent": to}


@task()
def always_fails(message: str) -> None:
    raise Boom(message)


@task(backend="once")
def fails_once_only(message: str) -> None:
    raise Boom(message)


@task(takes_context=True)
def flaky(context, succeed_on: int = 2) -> dict:
    """Raises until attempt ``succeed_on``."""
    if context.attempt < succeed_on:
        raise ConnectionError(f"transient failure on attempt {context.attempt}")
    return {"attempt": context.attempt}


@task(takes_context=True)
def introspect(context, label: str) -> dict:
    result = context.task_result
    return {
        "label": label,
        "id": result.id,
        "attempt": context.attempt,
        "status": str(result.status),
        "running": result.status == TaskResultStatus.RUNNING,
        "args": result.args,
        "kwargs": result.kwargs,
        "worker_ids": result.worker_ids,
        "backend": result.backend,
        "queue_name": result.task.queue_name,
        "priority": result.task.priority,
        "name": result.task.name,
        "started": result.started_at is not None,
    }


@task()
async def async_multiply(a: int, b: int) -> int:
    await asyncio.sleep(0.01)
    return a * b


@task()
def returns_a_set() -> object:
    return {1, 2}


@task(backend="defaults")
def with_defaults() -> str:
    return "ok"


def undecorated(x: int) -> int:
    """Module level but not a Task: ``Task(func=undecorated)`` cannot be found by its path."""
    return x

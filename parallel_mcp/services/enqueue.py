"""Adding tasks to a run."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime
from typing import Any
from uuid import UUID

from ..exceptions import (
    DuplicateTaskKeyError,
    InvalidDependencyError,
    RunTerminalError,
    ValidationError,
)
from ..ids import new_id, parse_id
from ..models import ContextSnapshot, Run, Task, TaskDependency
from ..models.tasks import PRIORITY_MAX, PRIORITY_MIN
from ..states import TERMINAL_RUN_STATUSES, TaskStatus
from . import validation as v
from .dag import is_blocking
from .write import Write, write

RETRY_KEYS = {"delay_ms", "backoff", "max_delay_ms"}


def parse_retry(retry: Any) -> tuple[int | None, str | None, int | None]:
    if retry is None:
        return None, None, None
    if not isinstance(retry, dict):
        raise ValidationError(
            "retry must be a dict with delay_ms, backoff, max_delay_ms.", field="retry"
        )
    unknown = set(retry) - RETRY_KEYS
    if unknown:
        raise ValidationError(
            f"retry has unknown keys: {', '.join(sorted(map(str, unknown)))}; "
            f"allowed: {', '.join(sorted(RETRY_KEYS))}.",
            field="retry",
        )
    delay = v.integer(retry.get("delay_ms"), "retry.delay_ms", minimum=0, allow_none=True)
    backoff = retry.get("backoff")
    if backoff is not None and backoff not in ("fixed", "exponential"):
        raise ValidationError(
            f"retry.backoff must be 'fixed' or 'exponential', got {backoff!r}.",
            field="retry.backoff",
        )
    max_delay = v.integer(
        retry.get("max_delay_ms"), "retry.max_delay_ms", minimum=0, allow_none=True
    )
    return delay, backoff, max_delay


def parse_depends_on(depends_on: Any) -> list[tuple[UUID, bool]]:
    """``depends_on`` as (task id, required) pairs; duplicates are an error."""
    if depends_on is None:
        return []
    if isinstance(depends_on, (str, bytes, dict)) or not isinstance(depends_on, Iterable):
        raise ValidationError("depends_on must be a list of task ids.", field="depends_on")
    parsed: list[tuple[UUID, bool]] = []
    seen: set[UUID] = set()
    for entry in depends_on:
        required = True
        raw = entry
        if isinstance(entry, dict):
            raw = entry.get("task_id")
            required = entry.get("required", True)
            if not isinstance(required, bool):
                raise ValidationError(
                    "depends_on[].required must be true or false.", field="depends_on"
                )
        task_id = parse_id(raw)
        if task_id is None:
            raise InvalidDependencyError(
                f"depends_on entry {raw!r} is not a task id.", dependency=raw
            )
        if task_id in seen:
            raise InvalidDependencyError(
                f"Task {task_id} is listed twice in depends_on.", dependency=task_id
            )
        seen.add(task_id)
        parsed.append((task_id, required))
    return parsed


def enqueue_task(
    *,
    using: str,
    run_id: Any,
    kind: str,
    key: str | None = None,
    priority: int = 0,
    max_attempts: int | None = None,
    retry: Any = None,
    timeout_ms: int | None = None,
    input: Any = None,
    metadata: Any = None,
    depends_on: Any = (),
    not_before: datetime | None = None,
    context_snapshot_id: Any = None,
    id: Any = None,
    now: datetime | None = None,
) -> Task:
    now = v.resolve_now(now)
    run_uuid = v.require_id(run_id, "run_id")
    spec = _task_spec(
        kind=kind,
        key=key,
        priority=priority,
        max_attempts=max_attempts,
        retry=retry,
        timeout_ms=timeout_ms,
        input=input,
        metadata=metadata,
        not_before=not_before,
        context_snapshot_id=context_snapshot_id,
        id=id,
    )
    dependencies = parse_depends_on(depends_on)
    with write(using=using, now=now) as w:
        run = w.lock_run(run_uuid)
        return insert_task(w, run, spec, dependencies)


def _task_spec(
    *,
    kind: Any,
    key: Any,
    priority: Any,
    max_attempts: Any,
    retry: Any,
    timeout_ms: Any,
    input: Any,
    metadata: Any,
    not_before: Any,
    context_snapshot_id: Any,
    id: Any,
) -> dict[str, Any]:
    delay, backoff, max_delay = parse_retry(retry)
    return {
        "id": v.optional_id(id, "id"),
        "kind": v.text(kind, "kind"),
        "key": v.text(key, "key", allow_none=True),
        "priority": v.integer(priority, "priority", minimum=PRIORITY_MIN, maximum=PRIORITY_MAX),
        "max_attempts": v.integer(
            max_attempts, "max_attempts", minimum=1, maximum=1_000_000, allow_none=True
        ),
        "retry_delay_ms": delay,
        "retry_backoff": backoff,
        "retry_max_delay_ms": max_delay,
        "timeout_ms": None if timeout_ms is None else v.positive_ms(timeout_ms, "timeout_ms"),
        "input": v.json_value(input, "input"),
        "metadata": v.json_value(metadata, "metadata"),
        "not_before": v.optional_datetime(not_before, "not_before"),
        "context_snapshot_id": v.optional_id(context_snapshot_id, "context_snapshot_id"),
    }


def insert_task(
    w: Write, run: Run, spec: dict[str, Any], dependencies: list[tuple[UUID, bool]]
) -> Task:
    using = w.using
    if run.status in TERMINAL_RUN_STATUSES:
        raise RunTerminalError(
            f"Run {run.pk} is {run.status}; no task can be added to it.",
            run_id=run.pk,
            status=run.status,
        )
    task_id = spec["id"] or new_id()
    if spec["id"] is not None and Task.objects.using(using).filter(pk=task_id).exists():
        raise ValidationError(f"A task with id {task_id} already exists.", task_id=task_id)
    if (
        spec["key"] is not None
        and Task.objects.using(using).filter(run_id=run.pk, key=spec["key"]).exists()
    ):
        raise DuplicateTaskKeyError(
            f"Run {run.pk} already has a task with key {spec['key']!r}.",
            run_id=run.pk,
            key=spec["key"],
        )
    snapshot_id = spec["context_snapshot_id"]
    if snapshot_id is None:
        snapshot_id = run.current_context_snapshot_id
    elif not ContextSnapshot.objects.using(using).filter(pk=snapshot_id, run_id=run.pk).exists():
        raise ValidationError(
            f"Context snapshot {snapshot_id} does not exist in run {run.pk}.",
            field="context_snapshot_id",
        )

    unmet = failed = 0
    if dependencies:
        upstream = {
            row["id"]: row
            for row in Task.objects.using(using)
            .filter(pk__in=[dep_id for dep_id, _ in dependencies])
            .values("id", "run_id", "status", "failed_dependencies")
        }
        for dep_id, required in dependencies:
            row = upstream.get(dep_id)
            if row is None:
                raise InvalidDependencyError(
                    f"Dependency {dep_id} does not exist.", dependency=dep_id
                )
            if row["run_id"] != run.pk:
                raise InvalidDependencyError(
                    f"Dependency {dep_id} belongs to run {row['run_id']}, not {run.pk}.",
                    dependency=dep_id,
                )
            unmet += _unmet(row["status"], required)
            if is_blocking(row["status"], row["failed_dependencies"], required=required):
                failed += 1

    task = Task(
        id=task_id,
        run_id=run.pk,
        key=spec["key"],
        kind=spec["kind"],
        status=TaskStatus.QUEUED,
        priority=spec["priority"],
        max_attempts=spec["max_attempts"],
        retry_delay_ms=spec["retry_delay_ms"],
        retry_backoff=spec["retry_backoff"],
        retry_max_delay_ms=spec["retry_max_delay_ms"],
        timeout_ms=spec["timeout_ms"],
        not_before=spec["not_before"],
        input=spec["input"],
        metadata=spec["metadata"],
        context_snapshot_id=snapshot_id,
        unmet_dependencies=unmet,
        failed_dependencies=failed,
        created_at=w.now,
        updated_at=w.now,
    )
    task.save(using=using, force_insert=True)
    if dependencies:
        TaskDependency.objects.using(using).bulk_create(
            [
                TaskDependency(
                    run_id=run.pk, task_id=task.pk, depends_on_id=dep_id, required=required
                )
                for dep_id, required in dependencies
            ]
        )
    task._depends_on_cache = [dep_id for dep_id, _ in dependencies]
    w.count(run.pk, total=1, **{"stuck" if failed else "active": 1})
    if not unmet and not failed:
        w.ready()
    w.event(
        "task.enqueued",
        run_id=run.pk,
        task_id=task.pk,
        payload={
            "kind": task.kind,
            "key": task.key,
            "priority": task.priority,
            "depends_on": [str(dep_id) for dep_id, _ in dependencies],
            "not_before": task.not_before.isoformat() if task.not_before else None,
        },
    )
    return task


def _unmet(status: str, required: bool) -> int:
    """1 when a dependency in ``status`` does not yet let its dependent run."""
    if required:
        return 0 if status == TaskStatus.COMPLETED else 1
    return 0 if status in (TaskStatus.COMPLETED, TaskStatus.FAILED, TaskStatus.CANCELLED) else 1

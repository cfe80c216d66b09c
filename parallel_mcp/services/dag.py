"""Keeping dependents' readiness current without scanning the run.

Each task counts ``unmet_dependencies`` (dependencies that do not yet let it run) and
``failed_dependencies`` (dependencies that mean it can never run). A required dependency is
met by ``completed``; an optional one by any terminal state. A dependency *blocks* its
dependent when it is required and failed or cancelled, or when it is itself *stuck* (queued
with ``failed_dependencies > 0``: it will never reach a terminal state).

A stuck task counts toward the run's ``stuck`` counter instead of ``active``, so a run whose
remaining work can never run derives ``failed`` (bug 3 of the original). Changes propagate to
dependents transitively, touching only the affected tasks.
"""

from __future__ import annotations

from collections import Counter
from uuid import UUID

from django.db.models import F

from ..models import Task, TaskDependency
from ..states import TaskStatus
from .write import Write


def is_stuck(status: str, failed_dependencies: int) -> bool:
    return status == TaskStatus.QUEUED and failed_dependencies > 0


def is_blocking(status: str, failed_dependencies: int, *, required: bool = True) -> bool:
    """Whether a dependency in this state prevents a dependent from ever running."""
    if is_stuck(status, failed_dependencies):
        return True
    return required and status in (TaskStatus.FAILED, TaskStatus.CANCELLED)


def task_finished(w: Write, run_id: UUID, task_id: UUID, status: str) -> None:
    """``task_id`` reached a terminal ``status``: update its dependents."""
    edges = TaskDependency.objects.using(w.using).filter(depends_on_id=task_id)
    if status == TaskStatus.COMPLETED:
        satisfied = edges
    else:
        satisfied = edges.filter(required=False)
    if (
        Task.objects.using(w.using)
        .filter(pk__in=satisfied.values("task_id"))
        .update(unmet_dependencies=F("unmet_dependencies") - 1)
    ):
        w.ready()
    if status != TaskStatus.COMPLETED:
        propagate_blocking(w, run_id, [task_id], blocking=True, required_only=True)


def propagate_blocking(
    w: Write, run_id: UUID, task_ids: list[UUID], *, blocking: bool, required_only: bool
) -> None:
    """``task_ids`` started (``blocking=True``) or stopped blocking their dependents.

    ``required_only``: the change concerns failure/cancellation (blocks required edges only)
    rather than being stuck (blocks every edge).
    """
    delta = 1 if blocking else -1
    frontier = list(task_ids)
    while frontier:
        edge_rows = TaskDependency.objects.using(w.using).filter(depends_on_id__in=frontier)
        if required_only:
            edge_rows = edge_rows.filter(required=True)
        edges = Counter(edge_rows.values_list("task_id", flat=True))
        if not edges:
            return
        dependents = {
            row["id"]: row
            for row in Task.objects.using(w.using)
            .filter(pk__in=list(edges))
            .values("id", "status", "failed_dependencies")
        }
        by_increment: dict[int, list[UUID]] = {}
        frontier = []
        for dependent_id, multiplicity in edges.items():
            row = dependents[dependent_id]
            before = row["failed_dependencies"]
            after = before + delta * multiplicity
            by_increment.setdefault(delta * multiplicity, []).append(dependent_id)
            if is_stuck(row["status"], before) != is_stuck(row["status"], after):
                if blocking:
                    w.move(run_id, "active", "stuck")
                else:
                    w.move(run_id, "stuck", "active")
                    w.ready()
                frontier.append(dependent_id)
        for increment, ids in by_increment.items():
            Task.objects.using(w.using).filter(pk__in=ids).update(
                failed_dependencies=F("failed_dependencies") + increment
            )
        # Stuck tasks block every dependent edge, optional ones included.
        required_only = False


def task_reopened(w: Write, run_id: UUID, task_id: UUID, previous_status: str) -> None:
    """``task_id`` left terminal ``previous_status`` for ``queued``: undo ``task_finished``."""
    edges = TaskDependency.objects.using(w.using).filter(depends_on_id=task_id)
    if previous_status == TaskStatus.COMPLETED:
        reopened = edges
    else:
        reopened = edges.filter(required=False)
    Task.objects.using(w.using).filter(pk__in=reopened.values("task_id")).update(
        unmet_dependencies=F("unmet_dependencies") + 1
    )
    if previous_status != TaskStatus.COMPLETED:
        propagate_blocking(w, run_id, [task_id], blocking=False, required_only=True)

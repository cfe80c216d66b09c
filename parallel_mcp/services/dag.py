"""Keeping dependents' readiness current without scanning the run: per task, counts of unmet
and failed dependency edges (docs/internals.md, "Dependency counters")."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from functools import cache
from uuid import UUID

from ..exceptions import InvalidDependencyError
from ..models import Task, TaskDependency
from ..states import TERMINAL_TASK_STATUSES, TaskStatus, bucket_of
from .write import Write

State = tuple[str, int]  # (status, failed_dependencies)


def is_stuck(status: str, failed_dependencies: int) -> bool:
    return status == TaskStatus.QUEUED and failed_dependencies > 0


def bucket(state: State) -> str:
    """The run counter a task in ``state`` counts toward (``TaskCounts``)."""
    return bucket_of(state[0], stuck=is_stuck(*state))


@cache  # pure, and called once per edge of a batch enqueue
def edge_counts(state: State, *, required: bool) -> tuple[int, int]:
    """What one edge from a dependency in ``state`` adds to (unmet, failed) of its dependent."""
    status, failed = state
    satisfied = status == TaskStatus.COMPLETED or (
        not required and status in TERMINAL_TASK_STATUSES
    )
    # Whether the dependency prevents the dependent from ever running.
    blocking = is_stuck(status, failed) or (
        required and status in (TaskStatus.FAILED, TaskStatus.CANCELLED)
    )
    return (0 if satisfied else 1, 1 if blocking else 0)


def states_in_run(using: str, run_id: UUID, ids: Sequence[UUID], *, noun: str) -> dict[UUID, State]:
    """The state of each task of ``ids``, checked in their order: a dependency or a blocker
    (``noun``) must be a task of the run ``run_id``."""
    found = {
        row[0]: row[1:]
        for row in Task.objects.using(using)
        .filter(pk__in=ids)
        .values_list("id", "run_id", "status", "failed_dependencies")
    }
    states: dict[UUID, State] = {}
    for task_id in ids:
        if task_id not in found:
            raise InvalidDependencyError(f"{noun} {task_id} does not exist.", dependency=task_id)
        owner, status, failed = found[task_id]
        if owner != run_id:
            raise InvalidDependencyError(
                f"{noun} {task_id} belongs to run {owner}, not {run_id}.", dependency=task_id
            )
        states[task_id] = (status, failed)
    return states


def status_changed(w: Write, task: Task, previous: str) -> None:
    """``task`` moved from ``previous`` to its status now: its run is touched, its counters
    move from the old bucket to the new, and its dependents follow."""
    failed = task.failed_dependencies
    before, after = (str(previous), failed), (str(task.status), failed)
    w.touch(task.run_id)
    w.move(task.run_id, bucket(before), bucket(after))
    dependency_changed(w, task.run_id, task.pk, before, after)


def dependency_changed(w: Write, run_id: UUID, task_id: UUID, before: State, after: State) -> None:
    """``task_id`` moved from ``before`` to ``after``: update its dependents, transitively."""
    changes = [(task_id, before, after)]
    while changes:
        deltas: dict[tuple[UUID, bool], tuple[int, int]] = {}
        for changed_id, old, new in changes:
            for required in (True, False):
                old_unmet, old_failed = edge_counts(old, required=required)
                new_unmet, new_failed = edge_counts(new, required=required)
                if (new_unmet, new_failed) != (old_unmet, old_failed):
                    deltas[(changed_id, required)] = (
                        new_unmet - old_unmet,
                        new_failed - old_failed,
                    )
        if not deltas:
            return
        if all(failed_delta == 0 for _, failed_delta in deltas.values()):
            _shift_unmet(w, run_id, deltas)  # no dependent can change its blocking state
            return
        edges = (
            TaskDependency.objects.using(w.using)
            .filter(depends_on_id__in={changed_id for changed_id, _ in deltas})
            .values_list(
                "task_id",
                "depends_on_id",
                "required",
                "task__status",
                "task__failed_dependencies",
                "task__unmet_dependencies",
            )
        )
        per_dependent: dict[UUID, list[int]] = defaultdict(lambda: [0, 0])
        rows: dict[UUID, tuple[str, int, int]] = {}
        for dependent_id, upstream_id, required, status, failed, unmet in edges:
            delta = deltas.get((upstream_id, required))
            if delta:
                per_dependent[dependent_id][0] += delta[0]
                per_dependent[dependent_id][1] += delta[1]
                rows[dependent_id] = (status, failed, unmet)
        changes = _apply(w, run_id, per_dependent, rows)


def _shift_unmet(w: Write, run_id: UUID, deltas: dict[tuple[UUID, bool], tuple[int, int]]) -> None:
    """The common case (a completion): one UPDATE of the dependents' unmet counts."""
    by_delta: dict[int, list[tuple[UUID, bool]]] = defaultdict(list)
    for edge_kind, (unmet_delta, _) in deltas.items():
        by_delta[unmet_delta].append(edge_kind)
    for unmet_delta, edge_kinds in by_delta.items():
        edges, params = [], []
        for upstream_id, required in edge_kinds:
            edges.append("(depends_on_id = %s AND required = %s)")
            params += [w.d.uuid(upstream_id), required]
        moved = w.db.send(
            "UPDATE pmcp_task SET unmet_dependencies = unmet_dependencies + %s WHERE id IN "
            f"(SELECT task_id FROM pmcp_task_dependency WHERE {' OR '.join(edges)}) RETURNING id",
            [unmet_delta, *params],
        ).fetchall()
        if moved and unmet_delta < 0:
            w.ready(run_id)


def _apply(
    w: Write,
    run_id: UUID,
    per_dependent: dict[UUID, list[int]],
    rows: dict[UUID, tuple[str, int, int]],
) -> list[tuple[UUID, State, State]]:
    """Write the counter deltas; return the dependents whose own blocking state changed."""
    by_delta: dict[tuple[int, int], list[UUID]] = defaultdict(list)
    next_changes = []
    for dependent_id, (unmet_delta, failed_delta) in per_dependent.items():
        if not (unmet_delta or failed_delta):
            continue
        status, failed, unmet = rows[dependent_id]
        by_delta[(unmet_delta, failed_delta)].append(dependent_id)
        old: State = (status, failed)
        new: State = (status, failed + failed_delta)
        if is_stuck(*old) != is_stuck(*new):
            w.move(run_id, bucket(old), bucket(new))
            next_changes.append((dependent_id, old, new))
        if unmet_delta < 0 and unmet + unmet_delta == 0:
            w.ready(run_id)
    for (unmet_delta, failed_delta), ids in by_delta.items():
        in_sql, in_params = w.d.uuids(ids)
        w.db.send(
            "UPDATE pmcp_task SET unmet_dependencies = unmet_dependencies + %s, "
            f"failed_dependencies = failed_dependencies + %s WHERE id {in_sql}",
            [unmet_delta, failed_delta, *in_params],
        )
    return next_changes


def release_dependents(w: Write, task_ids: list[UUID]) -> None:
    """``task_ids`` completed: every edge to them (required or optional) is satisfied, so each
    dependent has one unmet edge less per completed dependency. A completion changes no
    dependent's blocking state, so this is one statement, sent with the write's flush; on
    PostgreSQL it also wakes idle workers when some dependent moved."""
    d = w.d
    if len(task_ids) == 1:
        update = (
            "UPDATE pmcp_task SET unmet_dependencies = unmet_dependencies - 1 WHERE id IN "
            "(SELECT task_id FROM pmcp_task_dependency WHERE depends_on_id = %s)"
        )
        params = [d.uuid(task_ids[0])]
    else:
        in_sql, in_params = d.uuids(task_ids)
        update = (
            "UPDATE pmcp_task SET unmet_dependencies = unmet_dependencies - "
            "(SELECT COUNT(*) FROM pmcp_task_dependency e WHERE e.task_id = pmcp_task.id "
            f"AND e.depends_on_id {in_sql}) WHERE id IN "
            f"(SELECT task_id FROM pmcp_task_dependency WHERE depends_on_id {in_sql})"
        )
        params = [*in_params, *in_params]
    w.defer(update, params, wakes=True)

"""Bounded reads for the admin pages. Nothing here writes; every query is limited and served
by an index (mostly ``run_id`` or a primary key), so a page costs the same whatever the size of
the tables."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from django.db import connections

from ..conf import app_settings
from ..models import ContextSnapshot, Event, InputRequest, Run, Task, TaskDependency, ToolCall
from ..services.tool_calls import TOOL_CALL_NAMESPACE
from ..states import TERMINAL_TASK_STATUSES

# The graph is drawn for runs of up to this many tasks (and dependency edges).
GRAPH_MAX_TASKS = 500
GRAPH_MAX_EDGES = 5_000
# Rows shown on a detail page before "see all" links take over.
RUN_TASKS_PREVIEW = 100
LATEST_EVENTS = 20
SNAPSHOT_WINDOW = 100  # a run's most recent snapshots read to walk the chain
SNAPSHOT_CHAIN_MAX = 25
DEPENDENCY_PREVIEW = 50
CASCADE_SCAN_MAX = 1_000
INPUT_REQUESTS_SHOWN = 100  # a tool call's input requests on its run's page

TASK_LIST_FIELDS = (
    "id",
    "run_id",
    "key",
    "kind",
    "status",
    "priority",
    "attempt_count",
    "max_attempts",
    "progress",
    "dead",
    "failed_dependencies",
    "unmet_dependencies",
    "leased_by",
    "lease_expires_at",
    "not_before",
    "error",
    "updated_at",
    "created_at",
)


def alias() -> str:
    return app_settings.DATABASE_ALIAS


def tool_call(run: Run) -> ToolCall | None:
    """The MCP tool call that created ``run`` (with its tool's task), or None; runs of other
    namespaces cost no query."""
    if run.namespace != TOOL_CALL_NAMESPACE:
        return None
    return ToolCall.objects.using(alias()).select_related("task").filter(pk=run.pk).first()


def input_requests(run_id: Any) -> list[InputRequest]:
    """The first INPUT_REQUESTS_SHOWN (+1, to tell that there are more) input requests of a
    run, oldest first, with the status, key and kind of the task that asked."""
    return list(
        InputRequest.objects.using(alias())
        .filter(run_id=run_id)
        .select_related("task")
        .only(
            "id",
            "run_id",
            "task_id",
            "key",
            "request",
            "requested_at",
            "response",
            "answered_at",
            "answered_by",
            "task__id",
            "task__key",
            "task__kind",
            "task__status",
        )
        .order_by("requested_at", "key")[: INPUT_REQUESTS_SHOWN + 1]
    )


def namespaces(limit: int) -> list[str]:
    """The first ``limit`` namespaces in use, in order, by a "loose index scan": one index
    lookup per namespace (``pmcp_run_ns_updated_idx``), however many runs there are."""
    connection = connections[alias()]
    table = connection.ops.quote_name(Run._meta.db_table)
    sql = (
        "WITH RECURSIVE ns(name, n) AS ("
        f" SELECT MIN(namespace), 1 FROM {table}"
        " UNION ALL"
        f" SELECT (SELECT MIN(namespace) FROM {table} WHERE namespace > ns.name), ns.n + 1"
        " FROM ns WHERE ns.name IS NOT NULL AND ns.n < %s"
        ") SELECT name FROM ns WHERE name IS NOT NULL ORDER BY name"
    )
    with connection.cursor() as cursor:
        cursor.execute(sql, [int(limit)])
        return [row[0] for row in cursor.fetchall()]


@dataclass
class SnapshotChain:
    current: ContextSnapshot | None
    # The current snapshot, its parent, its parent's parent... (newest first).
    chain: list[ContextSnapshot] = field(default_factory=list)
    truncated: bool = False  # the chain goes on beyond what is shown
    total: int = 0  # snapshots of the run read (at most SNAPSHOT_WINDOW)


def snapshot_chain(run: Run) -> SnapshotChain:
    """The run's current snapshot and its ancestors, from one bounded read of the run's most
    recent snapshots (``pmcp_snapshot_run_idx``)."""
    if run.current_context_snapshot_id is None:
        return SnapshotChain(current=None)
    recent = list(
        ContextSnapshot.objects.using(alias())
        .filter(run_id=run.pk)
        .order_by("-created_at", "-id")[:SNAPSHOT_WINDOW]
    )
    by_id = {snapshot.pk: snapshot for snapshot in recent}
    current = by_id.get(run.current_context_snapshot_id)
    if current is None:  # older than the window (a run whose snapshots are mostly task-scope)
        current = (
            ContextSnapshot.objects.using(alias())
            .filter(pk=run.current_context_snapshot_id)
            .first()
        )
        if current is None:
            return SnapshotChain(current=None)
        by_id[current.pk] = current
    chain: list[ContextSnapshot] = []
    node: ContextSnapshot | None = current
    truncated = False
    while node is not None:
        if len(chain) >= SNAPSHOT_CHAIN_MAX:
            truncated = True
            break
        chain.append(node)
        parent_id = node.parent_snapshot_id
        if parent_id is None:
            break
        node = by_id.get(parent_id)
        if node is None:
            truncated = True
    return SnapshotChain(current=current, chain=chain, truncated=truncated, total=len(recent))


def snapshot_ancestors(snapshot: ContextSnapshot) -> tuple[list[ContextSnapshot], bool]:
    """A snapshot's parent chain (oldest last), one query per hop, at most SNAPSHOT_CHAIN_MAX."""
    chain: list[ContextSnapshot] = []
    parent_id = snapshot.parent_snapshot_id
    while parent_id is not None and len(chain) < SNAPSHOT_CHAIN_MAX:
        parent = ContextSnapshot.objects.using(alias()).filter(pk=parent_id).first()
        if parent is None:
            break
        chain.append(parent)
        parent_id = parent.parent_snapshot_id
    return chain, parent_id is not None


@dataclass
class GraphData:
    tasks: list[Task]
    edges: list[tuple[Any, Any, bool]]  # (dependency id, dependent id, required)
    skipped: str | None = None  # why there is no graph


def graph_data(run: Run) -> GraphData:
    """The run's tasks and dependency edges, or the reason the graph is not drawn (too big).

    The task counter on the run decides before anything is read."""
    if run.tasks_total > GRAPH_MAX_TASKS:
        return GraphData(
            tasks=[],
            edges=[],
            skipped=(
                f"This run has {run.tasks_total:,} tasks; the graph is drawn for runs of up to "
                f"{GRAPH_MAX_TASKS:,} tasks."
            ),
        )
    tasks = list(
        Task.objects.using(alias())
        .filter(run_id=run.pk)
        .only(*TASK_LIST_FIELDS)
        .order_by("created_at", "id")[: GRAPH_MAX_TASKS + 1]
    )
    edges = list(
        TaskDependency.objects.using(alias())
        .filter(run_id=run.pk)
        .order_by("id")
        .values_list("depends_on_id", "task_id", "required")[: GRAPH_MAX_EDGES + 1]
    )
    if len(tasks) > GRAPH_MAX_TASKS or len(edges) > GRAPH_MAX_EDGES:
        return GraphData(
            tasks=tasks[:RUN_TASKS_PREVIEW],
            edges=[],
            skipped=(
                f"This run has more than {GRAPH_MAX_TASKS:,} tasks or {GRAPH_MAX_EDGES:,} "
                "dependencies; the graph is not drawn."
            ),
        )
    return GraphData(tasks=tasks, edges=edges)


def run_tasks_preview(run: Run, *, limit: int = RUN_TASKS_PREVIEW) -> list[Task]:
    return list(
        Task.objects.using(alias())
        .filter(run_id=run.pk)
        .only(*TASK_LIST_FIELDS)
        .order_by("created_at", "id")[:limit]
    )


def latest_events(*, run_id: Any = None, task_id: Any = None, limit: int = LATEST_EVENTS):
    """The newest events of a run or of a task (``pmcp_event_run_idx``/``pmcp_event_task_idx``),
    newest first."""
    qs = Event.objects.using(alias())
    if run_id is not None:
        qs = qs.filter(run_id=run_id)
    if task_id is not None:
        qs = qs.filter(task_id=task_id)
    return list(qs.order_by("-id")[:limit])


@dataclass
class Dependencies:
    upstream: list[TaskDependency]  # edges to the tasks this one waits for (depends_on loaded)
    downstream: list[TaskDependency]  # edges from the tasks waiting for this one (task loaded)
    more_upstream: bool = False
    more_downstream: bool = False


def task_dependencies(task: Task, *, limit: int = DEPENDENCY_PREVIEW) -> Dependencies:
    upstream = list(
        TaskDependency.objects.using(alias())
        .filter(task_id=task.pk)
        .select_related("depends_on")
        .only(
            "id",
            "required",
            "task_id",
            *(f"depends_on__{name}" for name in TASK_LIST_FIELDS if name != "run_id"),
        )
        .order_by("id")[: limit + 1]
    )
    downstream = list(
        TaskDependency.objects.using(alias())
        .filter(depends_on_id=task.pk)
        .select_related("task")
        .only(
            "id",
            "required",
            "depends_on_id",
            *(f"task__{name}" for name in TASK_LIST_FIELDS if name != "run_id"),
        )
        .order_by("id")[: limit + 1]
    )
    return Dependencies(
        upstream=upstream[:limit],
        downstream=downstream[:limit],
        more_upstream=len(upstream) > limit,
        more_downstream=len(downstream) > limit,
    )


@dataclass
class Cascade:
    finished: int  # transitive dependents in a terminal state (they would be reset)
    waiting: int  # transitive dependents not finished (left as they are)
    capped: bool  # stopped counting at CASCADE_SCAN_MAX


def cascade_preview(task_ids: Iterable[Any]) -> Cascade:
    """What ``retry_task(cascade=True)`` on these tasks would reach: their transitive
    dependents, counted by state, breadth first, at most CASCADE_SCAN_MAX of them."""
    seen = set(task_ids)
    frontier = list(seen)
    finished = waiting = 0
    capped = False
    while frontier and not capped:
        rows = list(
            TaskDependency.objects.using(alias())
            .filter(depends_on_id__in=frontier)
            .values_list("task_id", "task__status")
        )
        frontier = []
        for dependent, status in rows:
            if dependent in seen:
                continue
            seen.add(dependent)
            frontier.append(dependent)
            if status in TERMINAL_TASK_STATUSES:
                finished += 1
            else:
                waiting += 1
            if finished + waiting >= CASCADE_SCAN_MAX:
                capped = True
                break
    return Cascade(finished=finished, waiting=waiting, capped=capped)

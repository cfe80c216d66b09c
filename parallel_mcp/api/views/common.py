"""Read helpers of the views: read-only querysets and serialization with no N+1 queries."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any
from uuid import UUID

from ...conf import app_settings
from ...exceptions import RecordNotFoundError
from ...models import Run, Task, TaskDependency
from ..serializers import outputs
from ..serializers.outputs import TaskOut


def depends_on_map(using: str, tasks: Iterable[Task]) -> dict[UUID, list[UUID]]:
    """Dependencies of many tasks in one query (in declaration order)."""
    ids = [task.pk for task in tasks]
    mapping: dict[UUID, list[UUID]] = defaultdict(list)
    if ids:
        rows = (
            TaskDependency.objects.using(using)
            .filter(task_id__in=ids)
            .order_by("id")
            .values_list("task_id", "depends_on_id")
        )
        for task_id, depends_on_id in rows:
            mapping[task_id].append(depends_on_id)
    return {task_id: mapping.get(task_id, []) for task_id in ids}


def tasks_data(using: str, tasks: list[Task]) -> list[dict[str, Any]]:
    return TaskOut(tasks, many=True, context={"depends_on": depends_on_map(using, tasks)}).data


def require_run(using: str, run_id: Any) -> None:
    if not Run.objects.using(using).filter(pk=run_id).exists():
        raise RecordNotFoundError(f"Run {run_id} does not exist.", run_id=run_id)


def event_page(view: Any, params: dict[str, Any], *, run_id: Any = None) -> dict[str, Any]:
    limit = params.get("limit") or app_settings.DEFAULT_EVENT_PAGE_LIMIT
    page = view.orchestrator.list_events_since(
        after_id=params.get("after_id"),
        run_id=run_id if run_id is not None else params.get("run_id"),
        event_types=params.get("type") or None,
        limit=limit,
    )
    return {
        "results": outputs.EventOut(page.events, many=True).data,
        "next_cursor": page.next_cursor,
        "has_more": len(page.events) >= limit,
    }

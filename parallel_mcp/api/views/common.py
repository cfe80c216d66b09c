"""Read helpers of the views: read-only querysets and serialization with no N+1 queries."""

from __future__ import annotations

from typing import Any

from ... import selectors
from ...conf import app_settings
from ...contract import shapes
from ...models import Task


def tasks_data(using: str, tasks: list[Task]) -> list[dict[str, Any]]:
    return shapes.tasks(tasks)


def require_run(using: str, run_id: Any) -> None:
    selectors.require_run(using=using, run_id=run_id)  # the MCP tools answer the same


def event_page(view: Any, params: dict[str, Any], *, run_id: Any = None) -> dict[str, Any]:
    limit = params.get("limit") or app_settings.DEFAULT_EVENT_PAGE_LIMIT
    page = view.orchestrator.list_events_since(
        after_id=params.get("after_id"),
        run_id=run_id if run_id is not None else params.get("run_id"),
        event_types=params.get("type") or None,
        limit=limit,
    )
    return {
        "results": shapes.events(page.events),
        "next_cursor": page.next_cursor,
        "has_more": len(page.events) >= limit,
    }

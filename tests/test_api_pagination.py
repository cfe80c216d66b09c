"""Keyset pagination never skips or repeats a row, even when rows are added between pages,
never counts, and its cursors are opaque and tied to their ordering."""

from __future__ import annotations

import base64
import json

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from parallel_mcp import Orchestrator
from tests.api_helpers import error_of
from tests.conftest import at

pytestmark = pytest.mark.django_db
pytest_plugins = ["tests.api_fixtures"]


@pytest.fixture
def orch() -> Orchestrator:
    return Orchestrator()


def walk(api, path: str, params: dict, *, between=None) -> list[str]:
    """Every id over all pages; ``between(page_number)`` runs after each page."""
    ids: list[str] = []
    cursor = None
    page = 0
    while True:
        query = {**params, **({"cursor": cursor} if cursor else {})}
        response = api.get(path, query)
        assert response.status_code == 200, response.content
        body = response.json()
        ids.extend(row["id"] for row in body["results"])
        cursor = body["next_cursor"]
        assert (body["next"] is None) == (cursor is None)
        if cursor is None:
            return ids
        assert f"cursor={cursor}" in body["next"]
        page += 1
        if between:
            between(page)


@pytest.mark.parametrize("order_dir", ["desc", "asc"])
@pytest.mark.parametrize("order_by", ["updated_at", "created_at"])
def test_runs_pages_neither_skip_nor_repeat_while_runs_are_added(
    operator, orch, order_by, order_dir
):
    # Ties on the timestamp too: several runs share each moment.
    original = [str(orch.create_run(namespace="p", now=at(i // 3)).pk) for i in range(10)]
    added: list[str] = []

    def add_runs(page: int) -> None:
        for _ in range(2):
            added.append(str(orch.create_run(namespace="p").pk))  # now: after every other

    ids = walk(
        operator,
        "runs",
        {"namespace": "p", "limit": 3, "order_by": order_by, "order_dir": order_dir},
        between=add_runs,
    )
    assert len(ids) == len(set(ids)), "a run was repeated"
    assert set(original) <= set(ids), "a run was skipped"
    if order_dir == "desc":
        assert set(ids) == set(original)  # newer rows sort before the cursor
    else:
        assert set(ids) == set(original) | set(added)  # and after it when ascending


def test_tasks_of_a_run_page_by_creation(operator, orch):
    run = orch.create_run()
    original = [
        str(orch.enqueue_task(run_id=run.pk, kind="k", now=at(i // 4)).pk) for i in range(9)
    ]
    added: list[str] = []

    def add(page: int) -> None:
        added.append(str(orch.enqueue_task(run_id=run.pk, kind="k").pk))

    ids = walk(operator, f"runs/{run.pk}/tasks", {"limit": 2}, between=add)
    assert ids == original + added


def test_pending_tasks_page_in_claim_order(operator, orch):
    run = orch.create_run()
    tasks = [
        orch.enqueue_task(run_id=run.pk, kind="k", priority=i % 3, now=at(i // 2))
        for i in range(11)
    ]
    expected = [
        str(t.pk) for t in sorted(tasks, key=lambda t: (-t.priority, t.created_at, str(t.pk)))
    ]
    assert walk(operator, "tasks/pending", {"limit": 4}) == expected
    added: list[str] = []

    def add(page: int) -> None:
        added.append(str(orch.enqueue_task(run_id=run.pk, kind="k", priority=1).pk))

    ids = walk(operator, "tasks/pending", {"limit": 4}, between=add)
    assert len(ids) == len(set(ids)) and set(expected) <= set(ids)


def test_dead_tasks_page_most_recent_first(operator, orch):
    run = orch.create_run()
    for i in range(5):
        orch.enqueue_task(run_id=run.pk, kind="k", max_attempts=1, now=at(i))
    for i in range(5):
        claim = orch.claim_next_task(worker_id="w", now=at(10 + i))
        orch.fail_task(
            task_id=claim.task.pk,
            lease_id=claim.lease.pk,
            worker_id="w",
            error="x",
            retry=True,
            now=at(20 + i // 2),
        )
    ids = walk(operator, "tasks/dead", {"limit": 2})
    assert len(ids) == 5 == len(set(ids))
    assert ids == [row["id"] for row in operator.get("tasks/dead", {"limit": 10}).json()["results"]]


def test_event_pages_follow_next_cursor_without_gaps(operator, orch):
    run = orch.create_run()
    for _ in range(6):
        orch.enqueue_task(run_id=run.pk, kind="k")
    seen: list[int] = []
    after = None
    for round_ in range(20):
        params = {"limit": 4, **({"after_id": after} if after is not None else {})}
        body = operator.get("events", params).json()
        seen.extend(event["id"] for event in body["results"])
        after = body["next_cursor"]
        if round_ == 1:
            orch.enqueue_task(run_id=run.pk, kind="k")  # written between pages
        if not body["has_more"] and round_ > 1:
            break
    from parallel_mcp.models import Event

    assert seen == list(Event.objects.order_by("id").values_list("id", flat=True))


def test_lists_never_count(operator, orch):
    run = orch.create_run()
    orch.enqueue_task(run_id=run.pk, kind="k")
    for path in ("runs", f"runs/{run.pk}/tasks", "tasks/pending", "tasks/dead", "events"):
        with CaptureQueriesContext(connection) as queries:
            assert operator.get(path).status_code == 200
        sql = " ".join(query["sql"].upper() for query in queries.captured_queries)
        assert "COUNT(" not in sql, path
        assert " OFFSET " not in sql, path


def test_cursor_is_opaque_and_bound_to_its_ordering(operator, orch):
    for i in range(3):
        orch.create_run(now=at(i))
    cursor = operator.get("runs", {"limit": 1}).json()["next_cursor"]
    padded = cursor + "=" * (-len(cursor) % 4)
    assert json.loads(base64.urlsafe_b64decode(padded))["o"] == "runs.updated_at.desc"
    follow = operator.get("runs", {"limit": 1, "cursor": cursor})
    assert follow.status_code == 200
    wrong = operator.get("runs", {"limit": 1, "cursor": cursor, "order_dir": "asc"})
    assert wrong.status_code == 400
    assert error_of(wrong)["details"]["fields"]["cursor"]
    run = orch.create_run()
    other_list = operator.get(f"runs/{run.pk}/tasks", {"cursor": cursor})
    assert other_list.status_code == 400
    for forged in ("eyJ2IjoxLCJvIjoicnVucy51cGRhdGVkX2F0LmRlc2MiLCJrIjpbMSwyXX0", "e30", "x"):
        assert operator.get("runs", {"cursor": forged}).status_code == 400


def test_limit_defaults_and_ceiling(operator, orch, settings):
    for _ in range(4):
        orch.create_run()
    settings.PARALLEL_MCP_API = {"PAGE_SIZE": 3}
    assert len(operator.get("runs").json()["results"]) == 3
    settings.PARALLEL_MCP = {**settings.PARALLEL_MCP, "MAX_LIST_LIMIT": 2}
    assert operator.get("runs", {"limit": 3}).status_code == 400
    assert len(operator.get("runs", {"limit": 2}).json()["results"]) == 2

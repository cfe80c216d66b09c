"""The admin at scale: the run and task changelists and a run's detail page render with a fixed
number of queries, whatever the size of the tables, and never COUNT over pmcp_event or
pmcp_task (other than one run's rows). The small database runs always; the large one (100,000
tasks, 1,000,000 events, bulk-loaded in seconds) is a ``slow`` test."""

from __future__ import annotations

import time

import pytest

from tests.admin_support import full_counts, login, seed_fanout_run, seed_scale, url

pytestmark = pytest.mark.django_db

# Statements per page, for a superuser, with the session and user lookups included (2).
# Each number is the most the page may take; the tests show it does not depend on the size
# of the tables. docs/admin.md quotes them.
BUDGETS = {
    # session, user, namespace choices, the page (one row more than shown)
    "run changelist": 4,
    "run changelist, filtered": 4,
    # session, user, the page (joined to the run)
    "task changelist": 3,
    "task changelist, one run": 3,
    "task changelist, dead letter": 3,
    "task changelist, failed": 3,
    "event changelist": 3,
    "event changelist, one run": 3,
    # session, user, run, snapshot chain, graph tasks, graph edges, latest events, running
    # workers for the kinds of its ready tasks (when it has any)
    "run detail": 8,
    # ... past 500 tasks the graph is not drawn: one query for the first 100 tasks instead
    "run detail, no context": 7,
    "run detail, big run": 6,
    # session, user, task+run, explain (1 to 3, by the task's state), dependencies (2),
    # attempts, leases, events
    "task detail": 12,
}


def pages(ids: dict) -> dict[str, str]:
    return {
        "run changelist": url("run_changelist"),
        "run changelist, filtered": url("run_changelist", query="status__exact=failed"),
        "task changelist": url("task_changelist"),
        "task changelist, one run": url("task_changelist", query=f"run={ids['big_run_id']}"),
        "task changelist, dead letter": url("task_changelist", query="dead=yes"),
        "task changelist, failed": url("task_changelist", query="status__exact=failed"),
        "event changelist": url("event_changelist"),
        "event changelist, one run": url("event_changelist", query=f"run={ids['big_run_id']}"),
        "run detail": url("run_change", ids["demo_run_id"]),
        "run detail, no context": url("run_change", ids["small_run_id"]),
        "run detail, big run": url("run_change", ids["big_run_id"]),
        "task detail": url("task_change", ids["small_task_id"]),
    }


def check_pages(client, ids, django_assert_max_num_queries) -> dict[str, tuple[int, float]]:
    measured = {}
    for name, address in pages(ids).items():
        client.get(address)  # warm up: the content-type cache is filled once per process
        started = time.perf_counter()
        with django_assert_max_num_queries(BUDGETS[name]) as captured:
            response = client.get(address)
        elapsed = time.perf_counter() - started
        assert response.status_code == 200, (name, response.status_code)
        assert full_counts(captured.captured_queries) == [], name
        measured[name] = (len(captured.captured_queries), elapsed)
    return measured


def test_pages_take_a_fixed_number_of_queries(client, orch, django_assert_max_num_queries):
    ids = seed_scale(
        small_runs=6, tasks_per_small_run=20, big_run_tasks=600, events_per_task=3, analyze=False
    )
    ids["demo_run_id"] = seed_fanout_run(orch)["run"].id
    login(client, "superuser")
    measured = check_pages(client, ids, django_assert_max_num_queries)
    assert set(measured) == set(BUDGETS)


def test_the_graph_of_a_run_with_hundreds_of_tasks(client, orch, django_assert_max_num_queries):
    run = orch.create_run(namespace="wide")
    specs = [{"kind": "root", "key": "root"}]
    specs += [{"kind": "leaf", "key": f"leaf-{i}", "depends_on": ["root"]} for i in range(400)]
    specs += [{"kind": "join", "key": "join", "depends_on": [f"leaf-{i}" for i in range(400)]}]
    orch.enqueue_tasks(run_id=run.id, tasks=specs)
    login(client, "superuser")
    with django_assert_max_num_queries(BUDGETS["run detail"]):
        response = client.get(url("run_change", run.id))
    html = response.content.decode()
    assert 'data-nodes="402"' in html and 'data-edges="800"' in html
    assert html.count('class="pmcp-node ') == 402


@pytest.mark.slow
def test_at_one_million_events(client, orch, django_assert_max_num_queries):
    started = time.perf_counter()
    ids = seed_scale()  # 100,000 tasks, 1,000,000 events
    seeded = time.perf_counter() - started
    ids["demo_run_id"] = seed_fanout_run(orch)["run"].id
    from parallel_mcp.models import Event, Task

    assert Task.objects.filter(kind__startswith="bench.").count() == 100_000
    assert Event.objects.filter(event_type__startswith="task.").count() >= 1_000_000
    login(client, "superuser")
    measured = check_pages(client, ids, django_assert_max_num_queries)
    print(f"\nseeded 100,000 tasks and 1,000,000 events in {seeded:.1f} s")
    for name, (queries, elapsed) in measured.items():
        print(f"  {name:32} {queries:3d} queries  {elapsed * 1000:8.1f} ms")
    assert seeded < 60

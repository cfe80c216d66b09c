"""The admin pages render what the issue asks for: runs and tasks lists and details, the graph,
the context chain, "why isn't this running?", the dead-letter view, events and snapshots."""

from __future__ import annotations

import re
from datetime import timedelta
from urllib.parse import quote

import pytest
from django.utils import timezone
from django.utils.html import escape

from parallel_mcp.models import ContextSnapshot, Event, Task, WorkerProcess
from parallel_mcp.selectors import no_worker_message
from parallel_mcp.services.tool_calls import answer_input, start_tool_call
from tests.admin_support import login, seed_fanout_run, url
from tests.conftest import live_worker

pytestmark = pytest.mark.django_db
DASH = "\N{EN DASH}"


@pytest.fixture
def demo(orch):
    return seed_fanout_run(orch)


@pytest.fixture
def admin_client(client):
    login(client, "superuser")
    return client


def test_run_changelist_shows_status_counts_progress_and_age(admin_client, demo):
    run = demo["run"]
    response = admin_client.get(url("run_changelist"))
    assert response.status_code == 200
    html = response.content.decode()
    assert 'class="pmcp-badge pmcp-status-failed"' in html  # the run's status badge
    assert "7 tasks" in html
    assert "4 completed" in html and "2 failed" in html and "1 stuck" in html
    assert "pmcp-progress-split" in html
    assert "demo-1" in html and "demo" in html
    assert str(run.id).replace("-", "")[-12:] in html
    assert "ago" in html  # the age column
    assert "not counted" not in html  # one page: the total is known
    assert f"1{DASH}1" in html and "of 1 run" in html


def test_run_changelist_filters_and_search(admin_client, orch, demo):
    other = orch.create_run(namespace="elsewhere", external_id="ext-x")
    page = lambda query: admin_client.get(url("run_changelist", query=query))  # noqa: E731
    assert str(other.id) in page("namespace=elsewhere").content.decode()
    assert str(demo["run"].id) not in page("namespace=elsewhere").content.decode()
    assert str(other.id) in page("status__exact=pending").content.decode()
    assert str(demo["run"].id) in page(f"q={demo['run'].id}").content.decode()
    assert str(other.id) in page("q=ext-x").content.decode()
    assert str(demo["run"].id) not in page("q=ext-x").content.decode()
    since = quote("2000-01-01 00:00:00+00:00")
    assert str(other.id) in page(f"updated_at__gte={since}").content.decode()
    filters = page("").content.decode()
    assert "By namespace" in filters or "namespace" in filters
    assert page("q=not-a-uuid").status_code == 200


def test_run_detail_shows_graph_context_chain_tasks_and_events(admin_client, demo):
    run = demo["run"]
    response = admin_client.get(url("run_change", run.id))
    assert response.status_code == 200
    html = response.content.decode()
    svg = re.search(r'<svg[^>]*class="pmcp-graph"[^>]*>', html)
    assert svg is not None
    assert 'data-nodes="7"' in svg.group(0)
    assert 'data-edges="8"' in svg.group(0)  # parse->4 fetches, 4 fetches->aggregate
    assert html.count('class="pmcp-node ') == 7
    assert "pmcp-node-dead" in html and "pmcp-node-stuck" in html
    # every node links to its task
    for task in demo["tasks"].values():
        assert url("task_change", task.id) in html
    # context: current snapshot pretty-printed, and its chain back to run.initial
    assert "Current snapshot" in html
    assert "&quot;plan&quot;" in html
    assert "run.initial" in html and ">plan<" in html
    # tasks table, events and links to everything
    assert "fetch-4" in html and "ConnectionError: upstream timed out" in html
    assert f"?run={run.id}" in html
    assert "Latest events" in html and "task.dead_lettered" in html
    assert url("event_changelist", query=f"run={run.id}") in html
    # read only: no save buttons, no inputs named after fields
    assert 'name="_save"' not in html
    assert 'name="namespace"' not in html


def test_the_run_page_of_a_tool_call_shows_the_tool_the_caller_and_its_input_requests(
    admin_client, orch, django_assert_max_num_queries
):
    call = start_tool_call(
        using="default", tool="greet", kind="mcp.tool.greet", input={}, principal="token:ab12cd34",
        ttl_ms=60_000,
    )  # fmt: skip
    claim = orch.claim_next_task(worker_id="w1")
    ids = {"task_id": claim.task.id, "lease_id": claim.lease.id, "worker_id": "w1"}
    asked = {"method": "elicitation/create", "params": {"message": "Your <name>?"}}
    other = {"method": "roots/list"}
    orch.pause_task(**ids, status="waiting_input", input_requests={"name": asked, "roots": other})
    answer_input(
        using="default",
        run_id=call.run_id,
        responses={"name": {"action": "accept", "content": {"name": "Ada <b>"}}},
        principal="token:ab12cd34",
    )

    # A tool call's page: two reads more than any run's (the call, its input requests).
    with django_assert_max_num_queries(10):
        response = admin_client.get(url("run_change", call.run_id))
    assert response.status_code == 200
    html = response.content.decode()
    section = html[html.index('id="pmcp-tool-call"') : html.index('id="pmcp-graph"')]
    assert "<td>greet</td>" in section and "<td>token:ab12cd34</td>" in section
    assert ">input_required<" in section  # one request is still open
    assert url("task_change", claim.task.id) in section
    assert "60000 ms" in section
    expires = (call.created_at + timedelta(milliseconds=60_000)).isoformat()
    assert f'<th>expires</th><td><time datetime="{expires}"' in section
    rows = section[section.index("pmcp-input-requests") :]
    assert rows.index("<td>name</td>") < rows.index("<td>roots</td>")  # oldest first, by key
    assert "elicitation/create" in rows and "roots/list" in rows
    assert escape("Your <name>?") in rows and "Your <name>?" not in rows  # escaped
    assert escape('"name": "Ada <b>"') in rows  # the answer, pretty-printed JSON
    assert ">answered<" in rows and ">waiting<" in rows
    assert "<td>token:ab12cd34</td>" in rows  # who answered
    assert "<input" not in section and "<textarea" not in section  # read-only

    # Other runs have no such section (and pay nothing for it: test_admin_scale's budgets).
    plain = orch.create_run(namespace="demo")
    page = admin_client.get(url("run_change", plain.id)).content.decode()
    assert 'id="pmcp-tool-call"' not in page


def test_run_detail_caps_the_graph(admin_client, orch, monkeypatch):
    from parallel_mcp.admin import reads

    monkeypatch.setattr(reads, "GRAPH_MAX_TASKS", 3)
    run = orch.create_run(namespace="big")
    orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": "k", "key": f"k{i}"} for i in range(5)])
    html = admin_client.get(url("run_change", run.id)).content.decode()
    assert 'class="pmcp-graph"' not in html
    assert "This run has 5 tasks; the graph is drawn for runs of up to 3 tasks." in html


def test_task_changelist_columns(admin_client, demo):
    response = admin_client.get(url("task_changelist"))
    assert response.status_code == 200
    html = response.content.decode()
    assert "1 of 1" in html  # flaky: attempts n of max
    assert "0 (no limit)" in html
    assert "dead letter" in html and "stuck" in html
    assert "ConnectionError: upstream timed out" in html
    assert "simulated network blip" in html


def test_task_changelist_shows_lease_and_next_retry(admin_client, orch):
    run = orch.create_run()
    retried = orch.enqueue_task(
        run_id=run.id, kind="retried", max_attempts=3, retry={"delay_ms": 600_000}
    )
    orch.enqueue_task(run_id=run.id, kind="held")
    claim = orch.claim_next_task(worker_id="w-retry", kinds=["retried"])
    orch.fail_task(
        task_id=retried.id, lease_id=claim.lease.id, worker_id="w-retry", error="x", retry=True
    )
    orch.claim_next_task(worker_id="w-holder", kinds=["held"], lease_ms=120_000)
    response = admin_client.get(url("task_changelist"))
    rows = {task.kind: task for task in response.context["cl"].result_list}
    assert set(rows) == {"retried", "held"}
    html = response.content.decode()
    assert "retry <time" in html and (">in 9m<" in html or ">in 10m<" in html)
    assert "w-holder<br>" in html and "until <time" in html and ">in 1m<" in html
    assert "1 of 3" in html


def test_task_changelist_filters_by_run_status_and_dead_letter(admin_client, orch, demo):
    other = orch.create_run(namespace="other")
    orch.enqueue_task(run_id=other.id, kind="other.kind", key="lonely")
    by_run = admin_client.get(url("task_changelist", query=f"run={other.id}")).content.decode()
    assert "lonely" in by_run and "fetch-1" not in by_run
    dead = admin_client.get(url("task_changelist", query="dead=yes")).content.decode()
    assert "flaky" in dead and "fetch-1" not in dead and "lonely" not in dead
    assert "simulated network blip" in dead  # the failure reason
    failed = admin_client.get(url("task_changelist", query="status__exact=failed")).content
    assert b"fetch-4" in failed and b"fetch-1" not in failed
    bad = admin_client.get(url("task_changelist", query="run=nope"))
    assert bad.status_code == 302 and "e=1" in bad["Location"]


def test_task_search(admin_client, demo):
    task = demo["tasks"]["fetch-2"]
    html = admin_client.get(url("task_changelist", query=f"q={task.id}")).content.decode()
    assert "fetch-2" in html and "fetch-3" not in html
    by_run = admin_client.get(url("task_changelist", query=f"q={task.run_id}")).content.decode()
    assert "fetch-3" in by_run
    by_kind = admin_client.get(url("task_changelist", query="q=demo.aggregate")).content.decode()
    assert "aggregate" in by_kind and "fetch-3" not in by_kind


def test_task_detail(admin_client, demo):
    task = demo["tasks"]["fetch-4"]
    response = admin_client.get(url("task_change", task.id))
    assert response.status_code == 200
    html = response.content.decode()
    assert "Why isn" in html and "It has finished: failed." in html
    assert "ConnectionError: upstream timed out" in html
    assert "&quot;i&quot;: &quot;fetch-4&quot;" in html  # input, pretty JSON
    assert "1 (no limit)" in html
    assert "Waits for" in html and "parse" in html  # upstream
    assert "Needed by" in html and "aggregate" in html  # downstream
    assert "Attempts (newest first" in html and "Leases (newest first" in html
    assert "w1" in html  # the attempt's worker, inline
    assert "task.failed" in html  # latest events of the task
    assert url("event_changelist", query=f"task={task.id}") in html


def test_task_detail_explains_why_it_is_not_running(admin_client, demo):
    html = admin_client.get(url("task_change", demo["tasks"]["aggregate"].id)).content.decode()
    assert "dependency_failed" in html
    assert "Required dependency" in html and "is failed" in html


def test_queued_task_with_nothing_blocking_says_so(admin_client, orch):
    live_worker("ready.kind")
    run = orch.create_run()
    task = orch.enqueue_task(run_id=run.id, kind="ready.kind")
    html = admin_client.get(url("task_change", task.id)).content.decode()
    assert "Nothing blocks it" in html and "ready.kind" in html


def test_a_task_no_running_worker_handles_says_so(admin_client, orch):
    run = orch.create_run()
    task = orch.enqueue_task(run_id=run.id, kind="lonely.kind")
    html = admin_client.get(url("task_change", task.id)).content.decode()
    assert "Nothing blocks it" not in html
    assert "no_worker" in html
    assert escape(no_worker_message("lonely.kind")) in html


def test_the_run_page_names_the_kinds_no_running_worker_handles(admin_client, orch):
    live_worker("served.kind")
    run = orch.create_run()
    orch.enqueue_task(run_id=run.id, kind="served.kind", key="served")
    first = orch.enqueue_task(run_id=run.id, kind="lonely.kind", key="lonely")
    orch.enqueue_task(run_id=run.id, kind="later.kind", key="later", depends_on=[first.id])
    html = admin_client.get(url("run_change", run.id)).content.decode()
    notices = re.findall(r'<p class="pmcp-notice pmcp-no-worker">([^<]*)</p>', html)
    # Once per kind; not for the task that still waits for a dependency.
    assert notices == [escape(no_worker_message("lonely.kind"))]
    row = re.search(r"<tr>\s*<td>[^\n]*>lonely</a>.*?</tr>", html, re.DOTALL).group(0)
    assert "no running worker" in row
    row = re.search(r"<tr>\s*<td>[^\n]*>served</a>.*?</tr>", html, re.DOTALL).group(0)
    assert "no running worker" not in row


def test_the_workers_page_lists_running_workers_and_their_kinds(admin_client):
    live_worker("site.apply", "site.check", worker_id="web-1:4711")
    gone = live_worker("old.kind", worker_id="gone-1")
    WorkerProcess.objects.filter(pk=gone.pk).update(
        last_seen_at=timezone.now() - timedelta(minutes=5),
        expires_at=timezone.now() - timedelta(minutes=4),
    )
    html = admin_client.get(url("workerprocess_changelist")).content.decode()
    assert "web-1:4711" in html and "site.apply, site.check" in html
    assert "gone-1" not in html  # running ones by default
    html = admin_client.get(url("workerprocess_changelist", query="state=gone")).content.decode()
    assert "gone-1" in html and "web-1:4711" not in html
    # Read-only, like every parallel_mcp admin.
    assert admin_client.get(url("workerprocess_change", gone.pk)).status_code in (200, 302)
    assert "Add worker" not in html


def test_task_detail_shows_the_lease(admin_client, orch):
    run = orch.create_run()
    task = orch.enqueue_task(run_id=run.id, kind="k", max_attempts=3)
    orch.claim_next_task(worker_id="worker-7", lease_ms=60_000)
    html = admin_client.get(url("task_change", task.id)).content.decode()
    assert "held by <strong>worker-7</strong>" in html
    assert "1 of 3" in html
    assert "leased" in html and "Task is leased by worker" in html


def test_events_changelist_and_detail(admin_client, demo):
    run = demo["run"]
    response = admin_client.get(url("event_changelist", query=f"run={run.id}"))
    assert response.status_code == 200
    assert len(response.context["cl"].result_list) == Event.objects.filter(run_id=run.id).count()
    html = response.content.decode()
    assert '<td class="field-event_type">task.completed</td>' in html
    by_type = admin_client.get(url("event_changelist", query="type=task.dead_lettered"))
    assert [e.event_type for e in by_type.context["cl"].result_list] == ["task.dead_lettered"]
    event = Event.objects.filter(run_id=run.id, event_type="task.failed").first()
    detail = admin_client.get(url("event_change", event.pk)).content.decode()
    assert "ConnectionError" in detail and "&quot;error&quot;" in detail
    by_number = admin_client.get(url("event_changelist", query=f"q=%23{event.pk}")).content
    assert b"task.failed" in by_number


def test_snapshot_pages(admin_client, demo):
    run = demo["run"]
    current = ContextSnapshot.objects.get(pk=run.current_context_snapshot_id)
    assert (
        admin_client.get(url("contextsnapshot_changelist", query=f"run={run.id}")).status_code
        == 200
    )
    html = admin_client.get(url("contextsnapshot_change", current.pk)).content.decode()
    assert "plan" in html and "run.initial" in html  # payload and parent chain
    assert "yes" in html  # current context of its run


def test_attempt_and_lease_pages(admin_client, demo):
    task = demo["tasks"]["fetch-1"]
    attempt = task.attempts.first()
    lease = task.leases.first()
    assert admin_client.get(url("attempt_changelist")).status_code == 200
    assert admin_client.get(url("attempt_change", attempt.pk)).status_code == 200
    assert admin_client.get(url("lease_changelist", query=f"task={task.id}")).status_code == 200
    assert admin_client.get(url("lease_change", lease.pk)).status_code == 200


def test_pagination_without_counts(admin_client, orch, monkeypatch):
    from parallel_mcp.admin.tasks import TaskAdmin

    monkeypatch.setattr(TaskAdmin, "list_per_page", 3)
    run = orch.create_run()
    orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": "k", "key": f"t{i}"} for i in range(7)])
    first = admin_client.get(url("task_changelist")).content.decode()
    assert f"1{DASH}3" in first and "not counted" in first and 'rel="next"' in first
    assert 'class="question' not in first  # no "select all N": N is not counted
    second = admin_client.get(url("task_changelist", query="p=2")).content.decode()
    assert f"4{DASH}6" in second and 'rel="prev"' in second and 'rel="next"' in second
    last = admin_client.get(url("task_changelist", query="p=3")).content.decode()
    assert f"7{DASH}7" in last and "of 7 tasks" in last and 'rel="next"' not in last
    beyond = admin_client.get(url("task_changelist", query="p=9"))
    assert beyond.status_code == 302 and "e=1" in beyond["Location"]


def test_admin_index_lists_the_models(admin_client):
    html = admin_client.get("/admin/").content.decode()
    for name in ("Runs", "Tasks", "Events", "Context snapshots", "Attempts", "Leases"):
        assert name in html
    assert "Task dependencys" not in html


def test_static_files_exist():
    from django.contrib.staticfiles import finders

    for name in ("parallel_mcp/admin.css", "parallel_mcp/admin.js"):
        path = finders.find(name)
        assert path, name


def test_task_rows_are_not_loaded_with_their_json(
    admin_client, orch, django_assert_max_num_queries
):
    run = orch.create_run()
    orch.enqueue_task(run_id=run.id, kind="k", input={"big": "x" * 10_000})
    with django_assert_max_num_queries(10) as captured:
        admin_client.get(url("task_changelist"))
    page_query = [q["sql"] for q in captured.captured_queries if "pmcp_task" in q["sql"]]
    assert page_query and all('"input"' not in sql for sql in page_query)
    assert Task.objects.count() == 1


def test_namespace_filter_lists_the_first_namespaces(admin_client, orch, monkeypatch):
    from parallel_mcp.admin import runs

    monkeypatch.setattr(runs, "NAMESPACE_CHOICES_MAX", 3)
    for name in ("zeta", "alpha", "mid", "beta", "alpha"):
        orch.create_run(namespace=name)
    response = admin_client.get(url("run_changelist"))
    spec = next(f for f in response.context["cl"].filter_specs if f.title == "namespace")
    assert [value for value, _ in spec.lookup_choices] == ["alpha", "beta", "mid"]
    chosen = admin_client.get(url("run_changelist", query="namespace=zeta")).context["cl"]
    spec = next(f for f in chosen.filter_specs if f.title == "namespace")
    assert [value for value, _ in spec.lookup_choices] == ["alpha", "beta", "mid", "zeta"]
    assert [run.namespace for run in chosen.result_list] == ["zeta"]

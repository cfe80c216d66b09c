"""Every admin action: it calls the Orchestrator, asks first where it destroys something,
records who did it, and reports each item's success or typed error."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.utils import timezone

from parallel_mcp.models import Event, Run, Task, TaskDependency
from tests.admin_support import (
    complete,
    login,
    messages_of,
    object_action_url,
    seed_fanout_run,
    take,
    url,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(client):
    login(client, "operator")
    return client


def run_action(client, model: str, action: str, ids, **extra):
    """The changelist's first POST (the "Go" button): a confirmation page or the result."""
    data = {"action": action, "_selected_action": [str(pk) for pk in ids], "index": 0, **extra}
    return client.post(url(f"{model}_changelist"), data, follow=True)


def confirm(client, model: str, action: str, ids, **extra):
    """The confirmation page's POST back to the changelist (``post=yes``, no ``index``)."""
    data = {"action": action, "_selected_action": [str(pk) for pk in ids], "post": "yes", **extra}
    return client.post(url(f"{model}_changelist"), data, follow=True)


def payloads(run_id, event_type: str, task_id=None) -> list[dict]:
    qs = Event.objects.filter(run_id=run_id, event_type=event_type)
    if task_id is not None:
        qs = qs.filter(task_id=task_id)
    return [event.payload for event in qs.order_by("id")]


def active_run(orch, tasks: int = 2):
    run = orch.create_run(namespace="ops")
    created = orch.enqueue_tasks(
        run_id=run.id, tasks=[{"kind": "ops.k", "key": f"k{i}"} for i in range(tasks)]
    )
    return orch.get_run(run_id=run.id), created


# -- cancel runs ------------------------------------------------------------------------------
def test_cancel_runs_asks_first_then_cancels_and_records_the_operator(operator, orch):
    run, _tasks = active_run(orch)
    page = run_action(operator, "run", "cancel_runs", [run.id])
    assert page.status_code == 200
    assert page.templates[0].name == "admin/parallel_mcp/action_confirmation.html"
    html = page.content.decode()
    assert "Cancel these runs?" in html and "Yes, cancel these runs" in html
    assert str(run.id)[-12:] in html.replace("-", "")
    assert Run.objects.get(pk=run.id).status == "active"  # nothing happened yet

    done = confirm(operator, "run", "cancel_runs", [run.id], note="maintenance window")
    assert done.status_code == 200
    assert Run.objects.get(pk=run.id).status == "cancelled"
    assert payloads(run.id, "run.cancelled")[0]["reason"] == "admin: operator: maintenance window"
    reasons = {p["reason"] for p in payloads(run.id, "task.cancelled")}
    assert reasons == {"admin: operator: maintenance window"}
    assert any("cancelled (2 unfinished task(s) cancelled" in m for m in messages_of(done))
    entry = LogEntry.objects.get(object_id=str(run.id))
    assert entry.user.username == "operator" and "Cancelled the run" in entry.change_message


def test_cancel_runs_reports_runs_already_finished(operator, orch):
    seeded = seed_fanout_run(orch)
    run, _ = active_run(orch)
    done = confirm(operator, "run", "cancel_runs", [seeded["run"].id, run.id])
    notes = messages_of(done)
    assert any("is already failed; nothing to cancel" in m for m in notes)
    assert any("cancelled (2 unfinished" in m for m in notes)
    assert Run.objects.get(pk=seeded["run"].id).status == "failed"
    assert payloads(seeded["run"].id, "run.cancelled") == []


def test_cancel_run_from_its_page(operator, orch):
    run, _ = active_run(orch)
    page = operator.post(object_action_url("run", run.id, "cancel_runs"))
    assert page.status_code == 200 and "Cancel these runs?" in page.content.decode()
    # the confirmation posts back to the object action and lands on the run's page
    assert f'action="{object_action_url("run", run.id, "cancel_runs")}"' in page.content.decode()
    assert f'href="{url("run_change", run.id)}"' in page.content.decode()  # "take me back"
    done = operator.post(object_action_url("run", run.id, "cancel_runs"), {"post": "yes"})
    assert done.status_code == 302 and done["Location"] == url("run_change", run.id)
    assert Run.objects.get(pk=run.id).status == "cancelled"
    assert payloads(run.id, "run.cancelled")[0]["reason"] == "admin: operator"


# -- copy runs --------------------------------------------------------------------------------
def test_copy_runs_makes_a_fresh_run_with_the_same_graph(operator, orch):
    source = seed_fanout_run(orch)["run"]
    done = run_action(operator, "run", "copy_runs", [source.id])
    copy = Run.objects.exclude(pk=source.id).get()
    assert copy.tasks_total == source.tasks_total and copy.status == "active"
    assert TaskDependency.objects.filter(run_id=copy.id).count() == 8
    assert Task.objects.filter(run_id=copy.id, status="queued").count() == 7
    note = next(m for m in messages_of(done) if "copied to" in m)
    assert url("run_change", copy.id) in note and "by admin: operator" in note
    assert Run.objects.get(pk=source.id).status == "failed"  # untouched
    assert LogEntry.objects.filter(object_id=str(copy.id)).exists()


def test_copy_run_from_its_page_returns_to_it(operator, orch):
    source = seed_fanout_run(orch)["run"]
    done = operator.post(object_action_url("run", source.id, "copy_runs"))
    assert done.status_code == 302 and done["Location"] == url("run_change", source.id)
    assert Run.objects.count() == 2


# -- cancel tasks -----------------------------------------------------------------------------
def test_cancel_tasks_confirms_and_reports_typed_errors(operator, orch):
    seeded = seed_fanout_run(orch)
    aggregate, parse = seeded["tasks"]["aggregate"], seeded["tasks"]["parse"]
    page = run_action(operator, "task", "cancel_tasks", [aggregate.id, parse.id])
    assert "Cancel these tasks?" in page.content.decode()
    assert Task.objects.get(pk=aggregate.id).status == "queued"
    done = confirm(operator, "task", "cancel_tasks", [aggregate.id, parse.id])
    notes = messages_of(done)
    assert Task.objects.get(pk=aggregate.id).status == "cancelled"
    assert any("Task aggregate cancelled (was queued)" in m for m in notes)
    error = next(m for m in notes if m.startswith("Task parse:"))
    assert "already completed" in error and "[invalid_transition]" in error
    assert payloads(aggregate.run_id, "task.cancelled", aggregate.id)[0]["reason"] == (
        "admin: operator"
    )
    levels = [m.level_tag for m in done.context["messages"]]
    assert "success" in levels and "error" in levels


def test_cancel_a_leased_task_fences_its_worker(operator, orch):
    _run, (task, _) = active_run(orch)
    claim = take(orch, task)
    confirm(operator, "task", "cancel_tasks", [task.id])
    assert Task.objects.get(pk=task.id).status == "cancelled"
    from parallel_mcp.exceptions import LeaseConflictError

    with pytest.raises(LeaseConflictError):
        orch.heartbeat_lease(task_id=task.id, lease_id=claim.lease.id, worker_id="w1")


# -- re-execute -------------------------------------------------------------------------------
def chain(orch):
    """a -> b -> c, all completed; then a is re-executed."""
    run = orch.create_run(namespace="chain")
    tasks = orch.enqueue_tasks(
        run_id=run.id,
        tasks=[
            {"kind": "c.a", "key": "a"},
            {"kind": "c.b", "key": "b", "depends_on": ["a"]},
            {"kind": "c.c", "key": "c", "depends_on": ["b"]},
        ],
    )
    for task in tasks:
        complete(orch, task)
    return run, {task.key: task for task in tasks}


def test_retry_tasks_without_cascade_leaves_dependents_alone(operator, orch):
    run, tasks = chain(orch)
    page = run_action(operator, "task", "retry_tasks", [tasks["a"].id])
    html = page.content.decode()
    assert "Re-execute these tasks?" in html and "Only the selected tasks are reset" in html
    assert Task.objects.get(pk=tasks["a"].id).status == "completed"
    done = confirm(operator, "task", "retry_tasks", [tasks["a"].id])
    assert Task.objects.get(pk=tasks["a"].id).status == "queued"
    assert Task.objects.get(pk=tasks["b"].id).status == "completed"
    assert Task.objects.get(pk=tasks["c"].id).status == "completed"
    assert payloads(run.id, "task.requeued") == [
        {"reason": "admin: operator", "from": "completed", "cascade_from": None}
    ]
    assert any("Task a re-executed (was completed, now queued)." in m for m in messages_of(done))


def test_retry_tasks_with_cascade_resets_finished_dependents(operator, orch):
    run, tasks = chain(orch)
    page = run_action(operator, "task", "retry_tasks_cascade", [tasks["a"].id])
    html = page.content.decode()
    assert "Their dependents: 2 finished task(s) will be reset" in html
    done = confirm(operator, "task", "retry_tasks_cascade", [tasks["a"].id], note="bad data")
    assert set(Task.objects.filter(run_id=run.id).values_list("status", flat=True)) == {"queued"}
    events = payloads(run.id, "task.requeued")
    assert len(events) == 3
    assert {event["reason"] for event in events} == {"admin: operator: bad data"}
    assert sum(1 for event in events if event["cascade_from"] == str(tasks["a"].id)) == 2
    assert any("finished dependents reset too" in m for m in messages_of(done))


def test_retry_cascade_of_two_related_tasks_resets_each_once(operator, orch):
    run, tasks = chain(orch)
    done = confirm(operator, "task", "retry_tasks_cascade", [tasks["a"].id, tasks["b"].id])
    notes = messages_of(done)
    assert any("Task b was already re-executed by the cascade" in m for m in notes)
    assert not [m for m in notes if "[invalid_transition]" in m]
    assert len(payloads(run.id, "task.requeued")) == 3


def test_retry_reports_a_task_that_is_not_finished(operator, orch):
    _run, (task, _) = active_run(orch)
    done = confirm(operator, "task", "retry_tasks", [task.id])
    assert any("[invalid_transition]" in m and "re-executed" in m for m in messages_of(done))
    assert Task.objects.get(pk=task.id).status == "queued"


def test_retry_cascade_from_the_task_page(operator, orch):
    seeded = seed_fanout_run(orch)
    failed = seeded["tasks"]["fetch-4"]
    address = object_action_url("task", failed.id, "retry_tasks_cascade")
    page = operator.post(address)
    assert "Re-execute tasks and their dependents" in page.content.decode()
    done = operator.post(address, {"post": "yes"})
    assert done["Location"] == url("task_change", failed.id)
    assert Task.objects.get(pk=failed.id).status == "queued"
    assert Run.objects.get(pk=failed.run_id).status == "active"


# -- requeue dead tasks -----------------------------------------------------------------------
def test_requeue_dead_tasks(operator, orch):
    seeded = seed_fanout_run(orch)
    flaky, fetch = seeded["tasks"]["flaky"], seeded["tasks"]["fetch-4"]
    done = run_action(operator, "task", "requeue_dead_tasks", [flaky.id, fetch.id])
    flaky.refresh_from_db()
    assert flaky.status == "queued" and not flaky.dead and flaky.attempt_count == 0
    event = payloads(flaky.run_id, "task.requeued_from_dlq", flaky.id)[0]
    assert event["reason"] == "admin: operator"
    assert event["previous_error"] == "simulated network blip"
    notes = messages_of(done)
    assert any("Task flaky requeued from the dead-letter queue" in m for m in notes)
    assert any(m.startswith("Task fetch-4:") and "not in the dead-letter queue" in m for m in notes)


# -- resume paused tasks ----------------------------------------------------------------------
def paused(orch, *, status="waiting_input", input_value=None):
    run = orch.create_run(namespace="pause")
    task = orch.enqueue_task(run_id=run.id, kind="p.k", input=input_value or {"question": "ok?"})
    claim = take(orch, task)
    orch.pause_task(
        task_id=task.id, lease_id=claim.lease.id, worker_id="w1", status=status, reason="ask"
    )
    return task


def test_resume_shows_a_form_with_the_current_input(operator, orch):
    task = paused(orch)
    page = run_action(operator, "task", "resume_tasks", [task.id])
    html = page.content.decode()
    assert page.templates[0].name == "admin/parallel_mcp/action_confirmation.html"
    assert "Replace the input" in html and "&quot;question&quot;: &quot;ok?&quot;" in html
    assert Task.objects.get(pk=task.id).status == "waiting_input"


def test_resume_without_new_input(operator, orch):
    task = paused(orch)
    done = confirm(operator, "task", "resume_tasks", [task.id], input='{"ignored": 1}')
    task.refresh_from_db()
    assert task.status == "queued" and task.input == {"question": "ok?"}
    assert payloads(task.run_id, "task.resumed")[0]["input_replaced"] is False
    assert any(
        "resumed (was waiting_input; input unchanged), by admin: operator" in m
        for m in messages_of(done)
    )


def test_resume_with_new_input(operator, orch):
    task = paused(orch)
    done = confirm(
        operator,
        "task",
        "resume_tasks",
        [task.id],
        replace_input="on",
        input='{"answer": "approved"}',
    )
    task.refresh_from_db()
    assert task.status == "queued" and task.input == {"answer": "approved"}
    assert payloads(task.run_id, "task.resumed")[0]["input_replaced"] is True
    assert any("with new input" in m for m in messages_of(done))
    assert "Resumed (with new input; admin: operator)" in LogEntry.objects.get().change_message


def test_resume_with_invalid_json_shows_the_form_again(operator, orch):
    task = paused(orch)
    page = confirm(operator, "task", "resume_tasks", [task.id], replace_input="on", input="{nope")
    assert page.status_code == 200 and "Not valid JSON" in page.content.decode()
    assert Task.objects.get(pk=task.id).status == "waiting_input"
    empty = confirm(operator, "task", "resume_tasks", [task.id], replace_input="on", input="")
    assert "Enter a JSON value" in empty.content.decode()


def test_resume_blocked_task_and_report_a_task_not_paused(operator, orch):
    task = paused(orch, status="blocked")
    _run, (queued, _) = active_run(orch)
    done = confirm(operator, "task", "resume_tasks", [task.id, queued.id])
    assert Task.objects.get(pk=task.id).status == "queued"
    assert any(m.startswith("Task k0:") and "[invalid_transition]" in m for m in messages_of(done))


# -- expire leases now ------------------------------------------------------------------------
def test_expire_leases_now(operator, orch):
    run = orch.create_run(namespace="leases")
    lapsed = orch.enqueue_task(run_id=run.id, kind="lapsed", max_attempts=3)
    live = orch.enqueue_task(run_id=run.id, kind="live")
    idle = orch.enqueue_task(run_id=run.id, kind="idle")
    hour_ago = timezone.now() - timedelta(hours=1)
    orch.claim_next_task(worker_id="gone", kinds=["lapsed"], lease_ms=1_000, now=hour_ago)
    orch.claim_next_task(worker_id="busy", kinds=["live"], lease_ms=600_000)
    page = operator.get(url("task_change", lapsed.id)).content.decode()
    assert 'data-action="expire_leases_now"' in page and "lapsed" in page
    page = operator.get(url("task_change", live.id)).content.decode()
    assert 'data-action="expire_leases_now"' not in page  # its lease is still valid

    done = run_action(operator, "task", "expire_leases_now", [lapsed.id, live.id, idle.id])
    assert Task.objects.get(pk=lapsed.id).status == "queued"
    assert Task.objects.get(pk=live.id).status == "leased"
    notes = messages_of(done)
    short = str(lapsed.id).replace("-", "")[-12:]
    assert f"Task {short}: lease expired by admin: operator; task now queued." in notes
    assert any("the lease held by busy is valid until" in m for m in notes)
    assert any(m.endswith(": queued, holds no lease.") for m in notes)
    assert payloads(run.id, "task.lease_expired", lapsed.id)


def test_expire_leases_now_when_nothing_lapsed(operator, orch):
    _run, (task, _) = active_run(orch)
    done = run_action(operator, "task", "expire_leases_now", [task.id])
    assert any("No lease had lapsed." in m for m in messages_of(done))


def test_expire_leases_now_from_the_task_page(operator, orch):
    run = orch.create_run()
    task = orch.enqueue_task(run_id=run.id, kind="k")
    orch.claim_next_task(
        worker_id="gone", lease_ms=1_000, now=timezone.now() - timedelta(minutes=5)
    )
    done = operator.post(object_action_url("task", task.id, "expire_leases_now"))
    assert done.status_code == 302 and done["Location"] == url("task_change", task.id)
    assert Task.objects.get(pk=task.id).status == "queued"


# -- limits and reporting ---------------------------------------------------------------------
def test_a_selection_too_large_is_refused(operator, orch, monkeypatch):
    from parallel_mcp.admin import actions

    monkeypatch.setattr(actions, "MAX_ACTION_ITEMS", 2)
    _run, tasks = active_run(orch, tasks=3)
    done = confirm(operator, "task", "cancel_tasks", [task.id for task in tasks])
    assert any(
        "Select at most 2 tasks at a time; nothing was done." in m for m in messages_of(done)
    )
    assert not Task.objects.filter(status="cancelled").exists()


def test_many_outcomes_are_summed_up(operator, orch, monkeypatch):
    from parallel_mcp.admin import actions

    monkeypatch.setattr(actions, "MESSAGE_ITEMS", 1)
    _run, tasks = active_run(orch, tasks=3)
    done = confirm(operator, "task", "cancel_tasks", [task.id for task in tasks])
    notes = messages_of(done)
    assert len([m for m in notes if "cancelled (was queued)" in m]) == 1
    assert "… and 2 more (succeeded)." in notes
    assert Task.objects.filter(status="cancelled").count() == 3


def test_actions_never_write_rows_themselves(operator, orch, monkeypatch):
    """The admin layer has no write of its own: with the Orchestrator methods stubbed out,
    an action changes nothing."""
    from parallel_mcp.orchestrator import Orchestrator

    calls = []
    monkeypatch.setattr(
        Orchestrator, "retry_task", lambda self, **kwargs: calls.append(kwargs) or None
    )
    seeded = seed_fanout_run(orch)
    failed = seeded["tasks"]["fetch-4"]
    before = list(Task.objects.order_by("id").values())
    confirm(operator, "task", "retry_tasks", [failed.id])
    assert calls == [{"task_id": failed.id, "cascade": False, "reason": "admin: operator"}]
    assert list(Task.objects.order_by("id").values()) == before

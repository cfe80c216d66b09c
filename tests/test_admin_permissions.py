"""Who may see and do what in the admin.

anonymous -> the login page; staff without permissions -> 403; a viewer (view permissions)
sees every page but no action; an operator (view permissions + ``parallel_mcp.operate_runs``)
sees and runs the actions. Nobody, superusers included, can add, change or delete a row.
"""

from __future__ import annotations

import pytest
from django.contrib import admin
from django.test import RequestFactory

from parallel_mcp.models import Attempt, ContextSnapshot, Event, Lease, Run, Task
from tests.admin_support import login, make_user, object_action_url, seed_fanout_run, url

pytestmark = pytest.mark.django_db

MODELS = ("run", "task", "event", "contextsnapshot", "attempt", "lease")
RUN_ACTIONS = ("cancel_runs", "copy_runs")
TASK_ACTIONS = (
    "cancel_tasks",
    "retry_tasks",
    "retry_tasks_cascade",
    "requeue_dead_tasks",
    "resume_tasks",
    "expire_leases_now",
)


@pytest.fixture
def demo(orch):
    seeded = seed_fanout_run(orch)
    run, tasks = seeded["run"], seeded["tasks"]
    task = tasks["fetch-4"]
    return {
        "run": run,
        "tasks": tasks,
        "pages": {
            "run": run.pk,
            "task": task.pk,
            "event": Event.objects.filter(run_id=run.pk).first().pk,
            "contextsnapshot": run.current_context_snapshot_id,
            "attempt": Attempt.objects.filter(task_id=task.pk).first().pk,
            "lease": Lease.objects.filter(task_id=task.pk).first().pk,
        },
    }


def every_page(demo):
    for model in MODELS:
        yield url(f"{model}_changelist")
        yield url(f"{model}_change", demo["pages"][model])


def test_anonymous_is_sent_to_the_login_page(client, demo):
    for address in every_page(demo):
        response = client.get(address)
        assert response.status_code == 302, address
        assert response["Location"].startswith("/admin/login/"), address
    response = client.post(object_action_url("run", demo["run"].pk, "cancel_runs"))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_staff_without_permissions_gets_403(client, demo):
    login(client, "staff")
    for address in every_page(demo):
        assert client.get(address).status_code == 403, address
    assert client.post(object_action_url("run", demo["run"].pk, "copy_runs")).status_code == 403
    assert Run.objects.count() == 1


def test_operate_permission_alone_shows_nothing(client, demo):
    user = make_user("staff", "lonely-operator")
    from django.contrib.auth.models import Permission

    user.user_permissions.add(Permission.objects.get(codename="operate_runs"))
    client.force_login(user)
    assert client.get(url("run_changelist")).status_code == 403
    assert client.post(object_action_url("run", demo["run"].pk, "copy_runs")).status_code == 403


def test_viewer_sees_every_page_but_no_action(client, demo):
    login(client, "viewer")
    for address in every_page(demo):
        response = client.get(address)
        assert response.status_code == 200, address
        html = response.content.decode()
        assert 'name="action"' not in html, address
        assert "pmcp-object-action" not in html, address
        assert 'name="_save"' not in html, address
    # the graph, tasks and events are there for viewers too
    html = client.get(url("run_change", demo["run"].pk)).content.decode()
    assert 'class="pmcp-graph"' in html and "Latest events" in html
    html = client.get(url("task_change", demo["pages"]["task"])).content.decode()
    assert "Attempts (newest first" in html and "Why isn" in html


def test_viewer_cannot_run_actions(client, demo):
    run = demo["run"]
    active = Run.objects.create(
        namespace="x", status="pending", created_at=run.created_at, updated_at=run.updated_at
    )
    login(client, "viewer")
    # A changelist POST naming an action the viewer may not run does nothing.
    response = client.post(
        url("run_changelist"),
        {"action": "cancel_runs", "_selected_action": [active.pk], "index": 0, "post": "yes"},
    )
    assert response.status_code in (200, 302)
    active.refresh_from_db()
    assert active.cancel_requested_at is None
    for action in RUN_ACTIONS:
        response = client.post(object_action_url("run", run.pk, action), {"post": "yes"})
        assert response.status_code == 403, action
    for action in TASK_ACTIONS:
        response = client.post(
            object_action_url("task", demo["pages"]["task"], action), {"post": "yes"}
        )
        assert response.status_code == 403, action
    assert Run.objects.count() == 2


def test_operator_sees_the_actions(client, demo):
    login(client, "operator")
    runs = client.get(url("run_changelist"))
    choices = [name for name, _ in runs.context["action_form"].fields["action"].choices if name]
    assert choices == list(RUN_ACTIONS)
    tasks = client.get(url("task_changelist"))
    choices = [name for name, _ in tasks.context["action_form"].fields["action"].choices if name]
    assert choices == list(TASK_ACTIONS)
    # no delete_selected anywhere: nobody may delete
    for model in ("event", "contextsnapshot", "attempt", "lease"):
        response = client.get(url(f"{model}_changelist"))
        assert 'name="action"' not in response.content.decode(), model
    # buttons on the detail pages, by the object's state
    html = client.get(url("task_change", demo["tasks"]["fetch-4"].pk)).content.decode()
    assert 'data-action="retry_tasks_cascade"' in html and 'data-action="retry_tasks"' in html
    assert 'data-action="cancel_tasks"' not in html  # finished: nothing to cancel
    html = client.get(url("task_change", demo["tasks"]["flaky"].pk)).content.decode()
    assert 'data-action="requeue_dead_tasks"' in html
    html = client.get(url("task_change", demo["tasks"]["aggregate"].pk)).content.decode()
    assert 'data-action="cancel_tasks"' in html and 'data-action="retry_tasks"' not in html
    html = client.get(url("run_change", demo["run"].pk)).content.decode()
    assert 'data-action="copy_runs"' in html
    assert 'data-action="cancel_runs"' not in html  # the run is finished (failed)


@pytest.mark.parametrize("role", ["superuser", "operator"])
def test_nobody_adds_changes_or_deletes(client, demo, role):
    login(client, role)
    for model in MODELS:
        pk = demo["pages"][model]
        assert client.get(url(f"{model}_add")).status_code == 403, model
        assert client.get(url(f"{model}_delete", pk)).status_code == 403, model
        assert client.post(url(f"{model}_delete", pk), {"post": "yes"}).status_code == 403, model
        # the change page is a read-only view; posting to it is refused
        page = client.get(url(f"{model}_change", pk))
        assert page.status_code == 200 and 'name="_save"' not in page.content.decode(), model
        assert client.post(url(f"{model}_change", pk), {"namespace": "x"}).status_code == 403
    assert Run.objects.get(pk=demo["run"].pk).namespace == "demo"


def test_model_admins_deny_add_change_delete_to_superusers(demo):
    request = RequestFactory().get("/admin/")
    request.user = make_user("superuser", "root")
    for model in (Run, Task, Event, ContextSnapshot, Attempt, Lease):
        model_admin = admin.site._registry[model]
        assert model_admin.has_view_permission(request)
        assert not model_admin.has_add_permission(request), model
        assert not model_admin.has_change_permission(request), model
        assert not model_admin.has_delete_permission(request), model
        for inline in model_admin.get_inline_instances(request):
            assert not inline.has_add_permission(request, None)
            assert not inline.has_change_permission(request)
            assert not inline.has_delete_permission(request)
    assert admin.site._registry[Run].has_operate_runs_permission(request)


def test_object_actions_only_accept_post(client, demo):
    login(client, "operator")
    response = client.get(object_action_url("run", demo["run"].pk, "copy_runs"))
    assert response.status_code == 405
    assert Run.objects.count() == 1


def test_unknown_object_action_or_object(client, demo):
    login(client, "operator")
    response = client.post(object_action_url("run", demo["run"].pk, "delete_selected"))
    assert response.status_code == 403
    assert client.post(object_action_url("run", demo["run"].pk, "nope")).status_code == 403
    missing = "00000000-0000-0000-0000-000000000000"
    assert client.post(object_action_url("run", missing, "copy_runs")).status_code == 404

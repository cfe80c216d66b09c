"""Who may call what: anonymous, plain user, viewer, operator, worker, superuser tokens with
narrowed roles, sessions with CSRF, revoked and expired tokens."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.test import Client

from parallel_mcp import Orchestrator
from parallel_mcp.services.tokens import create_token, revoke_token
from tests.api_helpers import OPERATOR_PERMS, Api, bearer, error_of, make_user, token_for

pytestmark = pytest.mark.django_db
pytest_plugins = ["tests.api_fixtures"]

READ, OPERATE, WORK, META = "read", "operate", "work", "meta"


def endpoints(run_id: str, task_id: str) -> list[tuple[str, str, str]]:
    """(method, path, access) of every endpoint."""
    return [
        ("GET", "runs", READ),
        ("POST", "runs", OPERATE),
        ("GET", f"runs/{run_id}", READ),
        ("POST", f"runs/{run_id}/cancel", OPERATE),
        ("POST", f"runs/{run_id}/copy", OPERATE),
        ("GET", f"runs/{run_id}/context", READ),
        ("POST", f"runs/{run_id}/context", OPERATE),
        ("GET", f"runs/{run_id}/events", READ),
        ("GET", f"runs/{run_id}/tasks", READ),
        ("POST", f"runs/{run_id}/tasks", OPERATE),
        ("POST", f"runs/{run_id}/tasks/batch", OPERATE),
        ("GET", "tasks/pending", READ),
        ("GET", "tasks/dead", READ),
        ("GET", "tasks/stuck", READ),
        ("GET", f"tasks/{task_id}", READ),
        ("POST", f"tasks/{task_id}/resume", OPERATE),
        ("POST", f"tasks/{task_id}/cancel", OPERATE),
        ("POST", f"tasks/{task_id}/retry", OPERATE),
        ("POST", f"tasks/{task_id}/requeue", OPERATE),
        ("POST", "worker/claim", WORK),
        ("POST", "worker/presence", WORK),
        ("POST", "worker/presence/stop", WORK),
        ("POST", f"tasks/{task_id}/running", WORK),
        ("POST", f"tasks/{task_id}/heartbeat", WORK),
        ("POST", f"tasks/{task_id}/progress", WORK),
        ("POST", f"tasks/{task_id}/pause", WORK),
        ("POST", f"tasks/{task_id}/complete", WORK),
        ("POST", f"tasks/{task_id}/fail", WORK),
        ("POST", f"tasks/{task_id}/release", WORK),
        ("GET", "events", READ),
        ("GET", "events/stream?timeout=0", READ),
        ("POST", "maintenance/expire-leases", OPERATE),
        ("POST", "maintenance/prune", OPERATE),
        ("GET", "schema/", META),
        ("GET", "docs/", META),
    ]


def call(api: Api, method: str, path: str):
    if method == "GET":
        response = api.client.get(f"/api/pmcp/{path}")
    else:
        response = api.post(path, {})
    if response.streaming:
        b"".join(response.streaming_content)
    return response


@pytest.fixture
def ids():
    orch = Orchestrator()
    run = orch.create_run(namespace="sec")
    task = orch.enqueue_task(run_id=run.pk, kind="k")
    return str(run.pk), str(task.pk)


def check(api: Api, ids, allowed: set[str], denied_status: int = 403) -> None:
    problems = []
    for method, path, access in endpoints(*ids):
        response = call(api, method, path)
        if access in allowed:
            if response.status_code in (401, 403):
                problems.append(f"{method} {path}: {response.status_code} but should be allowed")
        elif response.status_code != denied_status:
            problems.append(f"{method} {path}: {response.status_code}, expected {denied_status}")
        elif response.status_code in (401, 403):
            error_of(response)
    assert not problems, "\n".join(problems)


def test_anonymous_gets_401_everywhere(anon, ids):
    check(anon, ids, allowed=set(), denied_status=401)
    response = anon.get("runs")
    assert response["WWW-Authenticate"].startswith("Bearer")
    assert error_of(response)["code"] == "not_authenticated"


def test_plain_user_may_only_see_the_schema(plain, ids):
    check(plain, ids, allowed={META})
    assert error_of(plain.get("runs"))["code"] == "permission_denied"


def test_viewer_reads_but_cannot_act(viewer, ids):
    check(viewer, ids, allowed={READ, META})


def test_operator_reads_and_operates_but_is_no_worker(operator, ids):
    check(operator, ids, allowed={READ, OPERATE, META})


def test_worker_user_uses_only_the_worker_protocol(worker, ids):
    check(worker, ids, allowed={WORK, META})


def test_superuser_full_token_may_do_everything(root, ids):
    check(root, ids, allowed={READ, OPERATE, WORK, META})


def test_worker_token_of_a_superuser_reaches_the_worker_protocol_and_reads(root_worker_token, ids):
    """What a handler does through ctx.orchestrator under pmcp_worker --api: work and read
    (never create or operate)."""
    check(root_worker_token, ids, allowed={WORK, READ, META})
    run_id, _ = ids
    message = error_of(root_worker_token.post(f"runs/{run_id}/cancel"))["message"]
    assert "the worker protocol and reads" in message


def test_read_token_of_a_superuser_only_reads(root_read_token, ids):
    check(root_read_token, ids, allowed={READ, META})


def test_each_read_needs_its_own_view_permission(ids):
    run_id, task_id = ids
    only_runs = bearer(token_for(make_user("runs-only", ["view_run"])))
    assert only_runs.get("runs").status_code == 200
    assert only_runs.get(f"runs/{run_id}").status_code == 200
    assert only_runs.get(f"tasks/{task_id}").status_code == 403
    assert only_runs.get("events").status_code == 403
    assert only_runs.get(f"runs/{run_id}/context").status_code == 403


def test_revoked_expired_and_garbage_tokens_are_401(operator_user):
    revoked = create_token(using="default", user=operator_user, name="r")
    revoke_token(using="default", prefix=revoked.token.prefix)
    expired = create_token(
        using="default", user=operator_user, name="e", expires_in=timedelta(microseconds=1)
    )
    good = token_for(operator_user)
    for secret in (revoked.secret, expired.secret, good[:-2] + "xx", "pmcp_nope_nope"):
        response = bearer(secret).get("runs")
        assert response.status_code == 401, secret
        assert error_of(response)["code"] == "authentication_failed"
    # Not a pmcp token at all: left to other authentication classes, then 401.
    response = bearer("eyJhbGciOi.jwt.like").get("runs")
    assert response.status_code == 401
    assert error_of(response)["code"] == "not_authenticated"
    for header in ("Bearer", "Bearer a b", "Bearer \u00e9t\u00e9"):
        response = Api(Client(headers={"Authorization": header})).get("runs")
        assert response.status_code == 401, header
    assert bearer(good).get("runs").status_code == 200


def test_token_of_an_inactive_user_is_401(operator_user):
    secret = token_for(operator_user)
    operator_user.is_active = False
    operator_user.save()
    assert bearer(secret).get("runs").status_code == 401


def test_basic_auth_is_not_accepted():
    make_user("basic", OPERATOR_PERMS)
    response = Api(Client(headers={"Authorization": "Basic YmFzaWM6cHc="})).get("runs")
    assert response.status_code == 401


def test_session_login_reads_and_unsafe_requests_need_csrf():
    make_user("sess", OPERATOR_PERMS)
    client = Client(enforce_csrf_checks=True)
    assert client.login(username="sess", password="pw")
    api = Api(client)
    assert api.get("runs").status_code == 200
    refused = api.post("runs", {"namespace": "s"})
    assert refused.status_code == 403
    assert "CSRF" in error_of(refused)["message"]
    client.get("/admin/login/")  # sets the csrftoken cookie
    token = client.cookies["csrftoken"].value
    created = api.post("runs", {"namespace": "s"}, headers={"X-CSRFToken": token})
    assert created.status_code == 201, created.content


def test_bearer_requests_need_no_csrf(operator_user):
    client = Client(
        enforce_csrf_checks=True,
        headers={"Authorization": f"Bearer {token_for(operator_user)}"},
    )
    assert Api(client).post("runs", {"namespace": "t"}).status_code == 201


def test_authentication_classes_are_configurable(settings, operator_user):
    secret = token_for(operator_user)
    settings.PARALLEL_MCP_API = {
        "AUTHENTICATION_CLASSES": ["rest_framework.authentication.SessionAuthentication"]
    }
    response = bearer(secret).get("runs")
    assert response.status_code == 403  # not authenticated, and sessions send no challenge
    assert error_of(response)["code"] == "not_authenticated"
    settings.PARALLEL_MCP_API = {}
    assert bearer(secret).get("runs").status_code == 200


def test_request_auth_is_the_token_and_last_use_is_recorded(operator_user):
    issued = create_token(using="default", user=operator_user, name="t")
    assert issued.token.last_used_at is None
    assert bearer(issued.secret).get("runs").status_code == 200
    issued.token.refresh_from_db()
    assert issued.token.last_used_at is not None

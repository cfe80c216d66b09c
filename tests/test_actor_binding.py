"""What a credential may act as (parallel_mcp.actors): a lease, and a client token, belong to
the principal that took them; a token can be bound to a worker-id prefix; events record who
acted; leases have a ceiling."""

from __future__ import annotations

from datetime import timedelta

import anyio
import pytest
from django.core.management import call_command

from parallel_mcp import Orchestrator
from parallel_mcp.actors import Actor, acting_as
from parallel_mcp.exceptions import (
    IdempotencyConflictError,
    LeaseConflictError,
    PermissionDeniedError,
    ValidationError,
)
from parallel_mcp.models import ApiToken, Event, Lease, Task
from parallel_mcp.services import complete_tasks
from tests.api_helpers import WORKER_PERMS, bearer, error_of, make_user, token_for
from tests.conftest import at
from tests.mcp_support import LiveServer, call, fail, http_session

pytest_plugins = ["tests.api_fixtures"]

ALICE = Actor(principal="token:alice")
MALLORY = Actor(principal="token:mallory")


def _two_workers():
    """Two worker tokens of two users, as API clients."""
    alice = bearer(token_for(make_user("alice", WORKER_PERMS), role="worker"))
    mallory = bearer(token_for(make_user("mallory", WORKER_PERMS), role="worker"))
    return alice, mallory


# -- the HTTP API: the attack of the issue -----------------------------------------------------


def test_another_token_can_neither_replay_nor_use_a_lease_it_did_not_take(orch, run):
    alice, mallory = _two_workers()
    task = orch.enqueue_task(run_id=run.pk, kind="k")
    body = {"worker_id": "alice-1", "client_token": "alice-claim", "lease_ms": 60_000}
    claim = alice.post("worker/claim", body).json()
    lease = {"lease_id": claim["lease"]["id"], "worker_id": "alice-1"}

    stolen = mallory.post("worker/claim", body)  # same worker id and client token
    assert stolen.status_code == 409 and error_of(stolen)["code"] == "idempotency_conflict"
    assert claim["lease"]["id"] not in stolen.content.decode()
    for action, extra in (
        ("heartbeat", {"lease_ms": 3_600_000}),
        ("running", {}),
        ("progress", {"progress": 0.5}),
        ("complete", {"output": "mine"}),
        ("fail", {"error": "x"}),
        ("release", {}),
        ("pause", {"status": "blocked"}),
    ):
        response = mallory.post(f"tasks/{task.pk}/{action}", {**lease, **extra})
        assert response.status_code == 409, (action, response.content)
        assert error_of(response)["code"] == "lease_conflict"
    held = Task.objects.get(pk=task.pk)
    assert (held.status, held.leased_by, held.output) == ("leased", "alice-1", None)
    assert held.lease_expires_at == Lease.objects.get(pk=claim["lease"]["id"]).expires_at

    # The rightful holder goes on as before, its replay included.
    assert alice.post("worker/claim", body).json()["lease"]["id"] == claim["lease"]["id"]
    done = alice.post(f"tasks/{task.pk}/complete", {**lease, "client_token": "alice-done"})
    assert done.status_code == 200 and done.json()["status"] == "completed"
    replay = mallory.post(f"tasks/{task.pk}/complete", {**lease, "client_token": "alice-done"})
    assert replay.status_code == 409 and error_of(replay)["code"] == "idempotency_conflict"


def test_a_token_cannot_use_a_lease_taken_in_process(orch, run, worker):
    """Lease ids are visible to readers; a local worker's lease is not a token's to use."""
    task = orch.enqueue_task(run_id=run.pk, kind="k")
    claim = orch.claim_next_task(worker_id="local-1")
    lease = {"lease_id": str(claim.lease.pk), "worker_id": "local-1"}
    response = worker.post(f"tasks/{task.pk}/complete", lease)
    assert response.status_code == 409 and error_of(response)["code"] == "lease_conflict"
    orch.complete_task(task_id=task.pk, lease_id=claim.lease.pk, worker_id="local-1")


def test_a_worker_prefix_binds_the_worker_ids_a_token_may_claim_as(orch, run):
    user = make_user("builder", WORKER_PERMS)
    api = bearer(token_for(user, role="worker", worker_prefix="build-7/"))
    orch.enqueue_task(run_id=run.pk, kind="k")
    refused = api.post("worker/claim", {"worker_id": "alice-1"})
    assert refused.status_code == 403 and error_of(refused)["code"] == "permission_denied"
    assert error_of(refused)["details"]["worker_prefix"] == "build-7/"
    refused = api.post("worker/claim/batch", {"worker_id": "x", "limit": 2})
    assert refused.status_code == 403
    assert Task.objects.get().status == "queued"
    assert api.post("worker/claim", {"worker_id": "build-7/host:1"}).status_code == 200


def test_events_record_who_acted(orch, run, operator, worker):
    orch.enqueue_task(run_id=run.pk, kind="local")  # in process: no actor
    created = operator.post(f"runs/{run.pk}/tasks", {"kind": "k"}).json()
    claim = worker.post("worker/claim", {"worker_id": "w", "kinds": ["k"]}).json()
    actors = {
        (event.event_type, event.task_id and str(event.task_id)): event.actor
        for event in Event.objects.filter(run_id=run.pk)
    }
    operator_token = ApiToken.objects.get(user__username="operator").prefix
    worker_token = ApiToken.objects.get(user__username="worker").prefix
    assert actors[("task.enqueued", created["id"])] == f"token:{operator_token}"
    assert actors[("task.claimed", created["id"])] == f"token:{worker_token}"
    local = Task.objects.get(kind="local")
    assert actors[("task.enqueued", str(local.pk))] is None
    assert Lease.objects.get(pk=claim["lease"]["id"]).principal == f"token:{worker_token}"


def test_admin_actions_record_the_signed_in_user(client, orch, run, root_user):
    task = orch.enqueue_task(run_id=run.pk, kind="k")
    client.force_login(root_user)
    response = client.post(
        f"/admin/parallel_mcp/task/{task.pk}/actions/cancel_tasks/", {"post": "yes"}
    )
    assert response.status_code == 302, response.content[:500]
    cancelled = Event.objects.get(task_id=task.pk, event_type="task.cancelled")
    assert cancelled.actor == f"user:{root_user.pk}"


# -- the services, for every door ----------------------------------------------------------


def test_fences_compare_the_principal(orch, run):
    orch.enqueue_task(run_id=run.pk, kind="k")
    with acting_as(ALICE):
        claim = orch.claim_next_task(worker_id="w", client_token="t1", now=at(1))
    ids = {"task_id": claim.task.pk, "lease_id": claim.lease.pk, "worker_id": "w"}
    assert claim.lease.principal == "token:alice"
    with acting_as(MALLORY):
        with pytest.raises(IdempotencyConflictError):
            orch.claim_next_task(worker_id="w", client_token="t1", now=at(1))
        with pytest.raises(LeaseConflictError, match="another principal"):
            orch.heartbeat_lease(**ids, now=at(2))
        with pytest.raises(LeaseConflictError):
            orch.mark_task_running(**ids, now=at(2))
        with pytest.raises(LeaseConflictError):
            orch.complete_task(**ids, now=at(2))
    with acting_as(ALICE):
        orch.heartbeat_lease(**ids, now=at(2))
        assert orch.claim_next_task(worker_id="w", client_token="t1", now=at(3)).lease == (
            claim.lease
        )
        orch.complete_task(**ids, now=at(3))
    assert Task.objects.get(pk=claim.task.pk).lease_principal is None


def test_batch_claims_record_and_check_the_principal(orch, run):
    for _ in range(3):
        orch.enqueue_task(run_id=run.pk, kind="k")
    with acting_as(ALICE):
        claims = orch.claim_next_tasks(worker_id="w", limit=3, client_token="b", now=at(1))
    assert {c.lease.principal for c in claims} == {"token:alice"}
    with acting_as(MALLORY), pytest.raises(IdempotencyConflictError):
        orch.claim_next_tasks(worker_id="w", limit=3, client_token="b", now=at(1))
    items = [{"task_id": c.task.pk, "lease_id": c.lease.pk} for c in claims]
    with acting_as(MALLORY):
        outcomes = complete_tasks(using="default", worker_id="w", items=items, now=at(2))
    assert all(isinstance(outcome, LeaseConflictError) for outcome in outcomes), outcomes
    with acting_as(ALICE):
        outcomes = complete_tasks(using="default", worker_id="w", items=items, now=at(2))
    assert [o.status for o in outcomes] == ["completed"] * 3


def test_worker_prefix_is_checked_by_the_services(orch, run):
    orch.enqueue_task(run_id=run.pk, kind="k")
    bound = Actor(principal="token:b", worker_prefix="ci/")
    with acting_as(bound):
        with pytest.raises(PermissionDeniedError, match="must start with 'ci/'"):
            orch.claim_next_task(worker_id="laptop")
        with pytest.raises(PermissionDeniedError):
            orch.claim_next_tasks(worker_id="laptop", limit=2)
        assert orch.claim_next_task(worker_id="ci/runner-1") is not None


def test_lease_ms_has_a_configurable_ceiling(orch, run, settings):
    orch.enqueue_task(run_id=run.pk, kind="k")
    with pytest.raises(ValidationError, match=r"lease_ms must be <= 3600000"):
        orch.claim_next_task(worker_id="w", lease_ms=3_600_001)
    with pytest.raises(ValidationError, match="default_lease_ms"):
        Orchestrator(default_lease_ms=10 * 3_600_000)
    claim = orch.claim_next_task(worker_id="w", lease_ms=3_600_000, now=at(1))
    ids = {"task_id": claim.task.pk, "lease_id": claim.lease.pk, "worker_id": "w"}
    with pytest.raises(ValidationError):
        orch.heartbeat_lease(**ids, lease_ms=10 * 365 * 24 * 3_600_000, now=at(2))
    settings.PARALLEL_MCP = {**settings.PARALLEL_MCP, "MAX_LEASE_MS": 7_200_000}
    lease = orch.heartbeat_lease(**ids, lease_ms=7_200_000, now=at(2))
    assert lease.expires_at == at(2) + timedelta(hours=2)


def test_the_api_states_and_applies_the_lease_ceiling(worker, operator, orch, run, settings):
    orch.enqueue_task(run_id=run.pk, kind="k")
    refused = worker.post("worker/claim", {"worker_id": "w", "lease_ms": 3_600_001})
    assert refused.status_code == 400 and error_of(refused)["details"]["field"] == "lease_ms"
    schema = operator.get("schema/", HTTP_ACCEPT="application/json").json()
    lease_ms = schema["components"]["schemas"]["ClaimIn"]["properties"]["lease_ms"]
    (integer,) = [part for part in lease_ms["anyOf"] if part.get("type") == "integer"]
    assert integer["maximum"] == 3_600_000
    settings.PARALLEL_MCP = {**settings.PARALLEL_MCP, "MAX_LEASE_MS": 60_000}
    refused = worker.post("worker/claim", {"worker_id": "w", "lease_ms": 60_001})
    assert refused.status_code == 400


def test_pmcp_token_create_binds_a_worker_prefix(db, capsys):
    make_user("ci")
    call_command("pmcp_token", "create", "--user", "ci", "--name", "ci", "--role", "worker",
                 "--worker-prefix", "ci/")  # fmt: skip
    assert ApiToken.objects.get().worker_prefix == "ci/"


# -- the MCP HTTP transport ----------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_mcp_tokens_cannot_use_each_others_leases():
    orch = Orchestrator()
    run = orch.create_run()
    task = orch.enqueue_task(run_id=run.pk, kind="k")
    alice, mallory = (
        token_for(make_user(name, WORKER_PERMS), role="worker") for name in ("a", "m")
    )
    server = LiveServer()
    try:

        async def scenario():
            async with http_session(server.url, alice) as mine:
                claim = (await call(mine, "claim_next_task", worker_id="a-1"))["claim"]
            refs = {"task_id": str(task.pk), "lease_id": claim["lease"]["id"], "worker_id": "a-1"}
            async with http_session(server.url, mallory) as theirs:
                error = await fail(theirs, "heartbeat_lease", {**refs, "lease_ms": 60_000})
                assert error["code"] == "lease_conflict"
                error = await fail(theirs, "complete_task", refs)
                assert error["code"] == "lease_conflict"
            async with http_session(server.url, alice) as mine:
                await call(mine, "complete_task", **refs)

        anyio.run(scenario)
    finally:
        server.stop()
    assert Task.objects.get(pk=task.pk).status == "completed"
    prefixes = {t.user.username: t.prefix for t in ApiToken.objects.select_related("user")}
    claimed = Event.objects.get(task_id=task.pk, event_type="task.claimed")
    assert claimed.actor == f"token:{prefixes['a']}"

"""Batch claims (``POST worker/claim/batch``) and claims straight into running (``start``) over
the HTTP API."""

from __future__ import annotations

import pytest

from parallel_mcp import Orchestrator
from parallel_mcp.models import Event, Lease
from tests.api_helpers import error_of
from tests.test_api_runs import RUN_FIELDS
from tests.test_api_tasks import TASK_FIELDS
from tests.test_api_worker import ATTEMPT_FIELDS, LEASE_FIELDS, lease

pytestmark = pytest.mark.django_db
pytest_plugins = ["tests.api_fixtures"]

BATCH = "worker/claim/batch"


@pytest.fixture
def orch() -> Orchestrator:
    return Orchestrator()


@pytest.fixture
def run(orch):
    return orch.create_run(namespace="batch", context={"release": 7})


def batch(api, worker_id="w1", **body) -> list[dict]:
    response = api.post(BATCH, {"worker_id": worker_id, **body})
    assert response.status_code == 200, response.content
    assert set(response.json()) == {"claims"}
    return response.json()["claims"]


def event_types(task_id) -> list[str]:
    return list(
        Event.objects.filter(task_id=task_id).order_by("id").values_list("event_type", flat=True)
    )


def test_a_batch_in_claim_order_shaped_like_single_claims(worker, orch, run):
    low = orch.enqueue_task(run_id=run.pk, kind="k", input={"n": 1})
    high = orch.enqueue_task(run_id=run.pk, kind="k", priority=9)
    orch.enqueue_task(run_id=run.pk, kind="other")
    dependent = orch.enqueue_task(run_id=run.pk, kind="k", depends_on=[low.pk])
    bare = orch.create_run()
    elsewhere = orch.enqueue_task(run_id=bare.pk, kind="k")

    claims = batch(worker, limit=10, kinds=["k"], lease_ms=60_000)
    assert [c["task"]["id"] for c in claims] == [str(high.pk), str(low.pk), str(elsewhere.pk)]
    for item in claims:
        assert set(item) == {"run", "task", "attempt", "lease", "context"}
        assert set(item["run"]) == RUN_FIELDS and set(item["task"]) == TASK_FIELDS
        assert set(item["lease"]) == LEASE_FIELDS and set(item["attempt"]) == ATTEMPT_FIELDS
        assert item["task"]["status"] == "leased" and item["attempt"]["status"] == "leased"
        assert item["task"]["lease_id"] == item["lease"]["id"]
    assert [c["context"] for c in claims] == [{"release": 7}, {"release": 7}, None]
    assert claims[1]["task"]["input"] == {"n": 1}
    assert len({c["lease"]["id"] for c in claims}) == 3
    assert orch.get_task(task_id=dependent.pk).status == "queued"
    # Nothing claimable: 200 with an empty list (not 204 as a single claim).
    assert batch(worker, limit=10, kinds=["k"]) == []
    # limit caps the batch; the claims work like any other.
    assert [c["task"]["kind"] for c in batch(worker, limit=1)] == ["other"]
    path = f"tasks/{claims[0]['task']['id']}"
    assert worker.post(f"{path}/running", lease(claims[0])).json()["status"] == "running"
    assert worker.post(f"{path}/complete", lease(claims[0])).json()["status"] == "completed"


def test_a_dependency_list_comes_with_each_task(worker, orch, run):
    first = orch.enqueue_task(run_id=run.pk, kind="a")
    second = orch.enqueue_task(run_id=run.pk, kind="b", depends_on=[first.pk])
    claimed = orch.claim_next_task(worker_id="w1", kinds=["a"])
    orch.complete_task(task_id=first.pk, lease_id=claimed.lease.pk, worker_id="w1")
    (item,) = batch(worker, limit=5)
    assert item["task"]["id"] == str(second.pk)
    assert item["task"]["depends_on_task_ids"] == [str(first.pk)]


def test_the_same_client_token_replays_the_whole_batch(worker, orch, run):
    for _ in range(3):
        orch.enqueue_task(run_id=run.pk, kind="k")
    first = batch(worker, limit=2, client_token="b-1")
    assert [c["lease"]["client_token"] for c in first] == ["b-1#0", "b-1#1"]
    again = batch(worker, limit=2, client_token="b-1")
    assert [c["lease"]["id"] for c in again] == [c["lease"]["id"] for c in first]
    assert [c["context"] for c in again] == [{"release": 7}, {"release": 7}]
    assert Lease.objects.count() == 2
    other = worker.post(BATCH, {"worker_id": "w2", "limit": 2, "client_token": "b-1"})
    assert other.status_code == 409 and error_of(other)["code"] == "idempotency_conflict"
    assert len(orch.list_pending_tasks(run_id=run.pk)) == 1


@pytest.mark.parametrize("limit", [0, 101, -5, "x", True, False, None, 1.5, [2], {"n": 2}])
def test_a_bad_limit_is_400(worker, orch, run, limit):
    orch.enqueue_task(run_id=run.pk, kind="k")
    response = worker.post(BATCH, {"worker_id": "w", "limit": limit})
    assert response.status_code == 400, response.content
    error = error_of(response)
    assert error["code"] == "validation_error" and "limit" in error["details"]["fields"]
    assert error["message"].startswith("limit: ")
    assert orch.list_pending_tasks(run_id=run.pk)[0].status == "queued"


def test_limit_is_required_and_the_rest_is_checked_like_a_claim(worker):
    error = error_of(worker.post(BATCH, {"worker_id": "w"}))
    assert error["code"] == "validation_error" and set(error["details"]["fields"]) == {"limit"}
    for body, field in [
        ({"limit": 1}, "worker_id"),
        ({"worker_id": "w", "limit": 1, "lease_ms": 0}, "lease_ms"),
        ({"worker_id": "w", "limit": 1, "kinds": []}, "kinds"),
        ({"worker_id": "w", "limit": 1, "start": "maybe"}, "start"),
        ({"worker_id": "w", "limit": 1, "start": None}, "start"),
        ({"worker_id": "w", "limit": 1, "client_token": "t" * 198}, "client_token"),
    ]:
        response = worker.post(BATCH, body)
        assert response.status_code == 400, (body, response.content)
        assert field in error_of(response)["details"]["fields"], body
    for body in ([], "x", 3):
        assert worker.post(BATCH, body).status_code == 400
    response = worker.post(BATCH, {"worker_id": "w", "limit": 2, "client_token": "t" * 197})
    assert response.status_code == 200


def test_start_claims_straight_into_running(worker, orch, run):
    single = orch.enqueue_task(run_id=run.pk, kind="one")
    many = [orch.enqueue_task(run_id=run.pk, kind="many") for _ in range(2)]
    response = worker.post("worker/claim", {"worker_id": "w", "kinds": ["one"], "start": True})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["task"]["status"] == "running" and body["attempt"]["status"] == "running"
    assert body["task"]["started_at"] and body["attempt"]["started_at"]
    claims = batch(worker, limit=5, kinds=["many"], start=True)
    assert [c["task"]["status"] for c in claims] == ["running", "running"]
    assert {c["attempt"]["status"] for c in claims} == {"running"}
    for task in (single, *many):
        assert event_types(task.pk) == ["task.enqueued", "task.claimed", "task.running"]
    done = worker.post(f"tasks/{single.pk}/complete", lease(body))
    assert done.status_code == 200 and done.json()["status"] == "completed"


def test_start_false_and_absent_leave_the_task_leased(worker, orch, run):
    orch.enqueue_task(run_id=run.pk, kind="k")
    orch.enqueue_task(run_id=run.pk, kind="k")
    body = worker.post("worker/claim", {"worker_id": "w", "start": False}).json()
    assert body["task"]["status"] == "leased"
    assert batch(worker, limit=1)[0]["task"]["status"] == "leased"
    bad = worker.post("worker/claim", {"worker_id": "w", "start": "nope"})
    assert bad.status_code == 400 and "start" in error_of(bad)["details"]["fields"]


@pytest.mark.parametrize("fixture", ["root_read_token", "viewer", "operator", "plain", "anon"])
def test_only_the_worker_protocol_may_claim_a_batch(request, orch, run, fixture):
    orch.enqueue_task(run_id=run.pk, kind="k")
    api = request.getfixturevalue(fixture)
    response = api.post(BATCH, {"worker_id": "w", "limit": 1})
    assert response.status_code == (401 if fixture == "anon" else 403), response.content
    assert error_of(response)["code"] in ("not_authenticated", "permission_denied")
    assert orch.list_pending_tasks(run_id=run.pk)[0].status == "queued"


def test_a_superusers_worker_token_may_claim_a_batch(root_worker_token, orch, run):
    orch.enqueue_task(run_id=run.pk, kind="k")
    assert len(batch(root_worker_token, limit=3)) == 1


def test_the_batch_endpoint_is_throttled_with_the_worker_scope(worker, orch, run, settings):
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"pmcp": None, "pmcp_worker": "1/minute"},
    }
    assert worker.post(BATCH, {"worker_id": "w", "limit": 1}).status_code == 200
    response = worker.post(BATCH, {"worker_id": "w", "limit": 1})
    assert response.status_code == 429 and error_of(response)["code"] == "throttled"


# -- batch tokens next to single-claim tokens -------------------------------------------------


def test_a_batch_token_that_prefixes_a_single_claims_token_is_not_a_500(worker, orch, run):
    orch.enqueue_task(run_id=run.pk, kind="k")
    orch.enqueue_task(run_id=run.pk, kind="k")
    assert (
        worker.post("worker/claim", {"worker_id": "w", "client_token": "job#abc"}).status_code
        == 200
    )
    response = worker.post(BATCH, {"worker_id": "w", "limit": 1, "client_token": "job"})
    assert response.status_code < 500, response.content


def test_the_orchestrator_refuses_a_batch_token_too_long_for_its_suffix(orch, run):
    from parallel_mcp.exceptions import ValidationError

    orch.enqueue_task(run_id=run.pk, kind="k")
    with pytest.raises(ValidationError):
        orch.claim_next_tasks(worker_id="w", limit=1, client_token="t" * 200)

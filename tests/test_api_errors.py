"""Every error of the API in the envelope with its status: each ParallelMcpError code, DRF's
own errors, body size limits, throttling, hostile input, and the safety nets."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import IntegrityError, OperationalError
from django.test import Client
from django.utils import timezone

from parallel_mcp import Orchestrator, exceptions
from parallel_mcp.api.errors import STATUS_BY_CODE
from parallel_mcp.models import Run, Task
from tests.api_helpers import error_of

pytestmark = pytest.mark.django_db
pytest_plugins = ["tests.api_fixtures"]


@pytest.fixture
def orch() -> Orchestrator:
    return Orchestrator()


@pytest.fixture
def run(orch):
    return orch.create_run(namespace="errors")


def expect(response, status: int, code: str) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    error = error_of(response)
    assert error["code"] == code, error
    return error


def lease_of(claim) -> dict:
    return {"lease_id": str(claim.lease.pk), "worker_id": claim.lease.worker_id}


# -- the status of every ParallelMcpError ------------------------------------------------------


def _all_subclasses(cls):
    for sub in cls.__subclasses__():
        yield sub
        yield from _all_subclasses(sub)


def test_every_error_class_has_a_status():
    codes = {
        cls.code
        for cls in _all_subclasses(exceptions.ParallelMcpError)
        if cls.__module__ == exceptions.__name__  # not client-side errors (remote worker)
    }
    assert codes <= set(STATUS_BY_CODE), codes - set(STATUS_BY_CODE)
    assert STATUS_BY_CODE == {
        "not_found": 404,
        "validation_error": 400,
        "dependency_cycle": 400,
        "invalid_dependency": 400,
        "lease_conflict": 409,
        "invalid_transition": 409,
        "duplicate_task_key": 409,
        "duplicate_id": 409,
        "idempotency_conflict": 409,
        "run_terminal": 409,
        "permission_denied": 403,
        "lease_expired": 410,
    }


def test_not_found_404(operator, worker):
    missing = uuid.uuid4()
    error = expect(operator.get(f"runs/{missing}"), 404, "not_found")
    assert error["details"] == {"run_id": str(missing)}
    expect(operator.get(f"tasks/{missing}"), 404, "not_found")
    expect(operator.post(f"runs/{missing}/cancel"), 404, "not_found")
    expect(operator.post(f"runs/{missing}/tasks", {"kind": "k"}), 404, "not_found")
    expect(operator.post(f"tasks/{missing}/cancel"), 404, "not_found")
    expect(operator.get(f"runs/{missing}/events"), 404, "not_found")
    lease = {"lease_id": str(uuid.uuid4()), "worker_id": "w"}
    expect(worker.post(f"tasks/{missing}/running", lease), 404, "not_found")


def test_validation_error_400_from_the_orchestrator(operator, run):
    error = expect(
        operator.post(
            f"runs/{run.pk}/tasks", {"kind": "k", "context_snapshot_id": str(uuid.uuid4())}
        ),
        400,
        "validation_error",
    )
    assert error["details"]["field"] == "context_snapshot_id"


def test_a_caller_supplied_id_already_taken_is_409_duplicate_id(orch, operator, run):
    """Issue 14: a well-formed create whose id is taken was 400 validation_error; it is refused
    because of what is stored, so 409, with a code of its own, for runs, tasks and snapshots."""
    task = orch.enqueue_task(run_id=run.pk, kind="k")
    snapshot = orch.append_context_snapshot(run_id=run.pk, payload={"v": 1})
    error = expect(operator.post("runs", {"id": str(run.pk)}), 409, "duplicate_id")
    assert error["details"] == {"run_id": str(run.pk)}
    error = expect(
        operator.post(f"runs/{run.pk}/tasks", {"kind": "k", "id": str(task.pk)}),
        409,
        "duplicate_id",
    )
    assert error["details"] == {"task_id": str(task.pk)}
    batch = {"tasks": [{"kind": "k"}, {"kind": "k", "id": str(task.pk)}]}
    expect(operator.post(f"runs/{run.pk}/tasks/batch", batch), 409, "duplicate_id")
    error = expect(
        operator.post(f"runs/{run.pk}/context", {"payload": 2, "id": str(snapshot.pk)}),
        409,
        "duplicate_id",
    )
    assert error["details"] == {"snapshot_id": str(snapshot.pk)}
    assert (Run.objects.count(), Task.objects.count()) == (1, 1)
    assert orch.get_current_context_snapshot(run_id=run.pk).pk == snapshot.pk


def test_validation_error_400_from_the_serializers(operator, run):
    error = expect(operator.post(f"runs/{run.pk}/tasks", {}), 400, "validation_error")
    assert error["details"]["fields"] == {"kind": ["This field is required."]}
    assert error["message"] == "kind: This field is required."
    error = expect(
        operator.post(f"runs/{run.pk}/tasks/batch", {"tasks": [{"kind": "a"}, {"kind": ""}]}),
        400,
        "validation_error",
    )
    assert error["message"].startswith("tasks.1.kind:")
    expect(operator.post("runs", {"max_parallel": 0}), 400, "validation_error")
    expect(operator.post("runs", {"nmespace": "typo"}), 400, "validation_error")
    expect(operator.post("runs", ["not", "an", "object"]), 400, "validation_error")


def test_dependency_cycle_400(operator, run):
    error = expect(
        operator.post(
            f"runs/{run.pk}/tasks/batch",
            {
                "tasks": [
                    {"kind": "k", "key": "a", "depends_on": ["b"]},
                    {"kind": "k", "key": "b", "depends_on": ["a"]},
                ]
            },
        ),
        400,
        "dependency_cycle",
    )
    assert set(error["details"]["cycle"]) == {"a", "b"}
    assert not Task.objects.exists()


def test_invalid_dependency_400(operator, run):
    unknown = str(uuid.uuid4())
    error = expect(
        operator.post(f"runs/{run.pk}/tasks", {"kind": "k", "depends_on": [unknown]}),
        400,
        "invalid_dependency",
    )
    assert error["details"]["dependency"] == unknown


def test_lease_conflict_409(orch, run, worker):
    orch.enqueue_task(run_id=run.pk, kind="k")
    claim = orch.claim_next_task(worker_id="w1")
    error = expect(
        worker.post(
            f"tasks/{claim.task.pk}/complete",
            {"lease_id": str(claim.lease.pk), "worker_id": "someone-else"},
        ),
        409,
        "lease_conflict",
    )
    assert error["details"]["cancelled"] is False


def test_invalid_transition_409(orch, run, operator, worker):
    task = orch.enqueue_task(run_id=run.pk, kind="k")
    expect(operator.post(f"tasks/{task.pk}/resume"), 409, "invalid_transition")
    with worker.acting():
        claim = orch.claim_next_task(worker_id="w1")
    assert worker.post(f"tasks/{task.pk}/running", lease_of(claim)).status_code == 200
    expect(worker.post(f"tasks/{task.pk}/running", lease_of(claim)), 409, "invalid_transition")


def test_duplicate_task_key_409(operator, run):
    assert operator.post(f"runs/{run.pk}/tasks", {"kind": "k", "key": "a"}).status_code == 201
    error = expect(
        operator.post(f"runs/{run.pk}/tasks", {"kind": "k", "key": "a"}), 409, "duplicate_task_key"
    )
    assert error["details"]["key"] == "a"


def test_idempotency_conflict_409(orch, run, worker):
    orch.enqueue_task(run_id=run.pk, kind="k")
    orch.enqueue_task(run_id=run.pk, kind="k")
    with worker.acting():
        first = orch.claim_next_task(worker_id="w1")
        second = orch.claim_next_task(worker_id="w1")
    body = {**lease_of(first), "client_token": "tok-1"}
    assert worker.post(f"tasks/{first.task.pk}/complete", body).status_code == 200
    body = {**lease_of(second), "client_token": "tok-1"}
    expect(worker.post(f"tasks/{second.task.pk}/complete", body), 409, "idempotency_conflict")


def test_run_terminal_409(orch, run, operator):
    orch.cancel_run(run_id=run.pk)
    expect(operator.post(f"runs/{run.pk}/tasks", {"kind": "k"}), 409, "run_terminal")


def test_lease_expired_410(orch, run, worker):
    orch.enqueue_task(run_id=run.pk, kind="k")
    with worker.acting():
        claim = orch.claim_next_task(
            worker_id="w1", lease_ms=1_000, now=timezone.now() - timedelta(hours=1)
        )
    error = expect(
        worker.post(f"tasks/{claim.task.pk}/heartbeat", lease_of(claim)), 410, "lease_expired"
    )
    assert error["details"]["lease_id"] == str(claim.lease.pk)


# -- DRF's own errors --------------------------------------------------------------------------


def test_parse_errors_400(operator):
    expect(operator.post("runs", "{"), 400, "parse_error")
    expect(operator.post("runs", '{"metadata": NaN}'), 400, "parse_error")
    expect(operator.post("runs", '{"metadata": Infinity}'), 400, "parse_error")
    expect(operator.post("runs", '{"metadata": 1e999}'), 400, "parse_error")
    expect(operator.post("runs", b"\xff\xfe"), 400, "parse_error")


def test_parse_errors_say_what_is_wrong_in_the_apis_words(operator):
    """Python's own limits are reached but not named (no recursion, no sys.set_int_max_str_…)."""
    deep = expect(operator.post("runs", "[" * 100_000 + "]" * 100_000), 400, "parse_error")
    assert deep["message"] == "JSON parse error - nested too deeply to decode."
    huge = expect(operator.post("runs", '{"metadata": ' + "9" * 5000 + "}"), 400, "parse_error")
    assert (
        huge["message"] == "JSON parse error - a number has 5000 digits, more than the 4300 allowed"
    )
    fine = operator.post("runs", '{"metadata": {"n": -' + "9" * 4300 + "}}")
    assert fine.status_code == 201, fine.content
    twice = operator.post("runs", '{"namespace": "a", "metadata": {"k": 1, "k": 2}}')
    message = expect(twice, 400, "parse_error")["message"]
    assert message == "JSON parse error - the name 'k' appears twice in one object"
    assert not Run.objects.filter(namespace="a").exists()


def test_unknown_path_404_in_the_envelope(operator, anon):
    expect(operator.get("no/such/endpoint"), 404, "not_found")
    csrf_client = Client(enforce_csrf_checks=True)
    response = csrf_client.post("/api/pmcp/tasks/not-a-uuid/complete", {})
    expect(response, 404, "not_found")
    expect(operator.get("runs/not-a-uuid"), 404, "not_found")
    expect(operator.get("tasks/%0Anewline/fail"), 404, "not_found")
    expect(anon.post("worker/claim/"), 404, "not_found")


def test_method_not_allowed_405(operator):
    response = operator.request("DELETE", "runs")
    expect(response, 405, "method_not_allowed")
    assert "GET" in response["Allow"] and "POST" in response["Allow"]
    expect(operator.request("PUT", "worker/claim"), 403, "permission_denied")  # no work perm
    expect(operator.request("OPTIONS", "runs"), 405, "method_not_allowed")


def test_not_acceptable_406(operator):
    expect(operator.get("runs", HTTP_ACCEPT="text/html"), 406, "not_acceptable")


def test_unsupported_media_type_415(operator):
    response = operator.client.post(
        "/api/pmcp/runs", data="namespace=x", content_type="application/x-www-form-urlencoded"
    )
    expect(response, 415, "unsupported_media_type")


def test_body_larger_than_the_limit_is_413_and_not_read(operator, settings):
    settings.PARALLEL_MCP_API = {"MAX_BODY_BYTES": 1_000}
    error = expect(operator.post("runs", {"metadata": "x" * 2_000}), 413, "request_too_large")
    assert error["details"]["limit"] == 1_000
    assert not Run.objects.exists()
    assert operator.post("runs", {"metadata": "x" * 100}).status_code == 201


def test_default_body_limit_is_django_data_upload_max_memory_size(operator, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 5_000
    expect(operator.post("runs", {"metadata": "x" * 6_000}), 413, "request_too_large")


def test_huge_input_is_refused_and_never_stored(operator, run, settings):
    settings.PARALLEL_MCP = {**settings.PARALLEL_MCP, "MAX_JSON_BYTES": 1_000}
    error = expect(
        operator.post(f"runs/{run.pk}/tasks", {"kind": "k", "input": {"blob": "x" * 5_000}}),
        400,
        "validation_error",
    )
    assert error["details"]["field"] == "input"
    assert not Task.objects.exists()
    huge = {"kind": "k", "input": "x" * 4_000_000}  # above Django's 2.5 MB default
    expect(operator.post(f"runs/{run.pk}/tasks", huge), 413, "request_too_large")
    assert not Task.objects.exists()


def test_throttling_429_with_retry_after(operator, worker, settings):
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"pmcp": "2/minute", "pmcp_worker": None},
    }
    assert operator.get("runs").status_code == 200
    assert operator.get("runs").status_code == 200
    response = operator.get("runs")
    error = expect(response, 429, "throttled")
    assert int(response["Retry-After"]) > 0
    assert error["details"]["wait"] > 0
    for _ in range(5):  # the worker scope is not throttled at all here
        assert worker.post("worker/claim", {"worker_id": "w"}).status_code == 204


# -- hostile input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        {"kind": "k", "input": {"a": "nul\u0000byte"}},
        {"kind": "k", "input": {"nul\u0000key": 1}},
        {"kind": "k", "metadata": ["\ud800"]},
        {"kind": "nul\u0000kind"},
        {"kind": "\ud800"},
        {"kind": "k", "key": "a\u0000"},
        {"kind": "k", "priority": 10**30},
        {"kind": "k", "retry": {"delay_ms": 10**30}},
        {"kind": "k", "retry": {"delay_ms": 1, "bogus": 1}},
        {"kind": "k", "timeout_ms": -1},
        {"kind": "k", "not_before": "not a date"},
        {"kind": "k", "not_before": "0001-01-01T00:00:00+14:00"},
        {"kind": "k", "depends_on": "abc"},
        {"kind": "k", "depends_on": [{"task_id": 1}]},
        {"kind": "k", "depends_on": [{"task_id": "x", "required": "maybe"}]},
        {"kind": "k", "id": "not-a-uuid"},
        {"kind": 12},
        {"kind": ["k"]},
        {"kind": "k" * 201},
    ],
)
def test_hostile_task_input_is_400(operator, run, body):
    response = operator.post(f"runs/{run.pk}/tasks", body)
    assert response.status_code == 400, response.content
    error_of(response)
    assert not Task.objects.exists()


def test_hostile_worker_input_is_4xx(orch, run, worker):
    orch.enqueue_task(run_id=run.pk, kind="k")
    claim = orch.claim_next_task(worker_id="w1")
    path = f"tasks/{claim.task.pk}"
    for body in (
        {"lease_id": "nope", "worker_id": "w1"},
        {"lease_id": str(claim.lease.pk)},
        {"lease_id": str(claim.lease.pk), "worker_id": "w1\u0000"},
        {"lease_id": str(claim.lease.pk), "worker_id": "w1", "lease_ms": 0},
        {"lease_id": str(claim.lease.pk), "worker_id": "w1", "lease_ms": 10**20},
    ):
        assert worker.post(f"{path}/heartbeat", body).status_code == 400, body
    for progress in (-0.1, 1.5, "half", None):
        body = {**lease_of(claim), "progress": progress}
        assert worker.post(f"{path}/progress", body).status_code == 400, progress
    assert worker.post(f"{path}/pause", {**lease_of(claim), "status": "queued"}).status_code == 400
    assert worker.post(f"{path}/fail", lease_of(claim)).status_code == 400  # error is required
    body = {**lease_of(claim), "output": {"x": "\u0000"}}
    assert worker.post(f"{path}/complete", body).status_code == 400
    assert worker.post("worker/claim", {"worker_id": "w", "kinds": []}).status_code == 400
    assert worker.post("worker/claim", {"worker_id": ""}).status_code == 400
    assert worker.post("worker/claim", {"worker_id": "w", "lease_ms": -5}).status_code == 400


def test_hostile_query_strings_are_400(operator):
    for params in (
        {"limit": 0},
        {"limit": 10**9},
        {"limit": "many"},
        {"status": "bogus"},
        {"order_by": "id"},
        {"updated_after": "yesterday"},
        {"cursor": "!!!"},
        {"cursor": "eyJ2IjoxfQ"},  # {"v":1}
    ):
        expect(operator.get("runs", params), 400, "validation_error")
    for params in ({"after_id": -1}, {"after_id": 2**64}, {"run_id": "x"}, {"limit": 0}):
        expect(operator.get("events", params), 400, "validation_error")
    expect(operator.get("tasks/pending", {"run_id": "nope"}), 400, "validation_error")
    expect(operator.get("tasks/stuck", {"running_longer_than_ms": -1}), 400, "validation_error")


def test_prune_needs_exactly_one_cut_off(operator):
    expect(operator.post("maintenance/prune", {}), 400, "validation_error")
    both = {"older_than": "2020-01-01T00:00:00Z", "older_than_ms": 5}
    expect(operator.post("maintenance/prune", both), 400, "validation_error")
    bad = {"older_than_ms": 5, "statuses": ["active"]}
    expect(operator.post("maintenance/prune", bad), 400, "validation_error")


# -- safety nets ------------------------------------------------------------------------------


def test_unexpected_errors_are_500_in_the_envelope(operator, monkeypatch):
    def boom(self, **kwargs):
        raise RuntimeError("boom")

    monkeypatch.setattr(Orchestrator, "get_run", boom)
    error = expect(operator.get(f"runs/{uuid.uuid4()}"), 500, "internal_error")
    assert "boom" not in error["message"]


def test_database_races_and_outages_are_not_500(operator, monkeypatch):
    def race(self, **kwargs):
        raise IntegrityError("duplicate key")

    monkeypatch.setattr(Orchestrator, "create_run", race)
    expect(operator.post("runs", {}), 409, "conflict")

    def down(self, **kwargs):
        raise OperationalError("database is locked")

    monkeypatch.setattr(Orchestrator, "create_run", down)
    response = operator.post("runs", {})
    expect(response, 503, "unavailable")
    assert response["Retry-After"] == "1"


def test_duplicate_id_error_is_still_a_validation_error_for_python_callers(orch, run):
    with pytest.raises(exceptions.DuplicateIdError) as caught:
        orch.create_run(id=run.pk)
    assert isinstance(caught.value, exceptions.ValidationError)
    assert isinstance(caught.value, ValueError)
    assert caught.value.code == "duplicate_id"

"""Issue 14, item 9: the API accepts exactly what its OpenAPI schema allows. Strict JSON types
on input, every rule of the schema applied as written (and nothing refused that the schema
allows); each case here was a mismatch schemathesis found (tests/test_api_fuzz.py runs it)."""

from __future__ import annotations

import uuid

import pytest

from parallel_mcp import Orchestrator
from parallel_mcp.models import ContextSnapshot, Run, Task
from tests.api_helpers import error_of, openapi_schema, schema_accepts

pytestmark = pytest.mark.django_db
pytest_plugins = ["tests.api_fixtures"]


@pytest.fixture
def orch() -> Orchestrator:
    return Orchestrator()


@pytest.fixture
def run(orch):
    return orch.create_run(namespace="strict")


@pytest.fixture(scope="module")
def openapi() -> dict:
    return openapi_schema()


def refused(response, field: str | None = None) -> dict:
    assert response.status_code == 400, response.content
    error = error_of(response)
    assert error["code"] == "validation_error", error
    if field is not None:
        assert error["details"]["field"] == field, error
    return error


# -- strict JSON types ------------------------------------------------------------------------


@pytest.mark.parametrize("value", [False, True, 12345, 0, ["0195f3a1-8c1e-7a11-9c3e-2b1f0d7e4a01"]])
def test_an_id_of_another_json_type_is_refused_and_nothing_stored(operator, openapi, value):
    """``"id": false`` was stored as the nil UUID, ``true`` as …0001, ``12345`` as …3039."""
    refused(operator.post("runs", {"id": value}), "id")
    assert not Run.objects.exists()
    assert not schema_accepts(openapi, "RunCreateIn", {"id": value})


@pytest.mark.parametrize(
    "value",
    [
        "{0195f3a1-8c1e-7a11-9c3e-2b1f0d7e4a01}",
        "urn:uuid:0195f3a1-8c1e-7a11-9c3e-2b1f0d7e4a01",
        "0195f3a18c1e7a119c3e2b1f0d7e4a01",
        "0195f3a1-8c1e-7a11-9c3e-2b1f0d7e4a0",
    ],
)
def test_an_id_must_be_the_canonical_uuid_text_its_schema_states(operator, openapi, value):
    refused(operator.post("runs", {"id": value}), "id")
    assert not Run.objects.exists()
    assert not schema_accepts(openapi, "RunCreateIn", {"id": value})


@pytest.mark.parametrize("value", [0, 1, "yes", "true", None])
def test_booleans_are_json_booleans(worker, orch, run, openapi, value):
    """``"start": 0`` / ``"yes"`` were read as booleans."""
    orch.enqueue_task(run_id=run.pk, kind="k")
    body = {"worker_id": "w", "start": value}
    refused(worker.post("worker/claim", body), "start")
    assert Task.objects.get().status == "queued"
    assert not schema_accepts(openapi, "ClaimIn", body)


def test_an_integer_may_be_written_with_a_zero_fraction(worker, orch, run, openapi):
    """JSON Schema counts 30000.0 as an integer, so the API does too (a fraction is refused)."""
    orch.enqueue_task(run_id=run.pk, kind="k")
    refused(worker.post("worker/claim", {"worker_id": "w", "lease_ms": 30000.5}), "lease_ms")
    assert not schema_accepts(openapi, "ClaimIn", {"worker_id": "w", "lease_ms": 30000.5})
    assert schema_accepts(openapi, "ClaimIn", {"worker_id": "w", "lease_ms": 30000.0})
    response = worker.post("worker/claim", {"worker_id": "w", "lease_ms": 30000.0})
    assert response.status_code == 200, response.content
    lease = response.json()["lease"]
    assert lease["expires_at"] > lease["acquired_at"]


# -- strings ----------------------------------------------------------------------------------


@pytest.mark.parametrize("blank", ["", " ", "\x1c", "\u2028\u3000", "\x85"])
def test_blank_names_are_refused(operator, openapi, blank):
    refused(operator.post("runs", {"namespace": blank}), "namespace")
    assert not schema_accepts(openapi, "RunCreateIn", {"namespace": blank})


def test_a_name_that_only_javascript_calls_blank_is_kept(operator, openapi):
    """U+FEFF is whitespace to ECMA-262 (the schema's regex dialect) but not to Python; U+001C
    the other way round. The schema's pattern spells out the characters the services strip, so
    both agree (with \\s, the schema refused the first and allowed the second)."""
    response = operator.post("runs", {"namespace": "\ufeff"})
    assert response.status_code == 201, response.content
    assert schema_accepts(openapi, "RunCreateIn", {"namespace": "\ufeff"})


# -- datetimes --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "2026-01-01 12:00:00Z",  # RFC 3339 allows the space; JSON Schema's date-time does not
        "2026-01-01T12:00:00",  # no offset
        "1899-12-31T23:59:59Z",
        "9000-01-01T00:00:00Z",
        "٢٠٢٦-01-01T12:00:00Z",  # digits of another script
        "2026-01-01T12:00:00Z\n",
        "",
    ],
)
def test_datetimes_outside_the_schema_pattern_are_refused(operator, run, openapi, value):
    body = {"kind": "k", "not_before": value}
    refused(operator.post(f"runs/{run.pk}/tasks", body), "not_before")
    assert not Task.objects.exists()
    assert not schema_accepts(openapi, "TaskIn", body)


@pytest.mark.parametrize("value", ["1900-01-01T00:00:00+14:00", "8999-12-31T23:59:59-14:00"])
def test_the_year_range_is_the_year_as_written(operator, run, openapi, value):
    body = {"kind": "k", "not_before": value}
    assert schema_accepts(openapi, "TaskIn", body)
    response = operator.post(f"runs/{run.pk}/tasks", body)
    assert response.status_code == 201, response.content


def test_list_filters_take_any_offset_the_schema_allows(viewer, orch):
    """An offset beyond ±15:59 (RFC 3339 allows up to ±23:59) reached PostgreSQL as written
    and answered 400 "out of the range the database accepts"."""
    orch.create_run()
    params = {
        "updated_after": "2000-01-01T00:00:00-17:41",
        "updated_before": "8000-01-01T00:00:00+23:59",
    }
    response = viewer.get("runs", params)
    assert response.status_code == 200, response.content
    assert len(response.json()["results"]) == 1


# -- JSON values ------------------------------------------------------------------------------


def test_payload_null_is_refused_as_its_schema_says(operator, run, openapi):
    refused(operator.post(f"runs/{run.pk}/context", {"payload": None}), "payload")
    assert not ContextSnapshot.objects.exists()
    assert not schema_accepts(openapi, "ContextAppendIn", {"payload": None})
    assert schema_accepts(openapi, "ContextAppendIn", {"payload": [None]})


@pytest.mark.parametrize("payload", ["a\x00b", {"k\x00": 1}, [[{"deep": ["\x00"]}]]])
def test_nul_anywhere_in_a_json_value_is_refused_as_its_schema_says(
    operator, run, openapi, payload
):
    refused(operator.post(f"runs/{run.pk}/context", {"payload": payload}), "payload")
    assert not schema_accepts(openapi, "ContextAppendIn", {"payload": payload})


def test_a_task_scope_snapshot_needs_a_task_id(operator, run, openapi):
    body = {"payload": 1, "scope": "task"}
    refused(operator.post(f"runs/{run.pk}/context", body), "task_id")
    assert not schema_accepts(openapi, "ContextAppendIn", body)
    assert schema_accepts(openapi, "ContextAppendIn", {**body, "task_id": str(uuid.uuid4())})


# -- bodies -----------------------------------------------------------------------------------


def test_prune_needs_a_body_with_exactly_one_cut_off(operator, openapi):
    refused(operator.post("maintenance/prune"))
    for body in (
        {},
        {"older_than_ms": None},
        {"older_than_ms": 1, "older_than": "2026-01-01T00:00:00Z"},
    ):
        refused(operator.post("maintenance/prune", body))
        assert not schema_accepts(openapi, "PruneIn", body)
    body = {"older_than_ms": 0, "older_than": None}
    assert schema_accepts(openapi, "PruneIn", body)
    assert operator.post("maintenance/prune", body).status_code == 200
    prune = openapi["paths"]["/api/pmcp/maintenance/prune"]["post"]
    assert prune["requestBody"]["required"] is True


def test_single_enqueue_depends_on_task_ids_only(operator, orch, run, openapi):
    """Keys name tasks of a batch only: in a single enqueue a dependency is a task id."""
    first = orch.enqueue_task(run_id=run.pk, kind="k", key="a")
    refused(operator.post(f"runs/{run.pk}/tasks", {"kind": "k", "depends_on": ["a"]}))
    assert not schema_accepts(openapi, "TaskIn", {"kind": "k", "depends_on": ["a"]})
    assert schema_accepts(openapi, "BatchTaskIn", {"kind": "k", "depends_on": ["a"]})
    body = {"kind": "k", "depends_on": [{"task_id": str(first.pk), "required": False}]}
    assert schema_accepts(openapi, "TaskIn", body)
    assert operator.post(f"runs/{run.pk}/tasks", body).status_code == 201


# -- query strings ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "params"),
    [
        ("runs", {"updated_before": ""}),
        ("runs", {"order_dir": ""}),
        ("runs", {"status": ""}),
        ("runs", {"status": "active,"}),
        ("runs", {"namespace": ""}),
        ("tasks/pending", {"run_id": ""}),
        ("tasks/dead", {"limit": ""}),
        ("events", {"run_id": ""}),
        ("events/stream", {"timeout": "1_0"}),
        ("events/stream", {"timeout": "nan"}),
        ("events/stream", {"timeout": " 1"}),
    ],
)
def test_empty_and_malformed_query_values_are_refused(viewer, path, params):
    """An empty value (``?run_id=``) was read as absent; the schema calls it invalid."""
    field = next(iter(params))
    error = refused(viewer.get(path, params))
    assert error["details"]["field"].split(".")[0] == field, error


def test_comma_separated_statuses_are_still_read(viewer, orch):
    orch.create_run()
    assert viewer.get("runs", {"status": "pending,active"}).json()["results"]


def test_a_query_string_with_too_many_parameters_is_414(viewer, settings):
    settings.DATA_UPLOAD_MAX_NUMBER_FIELDS = 5
    response = viewer.get("runs?" + "&".join(f"status=active&n{n}=1" for n in range(5)))
    assert response.status_code == 414
    error = error_of(response)
    assert error["code"] == "uri_too_long" and error["details"] == {"limit": 5}


@pytest.mark.parametrize("value", ["", "abc", "-1", "١٢", "1.5", str(2**63)])
def test_last_event_id_must_be_an_event_id(viewer, value):
    response = viewer.client.get(
        "/api/pmcp/events/stream", {"timeout": 0}, headers={"Last-Event-ID": value}
    )
    refused(response, "Last-Event-ID")


def test_last_event_id_around_whitespace_is_ignored(viewer, settings):
    settings.PARALLEL_MCP_API = {"SSE_POLL_SECONDS": 0.01}
    response = viewer.client.get(
        "/api/pmcp/events/stream", {"timeout": 0}, headers={"Last-Event-ID": " 7\t"}
    )
    assert response.status_code == 200
    assert b'"next_cursor": 7' in b"".join(response.streaming_content)


# -- state refusals ---------------------------------------------------------------------------


def test_events_of_an_unknown_run_are_404(viewer):
    missing = str(uuid.uuid4())
    for path in ("events", "events/stream"):
        response = viewer.get(path, {"run_id": missing, "timeout": 0})
        assert response.status_code == 404, (path, response.content)
        assert error_of(response)["code"] == "not_found"

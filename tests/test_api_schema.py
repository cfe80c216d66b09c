"""The OpenAPI schema (3.1: the contract's JSON Schemas verbatim, every rule and every status
stated) and the Swagger UI page. tests/test_api_fuzz.py runs schemathesis against it."""

from __future__ import annotations

import pytest

from parallel_mcp.api.serializers.inputs import StrictSerializer
from parallel_mcp.contract import arguments as a
from parallel_mcp.contract import limits, shapes
from parallel_mcp.exceptions import ValidationError as ContractValidationError
from tests.api_helpers import schema_accepts

pytest_plugins = ["tests.api_fixtures"]

PATHS = {
    "/api/pmcp/runs": {"get", "post"},
    "/api/pmcp/runs/{run_id}": {"get"},
    "/api/pmcp/runs/{run_id}/cancel": {"post"},
    "/api/pmcp/runs/{run_id}/copy": {"post"},
    "/api/pmcp/runs/{run_id}/context": {"get", "post"},
    "/api/pmcp/runs/{run_id}/events": {"get"},
    "/api/pmcp/runs/{run_id}/tasks": {"get", "post"},
    "/api/pmcp/runs/{run_id}/tasks/batch": {"post"},
    "/api/pmcp/tasks/pending": {"get"},
    "/api/pmcp/tasks/dead": {"get"},
    "/api/pmcp/tasks/stuck": {"get"},
    "/api/pmcp/tasks/{task_id}": {"get"},
    "/api/pmcp/tasks/{task_id}/resume": {"post"},
    "/api/pmcp/tasks/{task_id}/cancel": {"post"},
    "/api/pmcp/tasks/{task_id}/retry": {"post"},
    "/api/pmcp/tasks/{task_id}/requeue": {"post"},
    "/api/pmcp/worker/claim": {"post"},
    "/api/pmcp/worker/claim/batch": {"post"},
    "/api/pmcp/worker/presence": {"post"},
    "/api/pmcp/worker/presence/stop": {"post"},
    "/api/pmcp/tasks/{task_id}/running": {"post"},
    "/api/pmcp/tasks/{task_id}/heartbeat": {"post"},
    "/api/pmcp/tasks/{task_id}/progress": {"post"},
    "/api/pmcp/tasks/{task_id}/pause": {"post"},
    "/api/pmcp/tasks/{task_id}/complete": {"post"},
    "/api/pmcp/tasks/{task_id}/fail": {"post"},
    "/api/pmcp/tasks/{task_id}/release": {"post"},
    "/api/pmcp/events": {"get"},
    "/api/pmcp/events/stream": {"get"},
    "/api/pmcp/maintenance/expire-leases": {"post"},
    "/api/pmcp/maintenance/prune": {"post"},
}


@pytest.mark.django_db
def test_schema_documents_every_endpoint_and_only_those(viewer):
    response = viewer.get("schema/")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("application/vnd.oai.openapi+json")
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    assert schema["info"]["title"] == "parallel_mcp API"
    assert {path: set(ops) for path, ops in schema["paths"].items()} == PATHS
    schemes = schema["components"]["securitySchemes"]
    assert schemes["bearerAuth"] == {
        "type": "http",
        "scheme": "bearer",
        "description": schemes["bearerAuth"]["description"],
    }
    operation_ids = set()
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            operation_ids.add(operation["operationId"])
            assert {"bearerAuth": []} in operation["security"], (method, path)
            for status in ("400", "401", "403", "429"):
                content = operation["responses"][status]["content"]["application/json"]
                assert content["schema"] == {"$ref": "#/components/schemas/ErrorOut"}
            if "{" in path:
                assert "404" in operation["responses"]
            if method == "post":
                assert {"413", "415"} <= set(operation["responses"])
    assert len(operation_ids) == sum(len(ops) for ops in PATHS.values())
    claim = schema["paths"]["/api/pmcp/worker/claim"]["post"]
    assert set(claim["responses"]) >= {"200", "204", "409"}
    assert "content" not in claim["responses"]["204"]
    batch = schema["paths"]["/api/pmcp/worker/claim/batch"]["post"]
    assert set(batch["responses"]) >= {"200", "409"} and "204" not in batch["responses"]
    batch_in = schema["components"]["schemas"]["ClaimBatchIn"]
    assert "limit" in batch_in["required"]
    assert (
        batch_in["properties"]["limit"]["minimum"],
        batch_in["properties"]["limit"]["maximum"],
    ) == (1, 100)
    assert batch_in["properties"]["start"]["type"] == "boolean"
    assert schema["components"]["schemas"]["ClaimIn"]["properties"]["start"]["default"] is False
    heartbeat = schema["paths"]["/api/pmcp/tasks/{task_id}/heartbeat"]["post"]
    assert {"409", "410"} <= set(heartbeat["responses"])
    examples = heartbeat["responses"]["409"]["content"]["application/json"]["examples"]
    assert any(ex["value"]["error"]["details"]["cancelled"] for ex in examples.values())
    stream = schema["paths"]["/api/pmcp/events/stream"]["get"]
    assert "text/event-stream" in stream["responses"]["200"]["content"]
    assert any(p["name"] == "Last-Event-ID" for p in stream["parameters"])


@pytest.mark.django_db
def test_schema_as_yaml(viewer):
    response = viewer.get("schema/", {"format": "yaml"})
    assert response.status_code == 200
    assert response.content.startswith(b"openapi: 3.")


@pytest.mark.django_db
def test_swagger_ui_is_served_from_the_sidecar(viewer):
    response = viewer.get("docs/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "/static/drf_spectacular_sidecar/swagger-ui-dist/swagger-ui-bundle.js" in html
    assert "../schema/" in html
    for cdn in ("cdn.jsdelivr", "unpkg.com", "cdnjs"):
        assert cdn not in html


@pytest.mark.django_db
def test_schema_does_not_depend_on_the_projects_default_schema_class(viewer, settings):
    """A project without drf-spectacular's AutoSchema in REST_FRAMEWORK still gets a schema:
    every view and every decorated method uses the API's own schema class."""
    from django.urls import get_resolver

    from parallel_mcp.api.schema import PmcpAutoSchema
    from parallel_mcp.api.views.base import ApiView

    checked = 0
    for pattern in get_resolver("parallel_mcp.api.urls").url_patterns:
        view_class = getattr(pattern.callback, "cls", None)
        if view_class is None or not issubclass(view_class, ApiView):
            continue
        assert isinstance(view_class.schema, PmcpAutoSchema)
        for method in ("get", "post"):
            function = getattr(view_class, method, None)
            if function is not None:
                assert issubclass(function.kwargs["schema"], PmcpAutoSchema), (view_class, method)
                checked += 1
    assert checked == sum(len(ops) for ops in PATHS.values())
    settings.REST_FRAMEWORK = {}  # DRF's own AutoSchema as the default
    assert viewer.get("schema/").status_code == 200


# -- the rules the schema states -----------------------------------------------------------------


@pytest.fixture
def openapi(viewer) -> dict:
    response = viewer.get("schema/")
    assert response.status_code == 200
    return response.json()


def operation(openapi: dict, path: str, method: str) -> dict:
    return openapi["paths"]["/api/pmcp/" + path][method]


def _subclasses(cls: type) -> set[type]:
    found = set(cls.__subclasses__())
    for sub in list(found):
        found |= _subclasses(sub)
    return found


@pytest.mark.django_db
def test_openapi_3_1_publishes_the_contracts_json_schemas(openapi):
    """OpenAPI 3.1 schemas are JSON Schema 2020-12, the MCP tools' dialect: each argument is
    its kind's schema verbatim, nullable ones in the contract's one nullable form."""
    assert openapi["openapi"] == "3.1.0"
    run_in = openapi["components"]["schemas"]["RunCreateIn"]["properties"]
    assert run_in["namespace"] == {**a.NAME.schema(), "default": "default"}
    assert run_in["max_parallel"] == shapes.nullable(a.MAX_PARALLEL.schema())
    assert run_in["id"] == shapes.nullable(a.ID.schema())
    claim_in = openapi["components"]["schemas"]["ClaimIn"]["properties"]
    assert claim_in["kinds"] == shapes.nullable(a.KINDS.schema())
    run_out = openapi["components"]["schemas"]["Run"]["properties"]
    status = run_out.pop("status")  # its enum is a shared component
    enum = openapi["components"]["schemas"][status["$ref"].rsplit("/", 1)[1]]
    expected = dict(shapes.RUN.schema()["properties"])  # a copy: the shape caches its schema
    assert enum["enum"] == expected.pop("status")["enum"]
    assert run_out == expected


@pytest.mark.django_db
def test_bodies_that_refuse_unknown_fields_say_additional_properties_false(openapi):
    components = openapi["components"]["schemas"]
    strict = {cls.__name__ for cls in _subclasses(StrictSerializer)} & set(components)
    assert {"RunCreateIn", "TaskIn", "BatchTaskIn", "PruneIn", "ContextAppendIn"} <= strict
    for name in strict:
        assert components[name]["additionalProperties"] is False, name
        assert not schema_accepts(openapi, name, {"misspelt_field": 1}), name
    for name in ("ClaimIn", "LeaseIn", "CompleteIn", "FailIn"):  # newer workers, older servers
        assert "additionalProperties" not in components[name], name


@pytest.mark.django_db
def test_list_limit_maximum_is_the_setting_in_force(viewer, settings):
    settings.PARALLEL_MCP = {**settings.PARALLEL_MCP, "MAX_LIST_LIMIT": 7}
    schema = viewer.get("schema/").json()
    for path in ("runs", "runs/{run_id}/tasks", "tasks/pending", "tasks/dead", "events"):
        (limit,) = [p for p in operation(schema, path, "get")["parameters"] if p["name"] == "limit"]
        assert limit["schema"] == {"type": "integer", "minimum": 1, "maximum": 7}, path
    prune_limit = schema["components"]["schemas"]["PruneIn"]["properties"]["limit"]
    assert prune_limit == shapes.nullable({"type": "integer", "minimum": 1, "maximum": 7})
    assert viewer.get("runs", {"limit": 8}).status_code == 400


@pytest.mark.django_db
def test_every_status_an_operation_answers_is_documented(openapi):
    for path in ("events", "events/stream"):  # an unknown run_id
        assert "404" in operation(openapi, path, "get")["responses"], path
    for path in ("runs", "runs/{run_id}/context", "runs/{run_id}/tasks"):  # duplicate_id
        assert "409" in operation(openapi, path, "post")["responses"], path
        assert "409" not in operation(openapi, path, "get")["responses"], path
    for path, operations in openapi["paths"].items():
        for method, item in operations.items():
            if method == "get":  # the HTTP server's own limit on the query string
                assert set(item["responses"]["414"]) == {"description"}, path
    assert "409" in openapi["paths"]["/api/pmcp/tasks/{task_id}/heartbeat"]["post"]["responses"]


@pytest.mark.django_db
def test_data_dependent_refusals_are_listed_under_400(openapi):
    """What no schema can state (an opaque cursor, ids that must exist, no cycles) is listed
    on the operations that can answer it, in the description and x-pmcp-data-refusals."""
    for path in ("runs", "runs/{run_id}/tasks", "tasks/pending", "tasks/dead"):
        get = operation(openapi, path, "get")
        (cursor,) = [p for p in get["parameters"] if p["name"] == "cursor"]
        assert cursor["description"].startswith("Opaque"), path
        refusals = get["responses"]["400"]["x-pmcp-data-refusals"]
        assert {"code": "validation_error", "field": "cursor"}.items() <= refusals[0].items()
        assert "cursor" in get["responses"]["400"]["description"]
    enqueue = operation(openapi, "runs/{run_id}/tasks", "post")["responses"]["400"]
    codes = {item["code"] for item in enqueue["x-pmcp-data-refusals"]}
    assert codes == {"invalid_dependency", "dependency_cycle", "validation_error"}
    assert "x-pmcp-data-refusals" not in operation(openapi, "runs", "post")["responses"]["400"]


@pytest.mark.django_db
def test_json_arguments_are_the_recursive_json_value_component(openapi):
    components = openapi["components"]["schemas"]
    ref = "#/components/schemas/JsonValue"
    assert components["JsonValue"] == a.json_value_schema(ref)
    assert components["NonNullJsonValue"] == a.json_value_schema(ref, nullable=False)
    assert components["RunCreateIn"]["properties"]["metadata"] == {"$ref": ref}
    payload = components["ContextAppendIn"]["properties"]["payload"]
    assert payload["allOf"] == [{"$ref": "#/components/schemas/NonNullJsonValue"}]
    for value in ({"a": [{"b": "nul\x00"}]}, {"k\x00": 1}):
        assert not schema_accepts(openapi, "JsonValue", value)
    assert schema_accepts(openapi, "JsonValue", {"a": [None, 1.5, True, {"b": "text"}]})


@pytest.mark.django_db
def test_rules_between_fields_are_stated(openapi):
    lease = {"lease_id": "0195f3a1-9d00-7e00-8a00-0a0b0c0d0e0f", "worker_id": "w"}
    blocked_by = ["0195f3a1-8c20-7d11-a2b3-c4d5e6f70803"]
    waiting = {**lease, "status": "waiting_input", "blocked_by": blocked_by}
    assert not schema_accepts(openapi, "PauseIn", waiting)
    assert schema_accepts(openapi, "PauseIn", {**waiting, "status": "blocked"})
    assert not schema_accepts(
        openapi, "PauseIn", {**lease, "status": "blocked", "blocked_by": blocked_by * 2}
    )
    asking = {**lease, "status": "waiting_input", "input_requests": {"q": {"method": "roots/list"}}}
    assert schema_accepts(openapi, "PauseIn", asking)
    assert not schema_accepts(openapi, "PauseIn", {**asking, "status": "blocked"})


@pytest.mark.django_db
def test_input_requests_state_the_services_rules(openapi):
    """PauseIn.input_requests refuses what arguments.INPUT_REQUESTS refuses, at any depth."""
    lease = {"lease_id": "0195f3a1-9d00-7e00-8a00-0a0b0c0d0e0f", "worker_id": "w"}
    request = {"method": "elicitation/create", "params": {"message": "Name?", "n": [1, None]}}
    cases = [
        ({"q": request}, True),
        ({"q": {"method": "roots/list"}}, True),
        ({}, False),
        ({"q": {"method": "tools/call"}}, False),
        ({"q": {"params": {}}}, False),
        ({"q": {**request, "id": 1}}, False),
        ({"q": {"method": "roots/list", "params": []}}, False),
        ({"q": {"method": "roots/list", "params": {"a": ["nul\x00"]}}}, False),
        ({" ": request}, False),
        ({"x" * 201: request}, False),
        ({f"k{i}": request for i in range(limits.MAX_INPUT_KEYS + 1)}, False),
    ]
    for value, valid in cases:
        body = {**lease, "status": "waiting_input", "input_requests": value}
        assert schema_accepts(openapi, "PauseIn", body) is valid, value
        if valid:
            a.INPUT_REQUESTS.check(value, "input_requests")
        else:
            with pytest.raises(ContractValidationError):
                a.INPUT_REQUESTS.check(value, "input_requests")


@pytest.mark.django_db
def test_last_event_id_header_is_an_event_id(openapi):
    (header,) = [
        p for p in operation(openapi, "events/stream", "get")["parameters"] if p["in"] == "header"
    ]
    assert header["name"] == "Last-Event-ID"
    assert header["schema"] == a.EVENT_ID.schema()

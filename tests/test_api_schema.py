"""The OpenAPI schema, the Swagger UI page, and a schemathesis run against the WSGI app from
the app's own schema: no 5xx for anything a client can send, responses match the schema."""

from __future__ import annotations

import json
import os

import pytest
import schemathesis
from django.core.cache import cache
from django.core.wsgi import get_wsgi_application
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from parallel_mcp import Orchestrator
from tests.api_helpers import OPERATOR_PERMS, WORKER_PERMS, make_user, token_for

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


# -- schemathesis --------------------------------------------------------------------------------

FUZZ_SSE = {"SSE_DEFAULT_SECONDS": 0, "SSE_MAX_SECONDS": 0.1, "SSE_POLL_SECONDS": 0.01}


@pytest.fixture
def fuzz_setup(transactional_db, settings):
    """An operator token (with the worker permission too, so the worker protocol is fuzzed
    past its permission check), a run with tasks in several states, short SSE streams and no
    throttling."""
    settings.PARALLEL_MCP_API = dict(FUZZ_SSE)
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"pmcp": None, "pmcp_worker": None},
    }
    cache.clear()
    user = make_user("fuzzer", [*OPERATOR_PERMS, *WORKER_PERMS])
    orch = Orchestrator()
    run = orch.create_run(namespace="fuzz", context={"seed": True})
    first = orch.enqueue_task(run_id=run.pk, kind="k", max_attempts=1)
    orch.enqueue_task(run_id=run.pk, kind="k", depends_on=[first.pk])
    other = orch.enqueue_task(run_id=run.pk, kind="k2")
    claimed = orch.claim_next_task(worker_id="fuzz", kinds=["k"])
    orch.fail_task(
        task_id=claimed.task.pk,
        lease_id=claimed.lease.pk,
        worker_id="fuzz",
        error="dead",
        retry=True,
    )
    return {
        "headers": {"Authorization": f"Bearer {token_for(user)}"},
        "run_ids": [str(run.pk)],
        "task_ids": [str(first.pk), str(other.pk)],
    }


# Kept small so the run takes seconds: each operation gets this many positive cases, as many
# negative ones, and (when it has a run or task id in its path) as many naming real rows.
# PMCP_FUZZ_EXAMPLES=200 PMCP_FUZZ_RANDOM=1 explores further (random seeds).
FUZZ_EXAMPLES = int(os.environ.get("PMCP_FUZZ_EXAMPLES", "12"))
FUZZ_DERANDOMIZE = not os.environ.get("PMCP_FUZZ_RANDOM")


def error_envelope(ctx, response, case):
    """Every refusal is the JSON error envelope (no HTML error page, whatever the input)."""
    if response.status_code < 400:
        return None
    content_type = response.headers.get("content-type", [""])[0]
    assert content_type.startswith("application/json"), (response.status_code, content_type)
    body = json.loads(response.content)
    assert set(body) == {"error"} and set(body["error"]) == {"code", "message", "details"}
    return True


@pytest.mark.slow
def test_fuzz_the_api_from_its_own_schema(fuzz_setup):
    """schemathesis' Python API, one hypothesis run per operation and mode (its pytest plugin
    is not used: its lazy loader does not work with this pytest)."""
    headers = fuzz_setup["headers"]
    schema = schemathesis.openapi.from_wsgi(
        "/api/pmcp/schema/", get_wsgi_application(), headers=headers
    )
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) == sum(len(ops) for ops in PATHS.values())
    checks = [not_a_server_error, response_schema_conformance, error_envelope]
    failures: list[str] = []
    calls = 0

    for operation in operations:
        fixed = {}
        names = {param.name for param in operation.path_parameters}
        if "run_id" in names:
            fixed["run_id"] = fuzz_setup["run_ids"][0]
        if "task_id" in names:
            fixed["task_id"] = fuzz_setup["task_ids"][0]
        strategies = [
            ("positive", operation.as_strategy(GenerationMode.POSITIVE)),
            ("negative", operation.as_strategy(GenerationMode.NEGATIVE)),
        ]
        if fixed:
            strategies.append(
                ("real ids", operation.as_strategy(GenerationMode.POSITIVE, path_parameters=fixed))
            )
        for mode, strategy in strategies:

            @given(case=strategy)
            @hypothesis_settings(
                max_examples=FUZZ_EXAMPLES,
                deadline=None,
                suppress_health_check=list(HealthCheck),
                derandomize=FUZZ_DERANDOMIZE,
                database=None,
            )
            def run(case):
                nonlocal calls
                calls += 1
                case.call_and_validate(headers=headers, checks=checks)

            try:
                run()
            except Exception as exc:  # noqa: BLE001 - collect every operation's failure
                failures.append(f"{operation.label} ({mode}): {exc}")
    assert not failures, "\n\n".join(failures)
    assert calls >= len(operations) * 2


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

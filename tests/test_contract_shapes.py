"""Each object has one serialized shape (parallel_mcp.contract.shapes): the HTTP API, the MCP
tools and the remote worker show a run, task, attempt, lease, claim, snapshot or event alike,
every dump matches its published JSON Schema, and the OpenAPI schema documents the same fields."""

from __future__ import annotations

import anyio
import jsonschema
import pytest
from mcp import Client

from parallel_mcp import Orchestrator
from parallel_mcp.api.serializers.outputs import ClaimOut, RunOut, TaskDetailOut, TaskOut
from parallel_mcp.contract import shapes
from parallel_mcp.mcp.server import build_server
from parallel_mcp.models import Attempt, ContextSnapshot, Event, Lease, Run, Task
from parallel_mcp.worker import wire
from tests.mcp_support import call

pytest_plugins = ["tests.api_fixtures"]

ALL = [
    shapes.RUN,
    shapes.TASK,
    shapes.ATTEMPT,
    shapes.LEASE,
    shapes.SNAPSHOT,
    shapes.EVENT,
    shapes.BLOCKER,
    shapes.CLAIM,
    shapes.TASK_DETAIL,
    shapes.EXPIRE_RESULT,
    shapes.PRUNE_RESULT,
]


def _mcp(*steps):
    """Run ``steps`` (tool, arguments) through the MCP server in process; their results."""
    results = []

    async def main():
        async with Client(build_server(), mode="legacy") as client:
            for tool, arguments in steps:
                results.append(await call(client.session, tool, **arguments))

    anyio.run(main)
    return results


@pytest.fixture
def busy_run(db):
    """A run with context, a dependency, a claimed and a completed task, and events."""
    orch = Orchestrator()
    run = orch.create_run(namespace="shapes", metadata={"m": [1, {"x": None}]}, context={"c": 1})
    first = orch.enqueue_task(
        run_id=run.pk,
        kind="first",
        key="first",
        input={"q": "ü"},
        retry={"delay_ms": 10, "backoff": "exponential"},
        max_attempts=3,
    )
    orch.enqueue_task(run_id=run.pk, kind="second", depends_on=[first.pk], priority=2)
    claim = orch.claim_next_task(worker_id="w-1", kinds=["first"])
    orch.report_progress(
        task_id=first.pk, lease_id=claim.lease.pk, worker_id="w-1", progress=0.5, message="half"
    )
    return run, first, claim


def _assert_valid(shape: shapes.Shape, data: object) -> None:
    jsonschema.Draft202012Validator(
        shape.schema(), format_checker=jsonschema.FormatChecker()
    ).validate(data)


@pytest.mark.django_db(transaction=True)
def test_the_api_and_the_mcp_tools_show_each_object_alike(busy_run, root_user):
    from tests.api_helpers import bearer, token_for

    run, first, claim = busy_run
    api = bearer(token_for(root_user))
    rid, tid = str(run.pk), str(first.pk)
    got_run, got_task, got_events, got_snapshot = _mcp(
        ("get_run", {"run_id": rid}),
        ("get_task", {"task_id": tid}),
        ("list_run_events", {"run_id": rid}),
        ("get_current_context_snapshot", {"run_id": rid}),
    )
    api_run = api.get(f"runs/{rid}").json()
    assert got_run["run"] == api_run
    _assert_valid(shapes.RUN, api_run)

    detail = api.get(f"tasks/{tid}").json()
    _assert_valid(shapes.TASK_DETAIL, detail)
    detail_only = ("attempts", "blockers", "input_responses")
    assert {k: v for k, v in detail.items() if k not in detail_only} == got_task["task"]
    assert [item["id"] for item in detail["attempts"]] == [str(claim.attempt.pk)]
    _assert_valid(shapes.ATTEMPT, detail["attempts"][0])

    api_events = api.get(f"runs/{rid}/events", {"limit": 1000}).json()["results"]
    assert api_events == got_events["events"]
    for item in api_events:
        _assert_valid(shapes.EVENT, item)

    api_snapshot = api.get(f"runs/{rid}/context").json()["snapshot"]
    assert api_snapshot == got_snapshot["snapshot"]
    _assert_valid(shapes.SNAPSHOT, api_snapshot)


@pytest.mark.django_db(transaction=True)
def test_claims_look_alike_through_the_api_and_mcp(busy_run, root_user):
    from tests.api_helpers import bearer, token_for

    run, _first, _ = busy_run
    orch = Orchestrator()
    for key in ("a", "b"):
        orch.enqueue_task(run_id=run.pk, kind="free", key=key, input={"k": key})
    api = bearer(token_for(root_user))
    through_api = api.post("worker/claim", {"worker_id": "api", "kinds": ["free"]}).json()
    (through_mcp,) = _mcp(("claim_next_task", {"worker_id": "mcp", "kinds": ["free"]}))
    through_mcp = through_mcp["claim"]
    for data in (through_api, through_mcp):
        _assert_valid(shapes.CLAIM, data)
        assert data["context"] == {"c": 1}
        assert list(data) == list(shapes.CLAIM.names)
    for part in ("run", "task", "attempt", "lease"):
        assert list(through_api[part]) == list(through_mcp[part]), part
    assert through_api["run"]["id"] == through_mcp["run"]["id"] == str(run.pk)


@pytest.mark.django_db
def test_every_dump_matches_its_schema_and_reads_back(busy_run):
    run, first, claim = busy_run
    _assert_valid(shapes.CLAIM, shapes.claim(claim))
    for shape, obj in (
        (shapes.RUN, run),
        (shapes.TASK, Task.objects.get(pk=first.pk)),
        (shapes.ATTEMPT, Attempt.objects.get(pk=claim.attempt.pk)),
        (shapes.LEASE, Lease.objects.get(pk=claim.lease.pk)),
    ):
        data = shape.dump(obj)
        _assert_valid(shape, data)
        loaded = shape.load(data)
        for name, value in loaded.items():
            if name == "depends_on_task_ids":
                assert value == list(obj.depends_on_task_ids)
            else:
                assert value == getattr(obj, name), (shape, name)


@pytest.mark.django_db
def test_the_remote_worker_reads_the_claim_shape_back_into_models(busy_run):
    _run, first, claim = busy_run
    orch = Orchestrator()
    orch.complete_task(task_id=first.pk, lease_id=claim.lease.pk, worker_id="w-1")
    second = orch.claim_next_task(worker_id="w-2")
    data = shapes.claim(second)
    remote = wire.claim_from(data)
    assert remote.context == {"c": 1}
    for model_instance, original in (
        (remote.task, second.task),
        (remote.run, second.run),
        (remote.lease, second.lease),
        (remote.attempt, second.attempt),
    ):
        for field in type(original)._meta.concrete_fields:
            assert getattr(model_instance, field.attname) == getattr(original, field.attname), (
                field.attname
            )
    assert remote.task.depends_on_task_ids == [first.pk]
    assert wire.task_from(shapes.task(second.task)).pk == second.task.pk


@pytest.mark.parametrize(
    ("shape", "model", "not_columns"),
    [
        (shapes.RUN, Run, {"progress"}),  # a property of the counters
        (shapes.TASK, Task, {"depends_on_task_ids", "running_for_ms"}),  # wire.task_from
        (shapes.ATTEMPT, Attempt, set()),
        (shapes.LEASE, Lease, set()),
        (shapes.SNAPSHOT, ContextSnapshot, set()),
        (shapes.EVENT, Event, set()),
    ],
    ids=lambda value: getattr(value, "name", None) or getattr(value, "__name__", "-"),
)
def test_the_remote_client_keeps_every_field_of_a_shape(shape, model, not_columns):
    """wire builds model instances from the columns of a shape: a field that is not a column
    must be one it handles on purpose, or the remote client would drop it silently."""
    columns = {field.attname for field in model._meta.concrete_fields}
    assert set(shape.names) - columns == not_columns


@pytest.mark.parametrize("shape", ALL, ids=lambda shape: shape.name)
def test_schemas_are_valid_and_list_every_field(shape):
    schema = shape.schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    assert list(schema["properties"]) == list(shape.names)
    assert set(schema["required"]) == {f.name for f in shape.fields if not f.optional}


@pytest.mark.parametrize(
    ("serializer", "shape"),
    [
        (RunOut, shapes.RUN),
        (TaskOut, shapes.TASK),
        (TaskDetailOut, shapes.TASK_DETAIL),
        (ClaimOut, shapes.CLAIM),
    ],
)
def test_the_openapi_serializers_are_made_from_the_shapes(serializer, shape):
    assert list(serializer().fields) == list(shape.names)


def test_the_openapi_schema_documents_the_shapes(operator):
    schema = operator.get("schema/", HTTP_ACCEPT="application/json").json()
    components = schema["components"]["schemas"]
    for shape in (shapes.RUN, shapes.TASK, shapes.LEASE, shapes.ATTEMPT, shapes.EVENT):
        assert list(components[shape.name]["properties"]) == list(shape.names), shape.name

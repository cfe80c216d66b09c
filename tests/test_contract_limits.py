"""The contract's input limits (parallel_mcp.contract.limits) hold at every door: the services,
the HTTP API and the MCP tools refuse the same values, nothing over a limit is ever stored, and
nothing a write accepted can make a read, a claim or a page fail."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime, timedelta

import anyio
import pytest
from mcp import Client

from parallel_mcp import Orchestrator
from parallel_mcp.contract import limits
from parallel_mcp.contract.arguments import NON_BLANK_PATTERN
from parallel_mcp.exceptions import ValidationError
from parallel_mcp.mcp.server import build_server
from parallel_mcp.models import ContextSnapshot, Event, Run, Task
from tests.api_helpers import error_of
from tests.conftest import at
from tests.mcp_support import call, fail, in_db

pytest_plugins = ["tests.api_fixtures"]

MAX = limits.MAX_JSON_DEPTH


def nested(depth: int, leaf: object = "x") -> object:
    """A JSON value ``depth`` containers deep (alternating objects and lists)."""
    value = leaf
    for level in range(depth):
        value = {"k": value} if level % 2 else [value]
    return value


def nested_text(depth: int) -> str:
    """The JSON text of ``depth`` nested arrays, written directly (no recursion anywhere)."""
    return "[" * depth + "1" + "]" * depth


# -- the services, for every caller ----------------------------------------------------------


def _writes(orch: Orchestrator, run: Run, value: object) -> dict[str, object]:
    """Every JSON argument of the contract's writes, given ``value``."""
    task = orch.enqueue_task(run_id=run.pk, kind="k")
    lease = orch.claim_next_task(worker_id="w", now=at(1)).lease

    def complete(field: str):
        return lambda: orch.complete_task(
            task_id=task.pk, lease_id=lease.pk, worker_id="w", now=at(2), **{field: value}
        )

    return {
        "create_run.metadata": lambda: orch.create_run(metadata=value),
        "create_run.context": lambda: orch.create_run(context=value),
        "enqueue_task.input": lambda: orch.enqueue_task(run_id=run.pk, kind="k", input=value),
        "enqueue_task.metadata": lambda: orch.enqueue_task(run_id=run.pk, kind="k", metadata=value),
        "enqueue_tasks.input": lambda: orch.enqueue_tasks(
            run_id=run.pk, tasks=[{"kind": "k", "input": value}]
        ),
        "append_context_snapshot.payload": lambda: orch.append_context_snapshot(
            run_id=run.pk, payload=value
        ),
        "complete_task.output": complete("output"),
        "complete_task.metadata": complete("metadata"),
        "complete_task.next_context": complete("next_context"),
        "fail_task.metadata": lambda: orch.fail_task(
            task_id=task.pk, lease_id=lease.pk, worker_id="w", error="e", metadata=value, now=at(2)
        ),
    }


WRITE_NAMES = [
    "create_run.metadata",
    "create_run.context",
    "enqueue_task.input",
    "enqueue_task.metadata",
    "enqueue_tasks.input",
    "append_context_snapshot.payload",
    "complete_task.output",
    "complete_task.metadata",
    "complete_task.next_context",
    "fail_task.metadata",
]


@pytest.mark.parametrize("write", WRITE_NAMES)
def test_every_json_argument_refuses_depth_over_the_limit_and_writes_nothing(orch, run, write):
    calls = _writes(orch, run, nested(MAX + 1))
    before = (Run.objects.count(), Task.objects.count(), Event.objects.count())
    with pytest.raises(ValidationError) as refused:
        calls[write]()
    assert f"nested deeper than {MAX} levels" in refused.value.message
    assert refused.value.details["limit"] == MAX
    assert (Run.objects.count(), Task.objects.count(), Event.objects.count()) == before
    assert ContextSnapshot.objects.count() == 0


@pytest.mark.parametrize("write", WRITE_NAMES)
def test_every_json_argument_accepts_the_limit_itself(orch, run, write):
    _writes(orch, run, nested(MAX))[write]()


def test_depth_is_measured_without_recursion(orch, run):
    deep = nested(200_000)  # far beyond Python's recursion limit
    with pytest.raises(ValidationError, match="nested deeper"):
        orch.enqueue_task(run_id=run.pk, kind="k", input=deep)


def test_resume_input_refuses_depth(orch, run):
    orch.enqueue_task(run_id=run.pk, kind="k")
    claim = orch.claim_next_task(worker_id="w", now=at(1))
    ids = {"task_id": claim.task.pk, "lease_id": claim.lease.pk, "worker_id": "w"}
    orch.pause_task(**ids, status="waiting_input", now=at(2))
    with pytest.raises(ValidationError, match="nested deeper"):
        orch.resume_task(task_id=claim.task.pk, input=nested(MAX + 1))
    assert Task.objects.get(pk=claim.task.pk).status == "waiting_input"


# -- datetimes, offsets, durations ------------------------------------------------------------


@pytest.mark.parametrize(
    "moment",
    [
        datetime(1, 1, 1, tzinfo=UTC),
        datetime(9999, 12, 31, 23, 59, tzinfo=UTC),
        datetime(1899, 12, 31, 23, 59, tzinfo=UTC),
        datetime(9000, 1, 1, tzinfo=UTC),
    ],
)
def test_datetimes_outside_the_range_are_refused(orch, run, moment):
    with pytest.raises(ValidationError, match="must have a year from 1900 to 8999"):
        orch.list_runs(updated_after=moment)
    with pytest.raises(ValidationError, match="must have a year from"):
        orch.enqueue_task(run_id=run.pk, kind="k", not_before=moment)
    with pytest.raises(ValidationError, match="must have a year from"):
        orch.create_run(now=moment)


def test_a_datetime_whose_offset_overflows_is_refused():
    from datetime import timezone as tz

    early = datetime(1, 1, 1, 0, 30, tzinfo=tz(timedelta(hours=1)))  # before year 1 in UTC
    with pytest.raises(ValidationError, match="must have a year from"):
        Orchestrator().list_runs(updated_before=early)


def test_the_year_range_is_the_year_as_written(orch, run):
    """The rule is the year in the value's own time zone, so the schema's pattern on the text
    states it exactly; converted to UTC the value may lie just outside those years."""
    from datetime import timezone as tz

    first = datetime(limits.MIN_YEAR, 1, 1, tzinfo=tz(timedelta(hours=14)))  # 1899 in UTC
    last = datetime(limits.MAX_YEAR, 12, 31, 23, tzinfo=tz(-timedelta(hours=14)))  # 9000 in UTC
    task = orch.enqueue_task(run_id=run.pk, kind="k", not_before=first)
    assert task.not_before == first
    assert orch.enqueue_task(run_id=run.pk, kind="k", not_before=last).not_before == last


def test_offsets_and_durations_have_ceilings(db):
    orch = Orchestrator()
    with pytest.raises(ValidationError, match="offset must be <="):
        orch.list_runs(offset=2**63)
    assert orch.list_runs(offset=limits.MAX_OFFSET) == []
    with pytest.raises(ValidationError, match="older_than must be at most 36500 days"):
        orch.prune_runs(older_than=timedelta(days=800_000))


# -- the HTTP API --------------------------------------------------------------------------------


def test_api_refuses_deep_json_cleanly_at_any_depth(operator, run):
    for depth in (MAX + 1, 950, 3_000, 100_000):
        body = '{"metadata": ' + nested_text(depth) + "}"
        response = operator.post("runs", body)
        assert response.status_code == 400, (depth, response.content[:200])
        assert error_of(response)["code"] in ("validation_error", "parse_error")
    response = operator.post(f"runs/{run.pk}/tasks", {"kind": "k", "input": nested(MAX + 1)})
    error = error_of(response)
    assert response.status_code == 400 and error["details"]["field"] == "input"
    assert f"deeper than {MAX}" in error["message"]
    assert Run.objects.count() == 1 and Task.objects.count() == 0


def _cursor(name: str, key: list[object]) -> str:
    raw = json.dumps({"v": 1, "o": name, "k": key}).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize("moment", ["0001-01-01T00:00:00+05:00", "9999-12-31T23:59:59-05:00"])
def test_api_cursors_with_extreme_datetimes_are_400(operator, run, moment):
    pages = {
        "runs": ("runs.updated_at.desc", [moment, str(run.pk)]),
        f"runs/{run.pk}/tasks": ("tasks.created_at", [moment, str(run.pk)]),
        "tasks/pending": ("pending", [0, moment, str(run.pk)]),
        "tasks/dead": ("dead", [moment, str(run.pk)]),
    }
    for path, (name, key) in pages.items():
        response = operator.get(path, {"cursor": _cursor(name, key)})
        assert response.status_code == 400, (path, response.content[:300])
        assert error_of(response)["code"] == "validation_error"


def test_api_extreme_datetimes_and_offsets_are_400(operator):
    for value in ("0001-01-01T00:00:00Z", "9999-12-31T23:59:59Z", "2026-01-01T00:00:00"):
        response = operator.get("runs", {"updated_after": value})
        assert response.status_code == 400, value
        assert error_of(response)["details"]["field"] == "updated_after"
    response = operator.post("maintenance/prune", {"older_than_ms": 2**63})
    assert response.status_code == 400


# -- the MCP tools -----------------------------------------------------------------------------


async def _session_run(scenario):
    async with Client(build_server(), mode="legacy") as client:
        await scenario(client.session)


@pytest.mark.django_db(transaction=True)
def test_mcp_refuses_what_the_services_refuse():
    async def scenario(s):
        rid = (await call(s, "create_run"))["run"]["id"]
        error = await fail(s, "enqueue_task", {"run_id": rid, "kind": "k", "input": nested(65)})
        assert error["code"] == "validation_error" and error["details"]["field"] == "input"
        for arguments in (
            {"older_than": "800000d"},
            {"older_than": "0001-01-01T00:00:00+14:00"},
            {"older_than": "9999-12-31T23:59:59-14:00"},
        ):
            error = await fail(s, "prune_runs", arguments)
            assert error["code"] == "validation_error", (arguments, error)
        for tool, arguments in (
            ("list_runs", {"offset": 2**63}),
            ("list_dead_tasks", {"offset": 2**63}),
            ("list_runs", {"updated_after": "0001-01-01T00:00:00+14:00"}),
            ("list_pending_tasks", {"ready_by": "9999-12-31T23:59:59-14:00"}),
            ("enqueue_task", {"run_id": rid, "kind": "   "}),
        ):
            error = await fail(s, tool, arguments)
            assert error["code"] == "validation_error", (tool, arguments, error)
        assert await in_db(Task.objects.count) == 0

    anyio.run(_session_run, scenario)


@pytest.mark.django_db(transaction=True)
def test_values_at_the_limit_never_break_a_read_or_a_claim(client, root_user):
    """Everything a write accepted is readable and claimable at every door."""
    deepest = nested(MAX)

    async def scenario(s):
        run = (await call(s, "create_run", metadata=deepest, context=deepest))["run"]
        rid = run["id"]
        tasks = [{"kind": "deep", "input": deepest, "metadata": deepest} for _ in range(3)]
        await call(s, "enqueue_tasks", run_id=rid, tasks=tasks)
        claims = (await call(s, "claim_next_tasks", worker_id="w", limit=2))["claims"]
        assert [c["task"]["input"] for c in claims] == [deepest, deepest]
        claim = (await call(s, "claim_next_task", worker_id="w"))["claim"]
        refs = {"task_id": claim["task"]["id"], "lease_id": claim["lease"]["id"], "worker_id": "w"}
        await call(s, "complete_task", **refs, output=deepest, next_context=deepest)
        for tool, arguments in (
            ("get_run", {"run_id": rid}),
            ("get_task", {"task_id": claim["task"]["id"]}),
            ("list_run_tasks", {"run_id": rid}),
            ("list_pending_tasks", {}),
            ("list_run_events", {"run_id": rid}),
            ("list_events_since", {}),
            ("get_current_context_snapshot", {"run_id": rid}),
            ("list_runs", {}),
        ):
            await call(s, tool, **arguments)
        await s.read_resource(f"pmcp://runs/{rid}")
        return claim["task"]["id"]

    holder: list[str] = []

    async def main():
        async with Client(build_server(), mode="legacy") as client_:
            holder.append(await scenario(client_.session))

    anyio.run(main)
    task_id = holder[0]
    client.force_login(root_user)
    for url in (
        f"/admin/parallel_mcp/task/{task_id}/change/",
        f"/admin/parallel_mcp/run/{Task.objects.get(pk=task_id).run_id}/change/",
        "/admin/parallel_mcp/event/",
        "/admin/parallel_mcp/contextsnapshot/",
    ):
        assert client.get(url).status_code == 200, url


def test_the_non_blank_pattern_matches_what_the_services_keep():
    import re

    pattern = re.compile(NON_BLANK_PATTERN)
    for good in ("a", " a ", "line\nbreak", "ü", "\ufeff"):
        assert pattern.search(good), good
    for bad in ("", " ", "\n\t", "a\x00", "\x1c\x85\u3000"):
        assert not pattern.search(bad), bad
    # Character by character, the pattern keeps exactly what the services' strip() keeps.
    for code in range(1, 0x110000):
        char = chr(code)
        assert bool(pattern.search(char)) == (char.strip() != ""), hex(code)


@pytest.mark.django_db(transaction=True)
def test_a_taken_id_is_duplicate_id_at_every_door(operator):
    """A caller-supplied id that exists: DuplicateIdError (a ValidationError) in Python, 409
    duplicate_id over HTTP (tests/test_api_errors.py), duplicate_id from the MCP tools."""
    run = Orchestrator().create_run()
    with pytest.raises(ValidationError) as caught:
        Orchestrator().create_run(id=run.pk)
    assert caught.value.code == "duplicate_id"

    async def scenario(s):
        error = await fail(s, "create_run", {"id": str(run.pk)})
        assert error["code"] == "duplicate_id" and error["details"] == {"run_id": str(run.pk)}
        first = "1900-01-01T00:00:00+14:00"  # year 1900 as written, 1899 in UTC
        await call(s, "list_runs", updated_after=first)

    anyio.run(_session_run, scenario)
    assert Run.objects.count() == 1


def test_the_datetime_pattern_states_the_year_range():
    import re

    from parallel_mcp.contract.arguments import WHEN_PATTERN

    pattern = re.compile(WHEN_PATTERN)
    for year in range(10_000):
        text = f"{year:04d}-06-15T12:00:00Z"
        assert bool(pattern.fullmatch(text)) == (limits.MIN_YEAR <= year <= limits.MAX_YEAR), year


@pytest.mark.django_db(transaction=True)
def test_an_empty_batch_is_a_no_op_at_every_door_and_every_schema_says_so(operator):
    """limits.MIN_BATCH (0): a fan-out over an empty list enqueues nothing and fails nowhere;
    the MCP tool's and the OpenAPI schema's bounds are the contract's."""
    orch = Orchestrator()
    run = orch.create_run()
    events = Event.objects.count()
    assert limits.MIN_BATCH == 0
    assert orch.enqueue_tasks(run_id=run.pk, tasks=[]) == []
    response = operator.post(f"runs/{run.pk}/tasks/batch", {"tasks": []})
    assert (response.status_code, response.json()) == (201, {"tasks": []})
    schema = operator.get("schema/").json()["components"]["schemas"]["TaskBatchIn"]
    tasks = schema["properties"]["tasks"]
    assert (tasks["minItems"], tasks["maxItems"]) == (limits.MIN_BATCH, limits.MAX_BATCH)
    assert "empty list is a no-op" in tasks["description"]

    async def scenario(s):
        listed = {t.name: t for t in (await s.list_tools()).tools}
        bounds = listed["enqueue_tasks"].input_schema["properties"]["tasks"]
        assert (bounds["minItems"], bounds["maxItems"]) == (limits.MIN_BATCH, limits.MAX_BATCH)
        assert "empty list is a no-op" in bounds["description"]
        assert await call(s, "enqueue_tasks", run_id=str(run.pk), tasks=[]) == {"tasks": []}
        error = await fail(s, "enqueue_tasks", {"run_id": str(run.pk), "tasks": [{}] * 10_001})
        assert error["code"] == "validation_error"

    anyio.run(_session_run, scenario)
    assert Task.objects.count() == 0 and Event.objects.count() == events

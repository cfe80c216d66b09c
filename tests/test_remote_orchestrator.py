"""``RemoteOrchestrator`` against a live API, compared with the local ``Orchestrator``: every
read gives the same objects (compared in their one serialized shape), every write leaves what
the database then holds, and every refusal is the same exception class."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from parallel_mcp import Orchestrator, exceptions
from parallel_mcp.contract import limits, shapes
from parallel_mcp.exceptions import PermissionDeniedError
from parallel_mcp.ids import new_id
from parallel_mcp.models import ContextSnapshot, Lease, Run
from parallel_mcp.results import EventPage, RemoteClaim
from parallel_mcp.selectors import outstanding_input_requests
from parallel_mcp.services.tool_calls import start_tool_call
from parallel_mcp.worker.remote import RemoteError
from tests.remote_support import remote_for, root_token, worker_token

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

# Small pages, so every list the client walks takes several requests.
PAGE_SIZE = 3


@pytest.fixture
def local() -> Orchestrator:
    return Orchestrator()


@pytest.fixture
def remote(live_server):
    with remote_for(live_server, root_token(), page_size=PAGE_SIZE) as client:
        yield client


def runs(items) -> list[dict]:
    return [shapes.run(item) for item in items]


def tasks(items, *, drop: tuple[str, ...] = ()) -> list[dict]:
    return [
        {key: value for key, value in data.items() if key not in drop}
        for data in shapes.tasks(items)
    ]


def events(items) -> list[dict]:
    return shapes.events(items)


@pytest.fixture
def scene(local) -> dict[str, Any]:
    """Two busy runs and three finished ones: queued, delayed, dependent, dead-lettered,
    running-too-long and cancelled tasks, context snapshots and a few dozen events."""
    run = local.create_run(
        namespace="cmp", external_id="e-1", metadata={"m": 1}, context={"c": 0}, max_parallel=5
    )
    later = timezone.now() + timedelta(hours=1)
    a = local.enqueue_task(run_id=run.id, kind="fetch", key="a", priority=5, input={"n": 1})
    b = local.enqueue_task(run_id=run.id, kind="fetch", key="b", not_before=later)
    c = local.enqueue_task(
        run_id=run.id,
        kind="merge",
        key="c",
        depends_on=[a.id, {"task_id": b.id, "required": False}],
    )
    dead = local.enqueue_task(run_id=run.id, kind="dead", key="d", max_attempts=1)
    claim = local.claim_next_task(worker_id="w1", kinds=["dead"])
    local.fail_task(
        task_id=dead.id, lease_id=claim.lease.id, worker_id="w1", error="boom", retry=True
    )
    stuck = local.enqueue_task(run_id=run.id, kind="stuck", key="e", timeout_ms=1)
    local.claim_next_task(worker_id="w2", kinds=["stuck"], start=True)
    for n in range(3):
        local.enqueue_task(run_id=run.id, kind="more", key=f"more-{n}", priority=n)
    local.append_context_snapshot(run_id=run.id, payload={"c": 1}, label="step")
    other = local.create_run(namespace="cmp", external_id="e-2")
    other_dead = local.enqueue_task(run_id=other.id, kind="dead", max_attempts=1)
    claim = local.claim_next_task(worker_id="w1", kinds=["dead"])
    local.fail_task(
        task_id=other_dead.id, lease_id=claim.lease.id, worker_id="w1", error="x", retry=True
    )
    finished = [local.create_run(namespace="old", external_id=f"f-{n}") for n in range(3)]
    for item in finished:
        local.cancel_run(run_id=item.id, reason="done")
    time.sleep(0.01)  # the stuck task has now run longer than its timeout_ms
    return {
        "run": run,
        "other": other,
        "finished": finished,
        "tasks": {"a": a, "b": b, "c": c, "dead": dead, "stuck": stuck},
        "later": later,
    }


# -- reads --------------------------------------------------------------------------------------


def test_reads_of_runs_match(local, remote, scene):
    run = scene["run"]
    assert runs([remote.get_run(run_id=run.id)]) == runs([local.get_run(run_id=run.id)])
    assert remote.get_run(run_id=str(run.id)).pk == run.id  # ids as text too
    for unknown in (uuid.uuid4(), "nope", None):
        assert remote.get_run(run_id=unknown) is local.get_run(run_id=unknown) is None
    for arguments in (
        {},  # the default limit (100): two pages of 3
        {"limit": 4},
        {"limit": 2, "offset": 3},  # offset: the rows before are read in pages and dropped
        {"offset": 2, "order_by": "created_at", "order_dir": "asc"},
        {"namespace": "cmp", "order_by": "created_at", "order_dir": "asc"},
        {"statuses": ["cancelled"], "offset": 1},
        {"statuses": "active", "external_id": "e-1"},
        {"updated_after": scene["finished"][0].updated_at},
        {"updated_before": scene["finished"][0].updated_at, "offset": 1},
        {"offset": 50},
    ):
        assert runs(remote.list_runs(**arguments)) == runs(local.list_runs(**arguments)), arguments


def test_reads_of_tasks_match(local, remote, scene):
    run, named = scene["run"], scene["tasks"]
    for task in named.values():
        assert tasks([remote.get_task(task_id=task.id)]) == tasks([local.get_task(task_id=task.id)])
    assert remote.get_task(task_id=named["c"].id).depends_on_task_ids == [
        named["a"].id,
        named["b"].id,
    ]
    assert remote.get_task(task_id=uuid.uuid4()) is local.get_task(task_id=uuid.uuid4()) is None
    assert remote.get_task(task_id="nope") is None

    walked = remote.list_run_tasks(run_id=run.id)  # 8 tasks, pages of 3
    assert len(walked) == 8
    assert tasks(walked) == tasks(local.list_run_tasks(run_id=run.id))
    assert remote.list_run_tasks(run_id=uuid.uuid4()) == local.list_run_tasks(run_id=uuid.uuid4())

    for arguments in (
        {},
        {"run_id": run.id, "limit": 3},
        {"kinds": ["fetch", "merge"]},
        {"kinds": "more", "limit": 2},
        {"ready_by": timezone.now(), "limit": 10},
        {"ready_by": scene["later"] + timedelta(seconds=1), "kinds": "fetch"},  # b is due then
        {"run_id": uuid.uuid4()},
    ):
        assert tasks(remote.list_pending_tasks(**arguments)) == tasks(
            local.list_pending_tasks(**arguments)
        ), arguments

    for arguments in ({}, {"run_id": run.id}, {"kinds": ["dead"], "offset": 1}, {"limit": 1}):
        assert tasks(remote.list_dead_tasks(**arguments)) == tasks(
            local.list_dead_tasks(**arguments)
        ), arguments

    stuck_remote = remote.list_stuck_tasks()
    stuck_local = local.list_stuck_tasks()
    assert [task.pk for task in stuck_remote] == [named["stuck"].id]
    assert tasks(stuck_remote, drop=("running_for_ms",)) == tasks(
        stuck_local, drop=("running_for_ms",)
    )
    assert stuck_remote[0].running_for_ms >= 1
    assert [task.pk for task in remote.list_stuck_tasks(running_longer_than_ms=3_600_000)] == [
        named["stuck"].id  # its own timeout_ms is shorter
    ]

    for task in named.values():
        assert remote.explain_task(task_id=task.id) == local.explain_task(task_id=task.id)
    assert [b.kind for b in remote.explain_task(task_id=named["c"].id)] == [
        "dependency_pending",
        "dependency_pending",
    ]


def test_reads_of_context_and_events_match(local, remote, scene):
    run = scene["run"]
    snapshot = remote.get_current_context_snapshot(run_id=run.id)
    assert isinstance(snapshot, ContextSnapshot) and snapshot.payload == {"c": 1}
    assert shapes.snapshot(snapshot) == shapes.snapshot(
        local.get_current_context_snapshot(run_id=run.id)
    )
    assert remote.get_current_context_snapshot(run_id=scene["other"].id) is None  # none yet
    assert remote.get_current_context_snapshot(run_id=uuid.uuid4()) is None

    walked = remote.list_run_events(run_id=run.id)  # pages of 3
    assert len(walked) > 10
    assert events(walked) == events(local.list_run_events(run_id=run.id))
    assert remote.list_run_events(run_id=uuid.uuid4()) == []

    first = local.list_events_since(limit=2)
    for arguments in (
        {},
        {"limit": 2},
        {"after_id": first.next_cursor, "limit": 3},
        {"run_id": run.id, "event_types": ["task.enqueued", "task.failed"]},
        {"event_types": "run.cancelled"},
        {"after_id": 10**9},
        {"run_id": uuid.uuid4(), "after_id": 5},  # an unknown run: nothing, cursor stays
    ):
        mine, theirs = remote.list_events_since(**arguments), local.list_events_since(**arguments)
        assert isinstance(mine, EventPage)
        assert events(mine.events) == events(theirs.events), arguments
        assert mine.next_cursor == theirs.next_cursor, arguments


# -- writes -------------------------------------------------------------------------------------

UNCHANGED = object()


def _same_task(remote_task, local: Orchestrator) -> None:
    assert tasks([remote_task]) == tasks([local.get_task(task_id=remote_task.pk)])


def test_operator_writes_leave_what_the_database_holds(local, remote):
    run_id = new_id()
    run = remote.create_run(
        namespace="w",
        external_id="x-1",
        metadata={"k": 1},
        context={"c": 1},
        id=run_id,
        max_parallel=10,
    )
    assert isinstance(run, Run) and run.pk == run_id
    assert runs([run]) == runs([local.get_run(run_id=run_id)])
    initial = local.get_current_context_snapshot(run_id=run_id)
    assert initial.label == "run.initial" and initial.payload == {"c": 1}

    task_id = new_id()
    at = timezone.now() - timedelta(seconds=1)
    first = remote.enqueue_task(
        run_id=str(run_id),
        kind="k",
        key="a",
        priority=3,
        max_attempts=2,
        retry={"delay_ms": 10, "backoff": "exponential", "max_delay_ms": 100},
        timeout_ms=60_000,
        input={"i": [1, 2]},
        metadata={"m": True},
        not_before=at,
        context_snapshot_id=initial.id,
        id=task_id,
    )
    _same_task(first, local)
    assert first.pk == task_id and first.retry_backoff == "exponential"

    batch = remote.enqueue_tasks(
        run_id=run_id,
        tasks=(
            {"kind": "k", "key": "b", "depends_on": [task_id]},
            {"kind": "k", "key": "c", "depends_on": ["b", {"task_id": task_id, "required": False}]},
            {"kind": "pause", "key": "p"},
        ),
    )
    assert [task.key for task in batch] == ["b", "c", "p"]
    for task in batch:
        _same_task(task, local)
    assert batch[1].depends_on_task_ids == [batch[0].pk, task_id]

    snapshot = remote.append_context_snapshot(
        run_id=run_id,
        payload={"note": "task scope"},
        scope="task",
        label="mine",
        task_id=task_id,
        parent_snapshot_id=initial.id,
    )
    assert shapes.snapshot(snapshot) == shapes.snapshot(ContextSnapshot.objects.get(pk=snapshot.pk))
    current = remote.append_context_snapshot(run_id=run_id, payload={"c": 2})
    assert local.get_current_context_snapshot(run_id=run_id).pk == current.pk

    # resume with and without new input
    for key, answer in (("p", {"answer": 42}), ("p", UNCHANGED)):
        claim = local.claim_next_task(worker_id="op", kinds=["pause"])
        local.pause_task(
            task_id=claim.task.id, lease_id=claim.lease.id, worker_id="op", status="waiting_input"
        )
        extra = {} if answer is UNCHANGED else {"input": answer}
        resumed = remote.resume_task(task_id=claim.task.id, reason="answered", **extra)
        _same_task(resumed, local)
        assert resumed.status == "queued" and resumed.input == {"answer": 42}, key

    cancelled = remote.cancel_task(task_id=batch[2].pk, reason="not needed")
    _same_task(cancelled, local)
    assert cancelled.status == "cancelled"
    retried = remote.retry_task(task_id=batch[2].pk, cascade=False, reason="again")
    _same_task(retried, local)
    assert retried.status == "queued"

    claim = local.claim_next_task(worker_id="op", kinds=["k"])
    local.fail_task(
        task_id=claim.task.id, lease_id=claim.lease.id, worker_id="op", error="e", retry=False
    )
    dead = local.enqueue_task(run_id=run_id, kind="dlq", max_attempts=1)
    claim = local.claim_next_task(worker_id="op", kinds=["dlq"])
    local.fail_task(task_id=dead.id, lease_id=claim.lease.id, worker_id="op", error="e", retry=True)
    requeued = remote.requeue_dead_task(
        task_id=dead.id, reset_attempts=False, not_before=at, reason="fixed"
    )
    _same_task(requeued, local)
    assert requeued.status == "queued" and requeued.attempt_count == 1 and not requeued.dead

    copy = remote.copy_run(run_id=run_id, reason="rerun")
    assert runs([copy]) == runs([local.get_run(run_id=copy.pk)])
    assert copy.tasks_total == local.get_run(run_id=run_id).tasks_total

    ended = remote.cancel_run(run_id=copy.pk, reason="stop")
    assert ended.status == "cancelled"
    assert runs([ended]) == runs([local.get_run(run_id=copy.pk)])

    short = local.enqueue_task(run_id=run_id, kind="short")
    local.claim_next_task(worker_id="op", kinds=["short"], lease_ms=1)
    time.sleep(0.01)
    expired = remote.expire_leases()
    assert expired.expired_task_ids == [short.id] and expired.count == 1
    assert remote.expire_leases().count == 0

    pruned = remote.prune_runs(older_than=timedelta(0), statuses=["cancelled"], limit=5)
    assert pruned.pruned_run_ids == [copy.pk] and pruned.count == 1
    assert local.get_run(run_id=copy.pk) is None
    local.cancel_run(run_id=run_id)
    pruned = remote.prune_runs(older_than=timezone.now() + timedelta(seconds=1))
    assert pruned.pruned_run_ids == [run_id]


def test_the_worker_protocol_leaves_what_the_database_holds(local, remote):
    run = local.create_run(context={"step": 1})
    blocker = local.enqueue_task(run_id=run.id, kind="other")
    for key in ("a", "b", "c", "d"):
        local.enqueue_task(run_id=run.id, kind="job", key=key)

    claim = remote.claim_next_task(worker_id="rw", kinds=("job",), client_token="t-1")
    assert isinstance(claim, RemoteClaim) and claim.context == {"step": 1}
    assert claim.task.key == "a" and claim.lease.worker_id == "rw"
    ids = {"task_id": claim.task.pk, "lease_id": claim.lease.pk, "worker_id": "rw"}
    _same_task(remote.mark_task_running(**ids), local)
    lease = remote.heartbeat_lease(**ids, lease_ms=60_000)
    assert shapes.lease(lease) == shapes.lease(Lease.objects.get(pk=lease.pk))
    _same_task(remote.report_progress(**ids, progress=0.5, message="half"), local)
    paused = remote.pause_task(**ids, status="blocked", reason="wait", blocked_by=[blocker.id])
    _same_task(paused, local)
    assert paused.status == "blocked"

    claims = remote.claim_next_tasks(worker_id="rw", limit=3, kinds=["job"], start=True)
    assert [item.task.key for item in claims] == ["b", "c", "d"]
    done, failed, released = (
        {"task_id": item.task.pk, "lease_id": item.lease.pk, "worker_id": "rw"} for item in claims
    )
    completed = remote.complete_task(
        **done, output={"ok": 1}, metadata={"t": 1}, next_context={"step": 2},
        next_context_label="after b", client_token="done-b",
    )  # fmt: skip
    _same_task(completed, local)
    assert local.get_current_context_snapshot(run_id=run.id).payload == {"step": 2}
    assert remote.complete_task(**done, output={"ok": 1}, client_token="done-b").pk == (
        completed.pk
    )  # a replay
    _same_task(remote.fail_task(**failed, error="no", metadata={"x": 1}, retry=False), local)
    _same_task(remote.release_task(**released, reason="later"), local)
    assert [local.get_task(task_id=item.task.pk).status for item in claims] == [
        "completed",
        "failed",
        "queued",
    ]

    # A task of a tool call's run asks the MCP client, in the pause itself.
    call = start_tool_call(
        using="default", tool="t", kind="tool.t", input={}, principal="local", ttl_ms=None
    )
    claim = remote.claim_next_task(worker_id="rw", kinds=["tool.t"])
    ids = {"task_id": claim.task.pk, "lease_id": claim.lease.pk, "worker_id": "rw"}
    request = {"method": "roots/list"}
    asking = remote.pause_task(**ids, status="waiting_input", input_requests={"roots": request})
    _same_task(asking, local)
    assert outstanding_input_requests(using="default", run_id=call.run_id) == {"roots": request}


# -- refusals: the same exception class as locally ----------------------------------------------

REFUSALS: list[tuple[str, Callable[[Any, dict], Any]]] = [
    ("malformed run id", lambda o, s: o.cancel_run(run_id="nope")),
    ("unknown run", lambda o, s: o.enqueue_task(run_id=uuid.uuid4(), kind="k")),
    ("unknown task", lambda o, s: o.cancel_task(task_id=uuid.uuid4())),
    ("explain unknown", lambda o, s: o.explain_task(task_id=uuid.uuid4())),
    ("empty kind", lambda o, s: o.enqueue_task(run_id=s["run"].id, kind="")),
    ("zero attempts", lambda o, s: o.enqueue_task(run_id=s["run"].id, kind="k", max_attempts=0)),
    ("json input", lambda o, s: o.enqueue_task(run_id=s["run"].id, kind="k", input={1, 2})),
    ("duplicate key", lambda o, s: o.enqueue_task(run_id=s["run"].id, kind="k", key="a")),
    (
        "cycle",
        lambda o, s: o.enqueue_tasks(
            run_id=s["run"].id,
            tasks=[
                {"kind": "k", "key": "x", "depends_on": ["y"]},
                {"kind": "k", "key": "y", "depends_on": ["x"]},
            ],
        ),
    ),
    ("unknown field", lambda o, s: o.enqueue_tasks(run_id=s["run"].id, tasks=[{"kind": "k", "x": 1}])),  # noqa: E501
    ("bad dependency", lambda o, s: o.enqueue_task(run_id=s["run"].id, kind="k", depends_on=[uuid.uuid4()])),  # noqa: E501
    ("resume queued", lambda o, s: o.resume_task(task_id=s["a"].id)),
    ("requeue live", lambda o, s: o.requeue_dead_task(task_id=s["a"].id)),
    ("terminal run", lambda o, s: o.enqueue_task(run_id=s["ended"].id, kind="k")),
    ("wrong lease", lambda o, s: o.complete_task(task_id=s["a"].id, lease_id=uuid.uuid4(), worker_id="w")),  # noqa: E501
    ("order_by", lambda o, s: o.list_runs(order_by="id")),
    ("limit", lambda o, s: o.list_runs(limit=0)),
    ("negative offset", lambda o, s: o.list_dead_tasks(offset=-1)),
    ("prune live", lambda o, s: o.prune_runs(older_than=timedelta(0), statuses=["active"])),
    ("naive datetime", lambda o, s: o.list_runs(updated_after=s["naive"])),
    ("after_id", lambda o, s: o.list_events_since(after_id=-1)),
    ("progress", lambda o, s: o.report_progress(task_id=s["a"].id, lease_id=uuid.uuid4(), worker_id="w", progress=2)),  # noqa: E501
    ("lease_ms", lambda o, s: o.claim_next_task(worker_id="w", lease_ms=0)),
    ("batch limit", lambda o, s: o.claim_next_tasks(worker_id="w", limit=101)),
    ("blocked asking", lambda o, s: o.pause_task(task_id=s["a"].id, lease_id=uuid.uuid4(), worker_id="w", status="blocked", input_requests={"q": {"method": "roots/list"}})),  # noqa: E501
    ("input method", lambda o, s: o.pause_task(task_id=s["a"].id, lease_id=uuid.uuid4(), worker_id="w", status="waiting_input", input_requests={"q": {"method": "tools/call"}})),  # noqa: E501
]  # fmt: skip


def test_refusals_are_the_same_exception_as_locally(local, remote):
    run = local.create_run()
    a = local.enqueue_task(run_id=run.id, kind="k", key="a")
    ended = local.create_run()
    local.cancel_run(run_id=ended.id)
    state = {"run": run, "a": a, "ended": ended, "naive": timezone.now().replace(tzinfo=None)}
    for name, call in REFUSALS:
        with pytest.raises(exceptions.ParallelMcpError) as here:
            call(local, state)
        with pytest.raises(exceptions.ParallelMcpError) as there:
            call(remote, state)
        assert type(there.value) is type(here.value), (name, here.value, there.value)
        if "field" in here.value.details:  # the argument, or where in it (tasks.0.kind)
            field = here.value.details["field"].split(".")[0]
            assert there.value.details["field"].split(".")[0] == field, name
    assert local.get_task(task_id=a.id).status == "queued"  # nothing was applied


def test_the_remote_only_limits(remote):
    with pytest.raises(exceptions.ValidationError) as refused:
        remote.list_runs(offset=limits.MAX_REMOTE_OFFSET + 1)
    assert refused.value.details["field"] == "offset"
    assert remote.list_runs(offset=limits.MAX_REMOTE_OFFSET) == []


def test_what_a_token_may_not_do_is_refused_as_locally(live_server, local):
    """A worker token's role reads but never operates; its user (work_tasks only) may not read:
    both refusals are the orchestrator's PermissionDeniedError, naming what is missing."""
    run = local.create_run()
    with remote_for(live_server, worker_token()) as client:
        for call, reason in (
            (lambda: client.get_task(task_id=uuid.uuid4()), "permission parallel_mcp.view_task"),
            (lambda: client.list_run_tasks(run_id=run.id), "permission parallel_mcp.view_task"),
            (lambda: client.cancel_run(run_id=run.id), "role 'worker'"),
        ):
            with pytest.raises(PermissionDeniedError) as refused:
                call()
            assert reason in refused.value.message
    with remote_for(live_server, "pmcp_000000000000_nope") as client:
        with pytest.raises(RemoteError) as refused:
            client.get_run(run_id=run.id)
        assert refused.value.details == {"status": 401, "code": "authentication_failed"}
    assert local.get_run(run_id=run.id).status == "pending"

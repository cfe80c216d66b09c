"""The hot transitions on the write unit's static SQL (services/claim.py, complete.py,
leases.py): batched claims, claims straight into running, batched completions, and that each
behaves as the contract says."""

from __future__ import annotations

from collections import Counter
from datetime import datetime
from typing import Any
from uuid import uuid4

import pytest
from django.db import connections, transaction

from parallel_mcp import Orchestrator
from parallel_mcp.exceptions import (
    IdempotencyConflictError,
    LeaseConflictError,
    LeaseExpiredError,
    ValidationError,
)
from parallel_mcp.models import Attempt, ClientTokenRecord, Event, Lease, Run, Task
from parallel_mcp.services import complete_and_claim, complete_tasks
from parallel_mcp.services.dialect import uuid_array
from parallel_mcp.services.write import Write
from tests.conftest import at, event_types
from tests.thread_support import race


def tasks_of(run) -> list[Task]:
    return list(Task.objects.filter(run_id=run.id))


def item(claim, **extra):
    return {"task_id": claim.task.id, "lease_id": claim.lease.id, **extra}


# -- claim_next_tasks -----------------------------------------------------------------------------


def test_a_batch_claims_in_claim_order_each_with_its_own_lease(orch, run):
    low = orch.enqueue_task(run_id=run.id, kind="k", priority=0, now=at(0))
    high = orch.enqueue_task(run_id=run.id, kind="k", priority=5, now=at(1))
    older = orch.enqueue_task(run_id=run.id, kind="k", priority=0, now=at(-1))
    claims = orch.claim_next_tasks(worker_id="w", limit=10, now=at(2))

    assert [c.task.id for c in claims] == [high.id, older.id, low.id]
    assert len({c.lease.id for c in claims}) == 3
    for c in claims:
        assert c.task.status == "leased" and c.task.lease_id == c.lease.id
        assert c.attempt.id == c.lease.id and c.run.id == run.id
        stored = Task.objects.get(pk=c.task.id)
        assert (stored.status, stored.attempt_count, stored.leased_by) == ("leased", 1, "w")
        assert Lease.objects.get(pk=c.lease.id).status == "active"
        assert Attempt.objects.get(pk=c.lease.id).status == "leased"
    assert Counter(event_types(orch, run.id))["task.claimed"] == 3


@pytest.mark.parametrize("start", [False, True])
def test_a_batch_claim_writes_each_attempt_and_lease_with_its_token_in_claim_order(
    orch, run, start
):
    # The claim's statement builds the rows from the claimed tasks (claim.py, _selected_row):
    # lease n of a batch carries "<token>#n", n its place in claim order, as the replay
    # reads them back.
    for n, priority in enumerate([0, 5, 0, 9]):
        orch.enqueue_task(run_id=run.id, kind="k", priority=priority, now=at(n))
    claims = orch.claim_next_tasks(worker_id="w", limit=4, client_token="b", start=start, now=at(5))
    status = "running" if start else "leased"
    for n, c in enumerate(claims):
        lease, attempt = Lease.objects.get(pk=c.lease.id), Attempt.objects.get(pk=c.lease.id)
        assert (lease.client_token, c.lease.client_token) == (f"b#{n}", f"b#{n}")
        assert (lease.task_id, lease.attempt_id, lease.worker_id) == (c.task.id, c.lease.id, "w")
        assert (lease.acquired_at, lease.heartbeat_at, lease.expires_at) == (
            at(5), at(5), c.task.lease_expires_at
        )  # fmt: skip
        assert (attempt.task_id, attempt.status, attempt.leased_at) == (c.task.id, status, at(5))
        assert attempt.started_at == (at(5) if start else None)
    replayed = orch.claim_next_tasks(
        worker_id="w", limit=4, client_token="b", start=start, now=at(6)
    )
    assert [c.task.id for c in replayed] == [c.task.id for c in claims]
    orch.enqueue_task(run_id=run.id, kind="k", now=at(6))
    single = orch.claim_next_task(worker_id="w", client_token="one", start=start, now=at(7))
    assert Lease.objects.get(pk=single.lease.id).client_token == "one"  # no number
    assert Attempt.objects.get(pk=single.lease.id).status == status


def stored_fields(model, pk) -> dict[str, Any]:
    stored = model.objects.get(pk=pk)
    return {field.attname: getattr(stored, field.attname) for field in model._meta.concrete_fields}


@pytest.mark.parametrize("start", [False, True])
@pytest.mark.parametrize("how", ["single", "single_token", "batch_token", "cycle"])
def test_a_claim_writes_and_returns_every_column_of_its_attempt_and_lease(orch, run, how, start):
    # One list says what the row holds (claim.ATTEMPT_ROW; the lease is read from it through
    # the view pmcp_lease): PostgreSQL selects it in the claim's statement, SQLite inserts it
    # as values; both must write this row, and the instances a claim returns must be what
    # the ORM reads.
    from parallel_mcp.actors import Actor, acting_as

    for n in range(2):
        orch.enqueue_task(run_id=run.id, kind="k", priority=n, now=at(n))
    with acting_as(Actor(principal="user:7")):
        if how == "cycle":
            _, claims = complete_and_claim(
                using="default", worker_id="w", items=[], limit=2, lease_ms=5_000,
                client_token="c", start=start, now=at(5),
            )  # fmt: skip
        elif how == "batch_token":
            claims = orch.claim_next_tasks(
                worker_id="w", limit=2, lease_ms=5_000, client_token="c", start=start, now=at(5)
            )
        else:
            token = "c" if how == "single_token" else None
            claims = [
                orch.claim_next_task(
                    worker_id="w", lease_ms=5_000, client_token=token, start=start, now=at(5)
                )
            ]
    assert claims and all(claims)
    for n, c in enumerate(claims):
        common = {"id": c.task.lease_id, "run_id": run.id, "task_id": c.task.id, "worker_id": "w"}
        token = {"single": None, "single_token": "c"}.get(how, f"c#{n}")
        assert stored_fields(Attempt, c.lease.id) == {
            **common,
            "status": "running" if start else "leased",
            "leased_at": at(5),
            "started_at": at(5) if start else None,
            "ended_at": None,
            "lease_expires_at": at(10),
            "error": None,
            "output": None,
            "metadata": None,
            "heartbeat_at": None,  # none yet: the lease reads its leased_at
            "client_token": token,
            "principal": "user:7",
        }
        assert stored_fields(Lease, c.lease.id) == {
            **common,
            "attempt_id": c.task.lease_id,
            "status": "active",
            "acquired_at": at(5),
            "expires_at": at(10),
            "heartbeat_at": at(5),
            "released_at": None,
            "client_token": token,
            "principal": "user:7",
        }
        for model, returned in ((Attempt, c.attempt), (Lease, c.lease)):
            fields = model._meta.concrete_fields
            assert {f.attname: getattr(returned, f.attname) for f in fields} == stored_fields(
                model, returned.pk
            )


def test_a_batch_takes_only_ready_due_tasks_of_the_asked_kinds(orch, run):
    root = orch.enqueue_task(run_id=run.id, kind="a", now=at(0))
    orch.enqueue_task(run_id=run.id, kind="a", depends_on=[root.id], now=at(0))
    orch.enqueue_task(run_id=run.id, kind="a", not_before=at(100), now=at(0))
    other = orch.enqueue_task(run_id=run.id, kind="b", now=at(0))
    claims = orch.claim_next_tasks(worker_id="w", limit=5, kinds=["a"], now=at(1))
    assert [c.task.id for c in claims] == [root.id]
    assert [c.task.id for c in orch.claim_next_tasks(worker_id="w", limit=5, now=at(1))] == [
        other.id
    ]
    assert orch.claim_next_tasks(worker_id="w", limit=5, now=at(2)) == []


def test_limit_caps_the_batch(orch, run):
    for _ in range(5):
        orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    assert len(orch.claim_next_tasks(worker_id="w", limit=2, now=at(1))) == 2
    assert len(orch.claim_next_tasks(worker_id="w", limit=100, now=at(1))) == 3


@pytest.mark.parametrize("limit", [0, -1, 101, "3", 2.0, True, None])
def test_bad_limits_are_refused_before_anything_is_written(orch, run, limit):
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    with pytest.raises(ValidationError) as caught:
        orch.claim_next_tasks(worker_id="w", limit=limit, now=at(1))
    assert caught.value.details["field"] == "limit"
    assert not Lease.objects.exists()


@pytest.mark.parametrize("method", ["claim_next_task", "claim_next_tasks"])
def test_start_must_be_a_boolean(orch, run, method):
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    extra = {"limit": 1} if method == "claim_next_tasks" else {}
    with pytest.raises(ValidationError):
        getattr(orch, method)(worker_id="w", start="yes", now=at(1), **extra)
    assert Task.objects.get().status == "queued"


def test_a_batch_replays_with_its_client_token_and_refuses_another_worker(orch, run):
    for _ in range(3):
        orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    first = orch.claim_next_tasks(worker_id="w", limit=2, client_token="batch-1", now=at(1))
    again = orch.claim_next_tasks(worker_id="w", limit=2, client_token="batch-1", now=at(2))
    assert [c.lease.id for c in again] == [c.lease.id for c in first]
    assert sorted(Lease.objects.values_list("client_token", flat=True)) == [
        "batch-1#0",
        "batch-1#1",
    ]
    with pytest.raises(IdempotencyConflictError):
        orch.claim_next_tasks(worker_id="other", limit=2, client_token="batch-1", now=at(2))
    assert Task.objects.filter(status="queued").count() == 1


def test_start_claims_straight_into_running(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    claim = orch.claim_next_task(worker_id="w", start=True, now=at(1))
    stored = Task.objects.get(pk=task.id)
    assert claim.task.status == stored.status == "running"
    assert stored.started_at == at(1)
    attempt = Attempt.objects.get(pk=claim.lease.id)
    assert (attempt.status, attempt.started_at) == ("running", at(1))
    assert event_types(orch, run.id)[-2:] == ["task.claimed", "task.running"]
    # A running task completes as usual.
    orch.complete_task(task_id=task.id, lease_id=claim.lease.id, worker_id="w", now=at(2))
    assert Run.objects.get(pk=run.id).status == "completed"


def test_a_batch_claim_with_start_keeps_a_max_parallel_runs_limit(orch):
    run = orch.create_run(max_parallel=2, now=at(0))
    for _ in range(4):
        orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    claims = orch.claim_next_tasks(worker_id="w", limit=4, start=True, now=at(1))
    claims += orch.claim_next_tasks(worker_id="w", limit=4, start=True, now=at(1))
    claims += orch.claim_next_tasks(worker_id="w", limit=4, start=True, now=at(1))
    assert len(claims) == 2  # the run's limit holds, batch or not
    assert {c.task.status for c in claims} == {"running"}
    assert Counter(event_types(orch, run.id))["task.running"] == 2


def test_a_failing_statement_rolls_the_whole_claim_back(orch, run, monkeypatch):
    for _ in range(3):
        orch.enqueue_task(run_id=run.id, kind="k", now=at(0))

    def broken(*args, **kwargs):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(Write, "_events", broken)
    with pytest.raises(RuntimeError):
        orch.claim_next_tasks(worker_id="w", limit=3, now=at(1))
    assert set(Task.objects.values_list("status", flat=True)) == {"queued"}
    assert not Lease.objects.exists() and not Attempt.objects.exists()


# -- complete_tasks -------------------------------------------------------------------------------


def test_a_batch_completes_tasks_and_releases_a_shared_dependent(orch, run):
    a = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    b = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    joined = orch.enqueue_task(run_id=run.id, kind="k", depends_on=[a.id, b.id], now=at(0))
    claims = orch.claim_next_tasks(worker_id="w", limit=5, now=at(1))
    assert {c.task.id for c in claims} == {a.id, b.id}

    results = complete_tasks(
        using="default",
        worker_id="w",
        items=[item(claims[0], output={"n": 0}), item(claims[1], output=[1, 2])],
        now=at(2),
    )
    assert [r.status for r in results] == ["completed", "completed"]
    assert Task.objects.get(pk=claims[0].task.id).output == {"n": 0}
    assert Task.objects.get(pk=claims[1].task.id).output == [1, 2]
    assert Attempt.objects.get(pk=claims[1].lease.id).output == [1, 2]
    stored = Task.objects.get(pk=joined.id)
    assert stored.unmet_dependencies == 0  # one unmet edge less per completed dependency
    assert {lease.status for lease in Lease.objects.all()} == {"released"}
    counts = Run.objects.get(pk=run.id)
    assert (counts.tasks_active, counts.tasks_completed, counts.status) == (1, 2, "active")
    last = orch.claim_next_task(worker_id="w", now=at(3))
    assert last.task.id == joined.id
    complete_tasks(using="default", worker_id="w", items=[item(last)], now=at(4))
    assert Run.objects.get(pk=run.id).status == "completed"
    assert event_types(orch, run.id)[-2:] == ["task.completed", "run.status.changed"]


def test_a_refused_item_does_not_hold_back_the_others(orch, run):
    for _ in range(4):
        orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    claims = orch.claim_next_tasks(worker_id="w", limit=4, now=at(1))
    items = [
        item(claims[0]),
        {"task_id": claims[1].task.id, "lease_id": claims[2].lease.id},  # someone else's lease
        item(claims[2], output={"bad": object()}),  # not JSON
        item(claims[3], client_token="t-3"),
    ]
    results = complete_tasks(using="default", worker_id="w", items=items, now=at(2))
    assert results[0].status == "completed"
    assert isinstance(results[1], LeaseConflictError)
    assert isinstance(results[2], ValidationError)
    assert results[3].status == "completed"
    statuses = {c.task.id: Task.objects.get(pk=c.task.id).status for c in claims}
    assert [statuses[c.task.id] for c in claims] == ["completed", "leased", "leased", "completed"]
    assert Run.objects.get(pk=run.id).tasks_completed == 2


def test_items_that_swap_their_leases_are_both_refused(orch, run):
    # Each item's lease must be its own task's: on PostgreSQL the pairs travel as two arrays
    # (Dialect.uuid_pairs), and a task matches only the lease at its own position.
    for _ in range(3):
        orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    a, b, c = orch.claim_next_tasks(worker_id="w", limit=3, now=at(1))
    items = [
        {"task_id": a.task.id, "lease_id": b.lease.id},
        {"task_id": b.task.id, "lease_id": a.lease.id},
        item(c),
    ]
    results = complete_tasks(using="default", worker_id="w", items=items, now=at(2))
    assert [type(result) for result in results[:2]] == [LeaseConflictError] * 2
    assert results[2].status == "completed"
    statuses = [Task.objects.get(pk=claim.task.id).status for claim in (a, b, c)]
    assert statuses == ["leased", "leased", "completed"]


def test_an_expired_lease_is_refused_like_complete_task(orch, run):
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    claim = orch.claim_next_task(worker_id="w", lease_ms=1000, now=at(1))
    (result,) = complete_tasks(using="default", worker_id="w", items=[item(claim)], now=at(5))
    assert isinstance(result, LeaseExpiredError)
    assert Task.objects.get().status == "leased"


def test_a_replayed_token_in_a_batch_replays_and_the_rest_complete(orch, run):
    for _ in range(2):
        orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    first, second = orch.claim_next_tasks(worker_id="w", limit=2, now=at(1))
    complete_tasks(
        using="default", worker_id="w", items=[item(first, client_token="done-1")], now=at(2)
    )
    results = complete_tasks(
        using="default",
        worker_id="w",
        items=[item(first, client_token="done-1"), item(second, client_token="done-2")],
        now=at(3),
    )
    assert [r.status for r in results] == ["completed", "completed"]
    assert ClientTokenRecord.objects.count() == 2
    completed = Counter(
        Event.objects.filter(event_type="task.completed").values_list("task_id", flat=True)
    )
    assert set(completed.values()) == {1}


def test_completing_a_task_that_blocks_others_goes_through_the_orm_path(orch, run):
    blocker = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    waiter = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    claims = orch.claim_next_tasks(worker_id="w", limit=2, now=at(1))
    by_task = {c.task.id: c for c in claims}
    orch.pause_task(
        **item(by_task[waiter.id]),
        worker_id="w",
        status="blocked",
        blocked_by=[blocker.id],
        now=at(2),
    )
    (done,) = complete_tasks(
        using="default", worker_id="w", items=[item(by_task[blocker.id])], now=at(3)
    )
    assert done.status == "completed"
    assert Task.objects.get(pk=waiter.id).status == "queued"  # unblocked in the same write


# -- heartbeat and running ------------------------------------------------------------------------


# -- complete_and_claim (a local worker's cycle) -----------------------------------------------


def cycle(items, limit, *, token="cycle-1", now=None, worker="w"):
    return complete_and_claim(
        using="default",
        worker_id=worker,
        items=items,
        limit=limit,
        lease_ms=60_000,
        client_token=token,
        start=True,
        now=now or at(2),
    )


@pytest.mark.parametrize("limit", [-1, 101, "3", 2.0, True, None])
def test_a_cycle_refuses_a_bad_limit_before_anything_is_written(orch, run, limit):
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    with pytest.raises(ValidationError) as caught:
        cycle([], limit)
    assert caught.value.details["field"] == "limit"
    assert not Lease.objects.exists()


def test_a_cycle_completes_and_claims_in_one_transaction(orch, run):
    for _ in range(4):
        orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    first = orch.claim_next_tasks(worker_id="w", limit=2, start=True, now=at(1))
    results, claims = cycle(
        [item(c, output={"n": 1}, client_token=f"d-{c.task.id}") for c in first], 5
    )
    assert results == [None, None]  # completed: nothing read back (complete.FINISHED)
    assert {t.status for t in Task.objects.filter(pk__in=[c.task.id for c in first])} == {
        "completed"
    }
    assert len(claims) == 2 and {c.task.status for c in claims} == {"running"}
    assert {c.lease.client_token for c in claims} == {"cycle-1#0", "cycle-1#1"}
    counts = Run.objects.get(pk=run.id)
    assert (counts.tasks_active, counts.tasks_completed) == (2, 2)
    assert ClientTokenRecord.objects.count() == 2
    # Completed, then claimed: the events of one transaction, in that order.
    assert event_types(orch, run.id)[-6:] == ["task.completed"] * 2 + [
        "task.claimed", "task.running"
    ] * 2  # fmt: skip


def fields_of(instance) -> dict[str, Any]:
    """Every concrete field's value; a datetime with its time zone's ``repr`` (equal instants
    in another zone object would compare equal)."""
    values = {}
    for field in type(instance)._meta.concrete_fields:
        value = getattr(instance, field.attname)
        values[field.attname] = (
            (value, repr(value.tzinfo)) if isinstance(value, datetime) else value
        )
    return values


def test_the_instances_a_cycle_returns_are_what_the_orm_reads(orch, run):
    # The write path builds its instances from rows without Model.__init__ (dialect.py):
    # each must hold every field, saved, exactly as the ORM loads the same row.
    for _ in range(4):
        orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    first = orch.claim_next_tasks(worker_id="w", limit=2, start=True, now=at(1))
    before = Run.objects.get(pk=run.id)  # the claims' run, as their transaction read it
    results, claims = cycle([item(c, output={"n": 1}) for c in first], 2)
    assert len(claims) == 2 and claims[0].run is claims[1].run  # one instance per run
    loaded = [
        *[(c.task, Task.objects.get(pk=c.task.pk)) for c in claims],
        *[(c.attempt, Attempt.objects.get(pk=c.attempt.pk)) for c in claims],
        *[(c.lease, Lease.objects.get(pk=c.lease.pk)) for c in claims],
        (claims[0].run, before),
    ]
    assert results == [None, None]  # a cycle reads back no completed task
    done = complete_tasks(
        using="default", worker_id="w", items=[item(c) for c in claims], now=at(3)
    )
    loaded += [(task, Task.objects.get(pk=task.pk)) for task in done]
    for built, orm in loaded:
        assert set(built.__dict__) == set(orm.__dict__)  # every field, no more
        assert fields_of(built) == fields_of(orm)
        assert (built._state.adding, built._state.db) == (False, "default")


def test_a_cycle_reads_back_only_what_its_completions_need(orch, run):
    # The guard of a cycle's completions returns complete.FINISHED, not the whole row: the
    # worker reads nothing of a completed task, and _finish only those fields.
    from parallel_mcp.services.complete import FINISHED

    for _ in range(2):
        orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    first = orch.claim_next_tasks(worker_id="w", limit=2, start=True, now=at(1))
    sent: list[str] = []

    def keep(execute, sql, params, many, context):
        sent.append(sql)
        return execute(sql, params, many, context)

    with connections["default"].execute_wrapper(keep):
        results, _ = cycle([item(c, metadata={"m": 1}) for c in first], 0)
    assert results == [None, None]
    (guard,) = [sql for sql in sent if "status = 'completed'" in sql]
    assert guard.endswith(f"RETURNING {', '.join(FINISHED)}")
    for claim in first:  # the metadata merged from what the guard returned
        assert Task.objects.get(pk=claim.task.id).metadata == {"m": 1}


@pytest.mark.skipif(
    connections["default"].vendor != "postgresql", reason="uuid[] parameters: PostgreSQL only"
)
@pytest.mark.django_db
def test_a_uuid_array_parameter_reads_back_as_the_uuids_it_was_given():
    # Sent as the array's text (dialect.uuid_array), read as the uuid[] its place needs.
    ids = [uuid4(), None, uuid4()]
    with connections["default"].cursor() as cursor:
        cursor.execute("SELECT %s::uuid[]", [uuid_array([ids[0], None, str(ids[2])])])
        assert cursor.fetchone()[0] == ids
    with pytest.raises(ValueError):  # a str that is no UUID never becomes array syntax
        uuid_array(["a},{b"])


@pytest.mark.skipif(
    connections["default"].vendor != "postgresql", reason="psycopg's pipeline: PostgreSQL only"
)
@pytest.mark.django_db(transaction=True)
def test_an_outermost_write_sends_its_begin_with_its_first_batch(orch, run, monkeypatch):
    # psycopg would send BEGIN alone and wait for it (a sync: a round trip of its own) before
    # a write's first batch (statements.py). Its pipeline's syncs are psycopg internals:
    # counted here through the method every sync goes through.
    from psycopg import _pipeline_base

    syncs = []
    original = _pipeline_base.BasePipeline._sync_gen

    def counted(pipeline):
        syncs.append(pipeline)
        return (yield from original(pipeline))

    monkeypatch.setattr(_pipeline_base.BasePipeline, "_sync_gen", counted)
    for _ in range(3):
        orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    (first,) = orch.claim_next_tasks(worker_id="w", limit=1, start=True, now=at(1))
    raw = connections["default"].connection
    syncs.clear()
    results, claims = cycle([item(first)], 1)
    assert results == [None] and len(claims) == 1
    assert len(syncs) == 1  # the COMMIT's alone
    assert (raw.autocommit, raw.info.transaction_status) == (True, 0)  # as Django left it
    # Inside a caller's transaction the write is not outermost: psycopg begins as usual, and
    # the caller's transaction holds the write until it commits.
    with transaction.atomic():
        results, claims = cycle([item(claims[0])], 1, token="cycle-2")
        assert raw.autocommit is False and raw.info.transaction_status != 0
    assert Task.objects.filter(status="completed").count() == 2
    assert Run.objects.get(pk=run.id).tasks_completed == 2


@pytest.mark.skipif(
    connections["default"].vendor != "postgresql", reason="generic plans: PostgreSQL only"
)
@pytest.mark.django_db(transaction=True)
def test_the_generic_plans_of_a_write_look_rows_up_by_key_while_the_tables_are_small():
    # A worker's connection prepares its statements after a few calls, often while the
    # attempts and leases are few (a new database, a bench, analyzed while empty); the write's
    # prelude keeps the generic plan for the connection's life, so a sequential scan chosen
    # then would make every later completion read the whole table (bench/FINDINGS.md).
    from parallel_mcp.services.write import write

    connection = connections["default"]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE pmcp_attempt")  # empty: the planner knows it is small
    with write(using="default", now=at(0)) as w:
        w.db.send("SELECT 1", [])  # the prelude goes with the write's first statement
        with connection.cursor() as cursor:
            cursor.execute(
                "PREPARE pmcp_probe(uuid[]) AS "
                "UPDATE pmcp_attempt SET ended_at = ended_at WHERE id = ANY($1)"
            )
            cursor.execute("EXPLAIN EXECUTE pmcp_probe('{}')")
            plan = "\n".join(row[0] for row in cursor.fetchall())
            cursor.execute("DEALLOCATE pmcp_probe")
    assert "Index Scan using pmcp_attempt_pkey" in plan, plan
    with connection.cursor() as cursor:  # the write's settings ended with its transaction
        cursor.execute("SELECT current_setting('enable_seqscan')")
        assert cursor.fetchone()[0] == "on"


def _generic_plan(sql: str, *args: str) -> str:
    """The plan a write's prelude keeps for ``sql`` (``%s`` parameters, their types inferred),
    executed with ``args`` (SQL literals)."""
    from parallel_mcp.services.write import write

    numbered = sql
    for n in range(1, sql.count("%s") + 1):
        numbered = numbered.replace("%s", f"${n}", 1)
    connection = connections["default"]
    with write(using="default", now=at(0)) as w:
        w.db.send("SELECT 1", [])  # the prelude goes with the write's first statement
        with connection.cursor() as cursor:
            cursor.execute(f"PREPARE pmcp_probe AS {numbered}")
            cursor.execute(f"EXPLAIN EXECUTE pmcp_probe({', '.join(args)})")
            plan = "\n".join(row[0] for row in cursor.fetchall())
            cursor.execute("DEALLOCATE pmcp_probe")
    return plan


@pytest.mark.skipif(
    connections["default"].vendor != "postgresql", reason="generic plans: PostgreSQL only"
)
@pytest.mark.django_db(transaction=True)
def test_a_fenced_guard_looks_its_tasks_up_by_key_whatever_leases_are_held_when_planned():
    """With a few leases held when a connection makes its generic plan, a guard whose
    ``status IN ('leased', 'running')`` proves the lease-expiry index's condition took that
    index and read every unexpired lease at each call (bench/FINDINGS.md, h-fold); the fence
    (``guard.lease_fence``) writes the statuses so that the plan looks the tasks up by id."""
    from parallel_mcp.services.dialect import dialect_for
    from parallel_mcp.services.guard import lease_fence, sources

    orch = Orchestrator()
    run = orch.create_run(now=at(0))
    orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": "k"}] * 32, now=at(0))
    orch.claim_next_tasks(worker_id="w", limit=30, lease_ms=60_000, now=at(1))
    with connections["default"].cursor() as cursor:
        cursor.execute("ANALYZE pmcp_task")
    d = dialect_for("default")
    statuses = sources("completed")
    fence, _ = lease_fence(d, statuses=statuses, worker_id="w", now=at(2), principal=None)
    guard = "UPDATE pmcp_task SET updated_at = updated_at WHERE id = ANY(%s) AND "
    args = ("'{}'::uuid[]", "'w'", f"'{at(2).isoformat()}'::timestamptz")
    unfenced = _generic_plan(
        guard + f"{statuses} AND leased_by = %s AND lease_expires_at >= %s", *args
    )
    assert "pmcp_task_lease_expiry_idx" in unfenced, unfenced  # what the fence avoids
    plan = _generic_plan(guard + fence, *args)
    assert "pmcp_task_pkey" in plan and "lease_expiry_idx" not in plan, plan
    # Every fenced guard is written with the fence: the completion's and send_fenced's.
    from django.test.utils import CaptureQueriesContext

    a, b = orch.claim_next_tasks(worker_id="w2", limit=2, now=at(1))
    with CaptureQueriesContext(connections["default"]) as captured:
        orch.heartbeat_lease(task_id=a.task.id, lease_id=a.lease.id, worker_id="w2", now=at(2))
        orch.complete_task(task_id=a.task.id, lease_id=a.lease.id, worker_id="w2", now=at(3))
        orch.release_task(task_id=b.task.id, lease_id=b.lease.id, worker_id="w2", now=at(3))
    guards = [q["sql"] for q in captured.captured_queries if "UPDATE pmcp_task SET" in q["sql"]]
    fenced = [sql for sql in guards if "leased_by = 'w2'" in sql]
    assert len(fenced) == 3 and all(") IS TRUE AND leased_by" in sql for sql in fenced), guards


@pytest.mark.skipif(connections["default"].vendor != "sqlite", reason="SQLite's planner")
def test_a_batched_completion_looks_its_tasks_up_by_key_on_sqlite(orch, run):
    """SQLite finds a row value ``(id, lease_id) IN (VALUES …)`` by no one-column index: a
    batch's guard read the lease-expiry index (every unexpired lease) or scanned the tasks;
    ``Dialect.uuid_pairs`` adds ``id IN (…)``, which the primary key answers."""
    from django.test.utils import CaptureQueriesContext

    orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": "k"}] * 300, now=at(0))
    claims = orch.claim_next_tasks(worker_id="w", limit=100, lease_ms=60_000, now=at(1))
    connection = connections["default"]
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    with CaptureQueriesContext(connection) as captured:
        complete_tasks(
            using="default", worker_id="w", items=[item(c) for c in claims[:3]], now=at(2)
        )
    sent = [q["sql"] for q in captured.captured_queries]
    (guard,) = [sql for sql in sent if sql.startswith("UPDATE pmcp_task SET status = 'completed'")]
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN QUERY PLAN {guard}")
        plan = " / ".join(row[3] for row in cursor.fetchall())
    assert "SEARCH pmcp_task USING INDEX sqlite_autoindex_pmcp_task_1 (id=?)" in plan, plan
    assert Task.objects.filter(status="completed").count() == 3


def test_a_retried_cycle_replays_its_completions_and_its_claims(orch, run):
    for _ in range(3):
        orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    (claim,) = orch.claim_next_tasks(worker_id="w", limit=1, start=True, now=at(1))
    items = [item(claim, client_token="done-1")]
    results, claims = cycle(items, 2)
    again, replayed = cycle(items, 2, now=at(3))
    assert again == results == [None]
    assert [c.lease.id for c in replayed] == [c.lease.id for c in claims]
    assert Task.objects.filter(status="running").count() == 2
    assert Lease.objects.count() == 3
    assert Counter(event_types(orch, run.id))["task.completed"] == 1


def test_a_cycle_without_claims_only_completes_and_a_refused_item_holds_back_nothing(orch, run):
    for _ in range(3):
        orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    a, b = orch.claim_next_tasks(worker_id="w", limit=2, start=True, now=at(1))
    results, claims = cycle([item(a), {"task_id": b.task.id, "lease_id": a.lease.id}], 0)
    assert claims == []
    assert results[0] is None and Task.objects.get(pk=a.task.id).status == "completed"
    assert isinstance(results[1], LeaseConflictError)
    assert Task.objects.filter(status="queued").count() == 1  # nothing was claimed
    results, claims = cycle([item(b, output={"bad": object()})], 1, token="cycle-2")
    assert isinstance(results[0], ValidationError) and len(claims) == 1


@pytest.mark.parametrize("limit", [-1, 101, True, "2", None])
def test_a_cycle_refuses_a_bad_limit_before_writing(orch, run, limit):
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    (claim,) = orch.claim_next_tasks(worker_id="w", limit=1, now=at(1))
    with pytest.raises(ValidationError):
        cycle([item(claim)], limit)
    assert Task.objects.get().status == "leased"


def test_heartbeat_extends_the_lease_everywhere(orch, run):
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    claim = orch.claim_next_task(worker_id="w", start=True, lease_ms=1000, now=at(1))
    lease = orch.heartbeat_lease(**item(claim), worker_id="w", lease_ms=5000, now=at(1.5))
    assert lease.expires_at == at(6.5) and lease.heartbeat_at == at(1.5)
    assert Task.objects.get().lease_expires_at == at(6.5)
    assert Attempt.objects.get().lease_expires_at == at(6.5)
    with pytest.raises(LeaseExpiredError):
        orch.heartbeat_lease(**item(claim), worker_id="w", lease_ms=5000, now=at(7))
    with pytest.raises(LeaseConflictError):
        orch.heartbeat_lease(**item(claim), worker_id="intruder", lease_ms=5000, now=at(2))


# -- races ----------------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_racing_batch_claims_never_share_a_task():
    orch = Orchestrator()
    run = orch.create_run()
    orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": "k"} for _ in range(60)])
    claimed: list = []
    errors: list = []

    def contender(name: str) -> None:
        try:
            while batch := Orchestrator().claim_next_tasks(worker_id=name, limit=7):
                claimed.extend(c.task.id for c in batch)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    race(4, contender, timeout=60)
    assert not errors, errors
    assert len(claimed) == len(set(claimed)) == 60
    assert Lease.objects.count() == 60


def test_a_batch_records_its_events_in_claim_order(orch, run):
    low = orch.enqueue_task(run_id=run.id, kind="k", priority=1, now=at(0))
    high = orch.enqueue_task(run_id=run.id, kind="k", priority=9, now=at(0))
    mid = orch.enqueue_task(run_id=run.id, kind="k", priority=5, now=at(0))
    orch.claim_next_tasks(worker_id="w", limit=3, start=True, now=at(1))
    events = [
        (event.event_type, event.task_id)
        for event in orch.list_run_events(run_id=run.id)
        if event.event_type in ("task.claimed", "task.running")
    ]
    assert events == [
        (kind, task.id) for task in (high, mid, low) for kind in ("task.claimed", "task.running")
    ]

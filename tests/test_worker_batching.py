"""Batched claims, and completions written with the next claim, in the worker (worker/loop.py,
services/cycle.py)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from django.db import OperationalError, connections

from parallel_mcp import Completed, Orchestrator
from parallel_mcp.models import ClientTokenRecord, ContextSnapshot, Event, Lease, Task
from parallel_mcp.worker.environment import LocalEnvironment
from parallel_mcp.worker.loop import Worker
from parallel_mcp.worker.registry import HandlerRegistry
from tests.test_worker_units import run_in_thread

# -- the worker -----------------------------------------------------------------------------------


def count_completed_events(run_id) -> Counter:
    return Counter(
        Event.objects.filter(run_id=run_id, event_type="task.completed").values_list(
            "task_id", flat=True
        )
    )


def registry_with(handler) -> HandlerRegistry:
    registry = HandlerRegistry()
    registry.register("b.task", handler)
    return registry


@pytest.mark.django_db(transaction=True)
def test_a_worker_with_free_slots_claims_in_batches_and_completes_each_task_once():
    orch = Orchestrator()
    run = orch.create_run(namespace="batching")
    orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": "b.task", "input": n} for n in range(40)])
    worker = Worker(
        orchestrator=orch,
        registry=registry_with(lambda ctx: time.sleep(0.02) or {"n": ctx.input}),
        concurrency=4,
        burst=True,
        listen=False,
        worker_id="batcher",
    )
    assert run_in_thread(worker, timeout=60) == 0

    assert worker.stats.completed == worker.stats.claimed == 40
    tasks = Task.objects.filter(run_id=run.id)
    assert {(t.status, t.attempt_count) for t in tasks} == {("completed", 1)}
    assert all(t.output == {"n": t.input} for t in tasks)
    completed = count_completed_events(run.id)
    assert len(completed) == 40 and set(completed.values()) == {1}
    assert orch.get_run(run_id=run.id).status == "completed"


@pytest.mark.django_db(transaction=True)
def test_completions_with_metadata_and_next_context_are_group_committed_too(monkeypatch):
    """They once took a slower path; now every local completion is written by the claimer's
    cycle (complete_and_claim), with its metadata merged and its snapshot recorded."""
    orch = Orchestrator()
    run = orch.create_run(namespace="batching", context={"seen": 0})
    orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": "b.task", "input": n} for n in range(12)])

    submitted: list[dict] = []
    real_cycle = LocalEnvironment.complete_and_claim

    def cycle(self, **kwargs):
        submitted.extend(kwargs["items"])
        return real_cycle(self, **kwargs)

    monkeypatch.setattr(LocalEnvironment, "complete_and_claim", cycle)
    worker = Worker(
        orchestrator=orch,
        registry=registry_with(
            lambda ctx: Completed(
                output=ctx.input, metadata={"n": ctx.input}, next_context={"last": ctx.input}
            )
        ),
        concurrency=4,
        burst=True,
        listen=False,
    )
    assert run_in_thread(worker, timeout=60) == 0

    assert worker.stats.completed == 12
    assert sorted(item["metadata"]["n"] for item in submitted) == list(range(12))
    tasks = Task.objects.filter(run_id=run.id)
    assert {t.status for t in tasks} == {"completed"}
    assert all(t.metadata == {"n": t.input} for t in tasks)
    snapshots = ContextSnapshot.objects.filter(run_id=run.id, label="b.task.completed")
    assert sorted(s.payload["last"] for s in snapshots) == list(range(12))


def record_claims(orch: Orchestrator, monkeypatch) -> list[tuple[str, int, int]]:
    """Every claim call the worker makes, as (method, limit, claims returned); a cycle that
    also writes completions is ("complete_and_claim", limit, claims returned)."""
    calls: list[tuple[str, int, int]] = []
    real_one, real_many = orch.claim_next_task, orch.claim_next_tasks
    real_cycle = LocalEnvironment.complete_and_claim

    def cycle(self, **kwargs):
        results, claims = real_cycle(self, **kwargs)
        calls.append(("complete_and_claim", kwargs["limit"], len(claims)))
        return results, claims

    def one(**kwargs):
        claim = real_one(**kwargs)
        calls.append(("claim_next_task", 1, int(claim is not None)))
        return claim

    def many(**kwargs):
        claims = real_many(**kwargs)
        calls.append(("claim_next_tasks", kwargs["limit"], len(claims)))
        return claims

    monkeypatch.setattr(orch, "claim_next_task", one)
    monkeypatch.setattr(orch, "claim_next_tasks", many)
    monkeypatch.setattr(LocalEnvironment, "complete_and_claim", cycle)
    return calls


def run_beside(worker: Worker, conductor) -> int:
    """Run the worker (in a thread) while ``conductor()`` runs in another; re-raise what the
    conductor raised."""
    raised: list[BaseException] = []

    def conduct() -> None:
        try:
            conductor()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            raised.append(exc)
            worker.request_stop()
            worker.request_stop()

    thread = threading.Thread(target=conduct)
    thread.start()
    code = run_in_thread(worker, timeout=60)
    thread.join(30)
    if raised:
        raise raised[0]
    return code


@pytest.mark.django_db(transaction=True)
def test_one_claim_fills_every_free_slot_and_none_is_made_while_all_are_busy(monkeypatch):
    orch = Orchestrator()
    run = orch.create_run(namespace="batching")
    orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": "b.task"} for _ in range(6)])
    calls = record_claims(orch, monkeypatch)
    started = threading.Semaphore(0)
    release = threading.Event()

    def handler(ctx):
        started.release()
        release.wait(20)

    worker = Worker(
        orchestrator=orch, registry=registry_with(handler), concurrency=4, burst=True, listen=False
    )

    def conductor() -> None:
        for _ in range(4):
            assert started.acquire(timeout=20)
        # Work is waiting, but every slot is busy: the claimer must not claim it.
        time.sleep(0.5)
        assert calls == [("claim_next_tasks", 4, 4)]
        assert Task.objects.filter(run_id=run.id, status="queued").count() == 2
        release.set()

    assert run_beside(worker, conductor) == 0
    assert worker.stats.completed == worker.stats.claimed == 6
    assert set(Task.objects.filter(run_id=run.id).values_list("status", flat=True)) == {"completed"}


@pytest.mark.django_db(transaction=True)
def test_a_slot_freed_while_the_others_run_gets_the_next_task_at_once(monkeypatch):
    """Three slots, one batch of three claims; the short task's slot takes the next task
    while the two long ones still run (no waiting for the whole batch), in the write that
    completes the short one."""
    orch = Orchestrator()
    run = orch.create_run(namespace="batching")
    batch = [{"kind": "b.task", "input": what, "priority": 2} for what in ("long", "long", "short")]
    orch.enqueue_tasks(run_id=run.id, tasks=[*batch, {"kind": "b.task", "input": "next"}])
    calls = record_claims(orch, monkeypatch)
    release = threading.Event()
    seen: dict[str, object] = {}

    def handler(ctx):
        if ctx.input == "long":
            release.wait(20)
        elif ctx.input == "next":
            seen["calls"] = list(calls)
            others = Task.objects.filter(run_id=run.id, status="running").exclude(pk=ctx.task.id)
            seen["long_running"] = others.count()
            release.set()

    worker = Worker(
        orchestrator=orch, registry=registry_with(handler), concurrency=3, burst=True, listen=False
    )
    assert run_in_thread(worker, timeout=60) == 0

    assert seen["calls"] == [("claim_next_tasks", 3, 3), ("complete_and_claim", 1, 1)]
    assert seen["long_running"] == 2
    assert worker.stats.completed == 4


@pytest.mark.django_db(transaction=True)
def test_a_claim_never_asks_for_more_than_claim_batch(monkeypatch):
    orch = Orchestrator()
    run = orch.create_run(namespace="batching")
    orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": "b.task"} for _ in range(4)])
    calls = record_claims(orch, monkeypatch)
    together = threading.Barrier(4)
    worker = Worker(
        orchestrator=orch,
        registry=registry_with(lambda ctx: together.wait(20)),  # all four run at once
        concurrency=4,
        claim_batch=2,
        burst=True,
        listen=False,
    )
    assert run_in_thread(worker, timeout=60) == 0
    assert calls[:2] == [("claim_next_tasks", 2, 2)] * 2
    assert worker.stats.completed == 4


@pytest.mark.django_db(transaction=True)
def test_completions_handed_in_during_a_write_share_the_next_one(monkeypatch):
    """The first task's completion is being written when the two others finish: both go
    into the claimer's next write, with its claims, in one transaction."""
    orch = Orchestrator()
    run = orch.create_run(namespace="batching")
    orch.enqueue_tasks(
        run_id=run.id, tasks=[{"kind": "b.task", "input": n, "priority": 3 - n} for n in range(3)]
    )
    orch.enqueue_task(run_id=run.id, kind="b.task", input="after")
    release = threading.Event()

    def handler(ctx):
        if ctx.input in (1, 2):
            release.wait(20)  # they finish while the first completion is written
        return {"n": ctx.input}

    worker = Worker(
        orchestrator=orch, registry=registry_with(handler), concurrency=3, burst=True, listen=False
    )
    real = LocalEnvironment.complete_and_claim
    written: list[tuple[list, int, int]] = []

    def cycle(self, **kwargs):
        if not written:  # the first task's completion: let the others finish meanwhile
            release.set()
            deadline = time.monotonic() + 10
            while len(worker._finished) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
        results, claims = real(self, **kwargs)
        inputs = {Task.objects.get(pk=item["task_id"]).input for item in kwargs["items"]}
        written.append((inputs, kwargs["limit"], len(claims)))
        return results, claims

    monkeypatch.setattr(LocalEnvironment, "complete_and_claim", cycle)
    assert run_in_thread(worker, timeout=60) == 0

    # The first write completed task 0 and claimed the fourth task for its slot; the next
    # completed 1 and 2 together (with the fourth, when it had finished by then).
    assert written[0] == ({0}, 1, 1)
    assert {1, 2} <= written[1][0] <= {1, 2, "after"}
    assert worker.stats.completed == worker.stats.claimed == 4
    assert set(count_completed_events(run.id).values()) == {1}
    assert orch.get_run(run_id=run.id).status == "completed"


@pytest.mark.django_db(transaction=True)
def test_a_dropped_connection_during_a_cycle_applies_each_result_and_claim_once(monkeypatch):
    """The write of completions and claims commits, then its reply is lost: the retry with
    the same tokens replays the completions and the claims instead of applying them twice."""
    orch = Orchestrator()
    run = orch.create_run(namespace="batching")
    orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": "b.task"} for _ in range(6)])

    worker = Worker(
        orchestrator=orch,
        registry=registry_with(lambda ctx: {"ok": True}),
        concurrency=3,
        burst=True,
        listen=False,
        worker_id="flaky",
    )
    real = LocalEnvironment.complete_and_claim
    lost: list[tuple[int, int]] = []

    def flaky(self, **kwargs):
        results, claims = real(self, **kwargs)
        if not lost and claims:  # committed, then the reply is lost
            lost.append((len(kwargs["items"]), len(claims)))
            connections["default"].close()
            raise OperationalError("server closed the connection unexpectedly")
        return results, claims

    monkeypatch.setattr(LocalEnvironment, "complete_and_claim", flaky)
    assert run_in_thread(worker, timeout=60) == 0

    assert lost and lost[0][0] >= 1 and lost[0][1] >= 1, lost
    assert worker.stats.completed == worker.stats.claimed == 6
    tasks = Task.objects.filter(run_id=run.id)
    assert {(t.status, t.attempt_count) for t in tasks} == {("completed", 1)}
    assert Lease.objects.filter(run_id=run.id).count() == 6
    assert ClientTokenRecord.objects.filter(run_id=run.id).count() == 6
    completed = count_completed_events(run.id)
    assert len(completed) == 6 and set(completed.values()) == {1}


@pytest.mark.django_db(transaction=True)
def test_claims_no_slot_started_go_back_to_the_queue_on_stop(monkeypatch):
    """The stop comes between the claim and the slots: the claims are released, their
    handlers never run, and the attempts are given back."""
    orch = Orchestrator()
    run = orch.create_run(namespace="batching")
    orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": "b.task"} for _ in range(3)])
    ran: list[object] = []
    worker = Worker(
        orchestrator=orch,
        registry=registry_with(lambda ctx: ran.append(ctx.task.id)),
        concurrency=3,
        listen=False,
    )
    real_claim = orch.claim_next_tasks

    def claim_then_stop(**kwargs):
        claims = real_claim(**kwargs)
        worker.request_stop()
        return claims

    monkeypatch.setattr(orch, "claim_next_tasks", claim_then_stop)
    assert run_in_thread(worker) == 0

    assert ran == []
    tasks = Task.objects.filter(run_id=run.id)
    assert {(t.status, t.attempt_count, t.lease_id) for t in tasks} == {("queued", 0, None)}
    assert (worker.stats.claimed, worker.stats.released) == (3, 3)
    assert {lease.status for lease in Lease.objects.filter(run_id=run.id)} == {"released"}
    released = Event.objects.filter(run_id=run.id, event_type="task.released")
    assert [event.payload["reason"] for event in released] == [
        "worker stopped before starting it"
    ] * 3

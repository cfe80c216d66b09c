"""Batched claims and group-committed completions in the worker (worker/batching.py)."""

from __future__ import annotations

import threading
import time
from collections import Counter

import pytest
from django.db import OperationalError, connections

from parallel_mcp import Completed, Orchestrator
from parallel_mcp.models import ClientTokenRecord, ContextSnapshot, Event, Lease, Task
from parallel_mcp.worker.batching import CompletionBatcher
from parallel_mcp.worker.environment import LocalEnvironment
from parallel_mcp.worker.loop import Worker
from parallel_mcp.worker.registry import HandlerRegistry
from tests.test_worker_units import run_in_thread

# -- the batcher alone ----------------------------------------------------------------------------


def test_completions_that_arrive_during_a_write_share_the_next_one():
    flushed: list[list[int]] = []
    first_write_started = threading.Event()
    release_first_write = threading.Event()

    def flush(items):
        flushed.append([entry["n"] for entry in items])
        if len(flushed) == 1:
            first_write_started.set()
            release_first_write.wait(5)
        return [entry["n"] * 10 for entry in items]

    batcher = CompletionBatcher(flush)
    results: dict[int, int] = {}

    def submit(n: int) -> None:
        results[n] = batcher.submit({"n": n})

    first = threading.Thread(target=submit, args=(0,))
    first.start()
    assert first_write_started.wait(5)
    others = [threading.Thread(target=submit, args=(n,)) for n in range(1, 6)]
    for thread in others:
        thread.start()
    time.sleep(0.2)  # all five are queued behind the first write
    release_first_write.set()
    for thread in [first, *others]:
        thread.join(5)
    assert flushed[0] == [0]
    assert sorted(flushed[1]) == [1, 2, 3, 4, 5] and len(flushed) == 2
    assert results == {n: n * 10 for n in range(6)}


def test_a_failed_write_is_raised_to_every_submitter_and_item_errors_only_to_theirs():
    def flush(items):
        if any(entry.get("explode") for entry in items):
            raise OperationalError("database went away")
        return [ValueError("refused") if entry.get("refuse") else "ok" for entry in items]

    batcher = CompletionBatcher(flush)
    with pytest.raises(OperationalError):
        batcher.submit({"explode": True})
    assert isinstance(batcher.submit({"refuse": True}), ValueError)
    assert batcher.submit({}) == "ok"


def test_batches_are_capped():
    sizes: list[int] = []
    gate = threading.Event()

    def flush(items):
        sizes.append(len(items))
        gate.wait(5)
        return [None] * len(items)

    batcher = CompletionBatcher(flush, max_batch=3)
    threads = [threading.Thread(target=batcher.submit, args=({},)) for _ in range(8)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    gate.set()
    for thread in threads:
        thread.join(5)
    assert sum(sizes) == 8 and max(sizes) <= 3


# -- the worker -----------------------------------------------------------------------------------


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
    completed = Counter(
        Event.objects.filter(run_id=run.id, event_type="task.completed").values_list(
            "task_id", flat=True
        )
    )
    assert len(completed) == 40 and set(completed.values()) == {1}
    assert orch.get_run(run_id=run.id).status == "completed"


@pytest.mark.django_db(transaction=True)
def test_completions_with_metadata_and_next_context_are_group_committed_too(monkeypatch):
    """They once took a slower path; now every local completion goes to the group
    committer, with its metadata merged and its snapshot recorded."""
    orch = Orchestrator()
    run = orch.create_run(namespace="batching", context={"seen": 0})
    orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": "b.task", "input": n} for n in range(12)])

    submitted: list[dict] = []
    real_submit = CompletionBatcher.submit

    def submit(self, item):
        submitted.append(item)
        return real_submit(self, item)

    monkeypatch.setattr(CompletionBatcher, "submit", submit)
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
    """Every claim call the worker makes, as (method, limit, claims returned)."""
    calls: list[tuple[str, int, int]] = []
    real_one, real_many = orch.claim_next_task, orch.claim_next_tasks

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
    while the two long ones still run (no waiting for the whole batch)."""
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

    assert seen["calls"] == [("claim_next_tasks", 3, 3), ("claim_next_task", 1, 1)]
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
def test_a_dropped_connection_during_a_batched_completion_applies_each_result_once(monkeypatch):
    orch = Orchestrator()
    run = orch.create_run(namespace="batching")
    orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": "b.task"} for _ in range(3)])
    together = threading.Barrier(3)

    def handler(ctx):
        together.wait(10)  # the three finish at once
        return {"ok": True}

    real_single = Orchestrator.complete_task
    real_batch = LocalEnvironment.complete_tasks
    batch_calls: list[int] = []

    def slow_single(self, **kwargs):
        time.sleep(0.3)  # the others queue up behind this write
        return real_single(self, **kwargs)

    def flaky_batch(self, worker_id, items):
        batch_calls.append(len(items))
        if len(batch_calls) == 1:
            real_batch(self, worker_id, items)  # committed, then the reply is lost
            connections["default"].close()
            raise OperationalError("server closed the connection unexpectedly")
        return real_batch(self, worker_id, items)

    monkeypatch.setattr(Orchestrator, "complete_task", slow_single)
    monkeypatch.setattr(LocalEnvironment, "complete_tasks", flaky_batch)
    worker = Worker(
        orchestrator=orch,
        registry=registry_with(handler),
        concurrency=3,
        burst=True,
        listen=False,
        worker_id="flaky",
    )
    assert run_in_thread(worker, timeout=60) == 0

    assert batch_calls and batch_calls[0] >= 2, batch_calls
    assert worker.stats.completed == 3
    assert ClientTokenRecord.objects.filter(run_id=run.id).count() == 3
    completed = Counter(
        Event.objects.filter(run_id=run.id, event_type="task.completed").values_list(
            "task_id", flat=True
        )
    )
    assert len(completed) == 3 and set(completed.values()) == {1}


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

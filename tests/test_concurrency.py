"""Real concurrency: OS processes and threads against one database (SQLite file or PG)."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from django.db import connection, connections

from parallel_mcp import Orchestrator
from parallel_mcp.models import Attempt, Event, Task
from tests.subprocesses import start, wait_all
from tests.thread_support import race

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_worker_processes_complete_every_task_exactly_once(tmp_path):
    orch = Orchestrator()
    run = orch.create_run(namespace="race")
    roots = [orch.enqueue_task(run_id=run.id, kind="root") for _ in range(20)]
    for index in range(180):
        orch.enqueue_task(run_id=run.id, kind="leaf", depends_on=[roots[index % 20].id])

    # All four start claiming together (a barrier), so each gets a share of the work.
    workers = [start("drain", f"proc-{n}", str(run.id), str(tmp_path), "4") for n in range(4)]
    done = [int(out.strip()) for out in wait_all(workers)]

    assert sum(done) == 200
    assert orch.get_run(run_id=run.id).status == "completed"
    completed_events = Counter(
        Event.objects.filter(run_id=run.id, event_type="task.completed").values_list(
            "task_id", flat=True
        )
    )
    assert len(completed_events) == 200
    assert set(completed_events.values()) == {1}
    assert set(Task.objects.filter(run_id=run.id).values_list("attempt_count", flat=True)) == {1}
    assert Attempt.objects.filter(run_id=run.id).count() == 200
    assert not Task.objects.filter(run_id=run.id, lease_id__isnull=False).exists()
    assert sum(1 for n in done if n > 0) >= 2, f"work was not shared: {done}"


def test_threads_racing_for_one_task_get_it_once():
    orch = Orchestrator()
    run = orch.create_run()
    orch.enqueue_task(run_id=run.id, kind="only")
    results: list = []

    def contender(name: str) -> None:
        results.append(Orchestrator().claim_next_task(worker_id=name))

    race(6, contender)
    winners = [claim for claim in results if claim is not None]
    assert len(results) == 6
    assert len(winners) == 1
    assert Attempt.objects.count() == 1


def test_event_feed_never_skips_under_concurrent_writer_processes():
    orch = Orchestrator()
    run = orch.create_run()
    writers = [start("snapshots", str(run.id), "60") for _ in range(4)]
    seen: list[int] = []
    cursor = None
    while any(process.poll() is None for process in writers):
        page = orch.list_events_since(after_id=cursor, limit=50)
        seen.extend(event.id for event in page.events)
        cursor = page.next_cursor
    wait_all(writers)
    while True:
        page = orch.list_events_since(after_id=cursor, limit=50)
        if not page.events:
            break
        seen.extend(event.id for event in page.events)
        cursor = page.next_cursor
    all_ids = list(Event.objects.order_by("id").values_list("id", flat=True))
    assert seen == all_ids
    assert len(all_ids) >= 1 + 4 * 60 * 1  # run.created + one event per snapshot


@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_event_cursor_waits_for_an_earlier_id_still_in_flight():
    """Bug 7 of the original, made deterministic: a transaction holds event id N open while
    another commits N+1. A naive reader sees N+1 alone and would move its cursor past N;
    list_events_since waits for N's transaction and returns both, in order."""
    orch = Orchestrator()
    run = orch.create_run()
    other_run = orch.create_run()  # the fast writer must not wait on the slow one's run lock
    start_cursor = orch.list_events_since().next_cursor
    holding = threading.Event()
    release = threading.Event()
    page_holder: list = []

    def slow_writer() -> None:
        try:
            with Orchestrator().transaction():
                Orchestrator().append_context_snapshot(run_id=run.id, payload={"slow": True})
                holding.set()
                release.wait(10)
        finally:
            connections.close_all()

    def reader() -> None:
        try:
            page_holder.append(Orchestrator().list_events_since(after_id=start_cursor))
        finally:
            connections.close_all()

    writer_thread = threading.Thread(target=slow_writer)
    writer_thread.start()
    assert holding.wait(10)
    orch.append_context_snapshot(run_id=other_run.id, payload={"fast": True})

    naive = list(Event.objects.filter(id__gt=start_cursor).values_list("event_type", "payload"))
    assert naive == [("context.snapshot.created", naive[0][1])]  # only the later id is visible

    reader_thread = threading.Thread(target=reader)
    reader_thread.start()
    reader_thread.join(0.5)
    assert reader_thread.is_alive(), "the reader must wait for the in-flight writer"
    release.set()
    writer_thread.join(10)
    reader_thread.join(10)
    events = page_holder[0].events
    ids = [event.id for event in events]
    assert ids == sorted(ids)
    assert len(events) == 2
    assert ids == list(Event.objects.filter(id__gt=start_cursor).values_list("id", flat=True))
    assert connection.vendor == "postgresql"


def test_threads_creating_one_run_id_get_one_run_and_duplicate_id_errors():
    """The insert itself decides (``ON CONFLICT (id) DO NOTHING``): on PostgreSQL a twin that
    read no such run a moment before still gets DuplicateIdError, never an IntegrityError
    (which the HTTP API could only answer with a 409 "retry it" that no retry fixes)."""
    from parallel_mcp.exceptions import DuplicateIdError
    from parallel_mcp.ids import new_id

    run_id, snapshot_id = new_id(), new_id()
    outcomes: list = []

    def contender(name: str) -> None:
        orch = Orchestrator()
        try:
            run = orch.create_run(id=run_id, namespace=name)
        except Exception as exc:  # noqa: BLE001 - the outcome is what the test checks
            outcomes.append(type(exc))
        else:
            outcomes.append(run.namespace)
        other = orch.create_run(namespace=name)  # each its own run, one snapshot id
        try:
            orch.append_context_snapshot(run_id=other.id, payload={}, id=snapshot_id)
        except Exception as exc:  # noqa: BLE001
            outcomes.append(type(exc))
        else:
            outcomes.append("snapshot")

    race(8, contender)
    assert Counter(o for o in outcomes if isinstance(o, type)) == {DuplicateIdError: 14}
    assert outcomes.count("snapshot") == 1
    assert Orchestrator().get_run(run_id=run_id).namespace in outcomes

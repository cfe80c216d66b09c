"""Idle workers wake promptly when work appears: NOTIFY on PostgreSQL, PRAGMA data_version on
SQLite. The worker's idle backoff is set to 20 s here, so a pickup within 5 s can only come
from the wake-up path, not from polling."""

from __future__ import annotations

import threading
import time

import pytest

from parallel_mcp import Orchestrator
from parallel_mcp.worker.loop import Worker


@pytest.mark.django_db(transaction=True)
def test_idle_worker_wakes_when_a_task_is_enqueued():
    orch = Orchestrator()
    run = orch.create_run()
    worker = Worker(orchestrator=orch, lease_ms=3000, poll_min_ms=20_000, poll_max_ms=30_000)
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        time.sleep(0.5)  # the worker found nothing and is now idle for ~20 s
        started = time.monotonic()
        task = orch.enqueue_task(run_id=run.id, kind="test.echo")
        while time.monotonic() - started < 15:
            if orch.get_task(task_id=task.id).status == "completed":
                break
            time.sleep(0.02)
        assert orch.get_task(task_id=task.id).status == "completed"
        assert time.monotonic() - started < 5
    finally:
        worker.request_stop()
        thread.join(15)
    assert not thread.is_alive()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("listen", [True, False], ids=["watcher", "claimer-checks"])
def test_idle_slots_of_one_worker_wake_together(listen):
    """With several idle slots, one watcher (or, without listening, the claimer itself) notices
    the commit; every task enqueued at once is started within the wake-up delay."""
    if not listen and connection_vendor() != "sqlite":
        pytest.skip("without LISTEN, PostgreSQL workers find work by polling only")
    orch = Orchestrator()
    run = orch.create_run()
    worker = Worker(
        orchestrator=orch,
        concurrency=4,
        lease_ms=3000,
        poll_min_ms=20_000,
        poll_max_ms=30_000,
        listen=listen,
    )
    thread = threading.Thread(target=worker.run)
    thread.start()
    try:
        time.sleep(0.5)
        watchers = [t for t in threading.enumerate() if t.name == "pmcp-watch"]
        if connection_vendor() == "sqlite":
            assert len(watchers) == (1 if listen else 0)
        started = time.monotonic()
        tasks = orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": "test.echo"} for _ in range(4)])
        while time.monotonic() - started < 15:
            if all(orch.get_task(task_id=t.id).status == "completed" for t in tasks):
                break
            time.sleep(0.02)
        assert all(orch.get_task(task_id=t.id).status == "completed" for t in tasks)
        assert time.monotonic() - started < 5
    finally:
        worker.request_stop()
        thread.join(15)
    assert not thread.is_alive()
    for watcher in watchers:  # told to stop with the worker; gone within a check interval
        watcher.join(2)
        assert not watcher.is_alive()


def connection_vendor() -> str:
    from django.db import connection

    return connection.vendor

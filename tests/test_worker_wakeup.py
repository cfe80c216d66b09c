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

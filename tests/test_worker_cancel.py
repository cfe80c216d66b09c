"""Cancellation from another process reaches a running handler (bug 6 of the original): the
worker's heartbeat finds its lease refused and sets ``ctx.cancelled``."""

from __future__ import annotations

import signal
import time

import pytest

from parallel_mcp import Orchestrator
from parallel_mcp.models import Attempt, Lease, Task
from tests.workers import (
    event_counts,
    kill_leftover_processes,  # noqa: F401 - autouse fixture
    marker_lines,
    start_worker,
    wait_until,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LEASE_MS = 1500
HEARTBEAT_S = LEASE_MS / 3 / 1000
MARGIN_S = 0.75  # the database round trips, thread wake-ups


@pytest.mark.parametrize("cancel", ["cancel_run", "cancel_task"])
def test_cancelling_from_this_process_stops_the_handler_in_the_worker(tmp_path, cancel):
    orch = Orchestrator()
    marker = tmp_path / "marker"
    run = orch.create_run(namespace="cancel")
    task = orch.enqueue_task(
        run_id=run.id, kind="test.sleep", input={"seconds": 60, "marker": str(marker)}
    )
    worker = start_worker("--lease-ms", str(LEASE_MS), "--worker-id", "far-away")
    wait_until(lambda: marker_lines(marker, "started"), alive=[worker])
    lease_id = Task.objects.get(pk=task.id).lease_id

    started = time.time()
    if cancel == "cancel_run":
        orch.cancel_run(run_id=run.id, reason="operator said stop")
    else:
        orch.cancel_task(task_id=task.id, reason="operator said stop")
    (line,) = wait_until(
        lambda: [line for line in marker_lines(marker) if line.startswith("cancelled:")],
        timeout=10,
        interval=0.01,
        alive=[worker],
    )
    # The handler wrote the line as soon as it was told: the file's mtime is when.
    elapsed = marker.stat().st_mtime - started
    assert elapsed < 2 * HEARTBEAT_S + MARGIN_S, elapsed
    assert line.startswith("cancelled:lease lost")

    task = Task.objects.get(pk=task.id)
    assert task.status == "cancelled"
    assert event_counts(run.id, "task.cancelled") == {task.id: 1}
    assert not event_counts(run.id, "task.completed")
    assert not event_counts(run.id, "task.failed")
    assert Attempt.objects.get(pk=lease_id).status == "cancelled"
    assert Lease.objects.get(pk=lease_id).status == "cancelled"
    assert not marker_lines(marker, "finished")

    # The worker is still there, idle, and stops cleanly.
    assert worker.poll() is None
    worker.send_signal(signal.SIGTERM)
    assert worker.finish(timeout=10) == 0, worker.describe()
    assert Task.objects.get(pk=task.id).status == "cancelled"

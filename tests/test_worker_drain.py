"""Stopping a worker process: SIGTERM/SIGINT drain (wait for running tasks up to
``--drain-timeout-ms``, release the rest, exit 0); a second signal exits at once."""

from __future__ import annotations

import signal
import time

import pytest
from django.utils import timezone

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

# Time allowed beyond the drain timeout for releasing the task and the process exit.
EXIT_MARGIN = 4.0


def _start_stubborn(tmp_path, seconds: float, *worker_args: str):
    orch = Orchestrator()
    marker = tmp_path / "marker"
    run = orch.create_run(namespace="drain")
    task = orch.enqueue_task(
        run_id=run.id,
        kind="test.stubborn",
        priority=1,
        input={"seconds": seconds, "marker": str(marker)},
    )
    worker = start_worker("--worker-id", "drainer", *worker_args)
    wait_until(lambda: marker_lines(marker, "started"), alive=[worker])
    return orch, run, task, marker, worker


def test_sigterm_lets_a_task_shorter_than_the_drain_timeout_finish(tmp_path):
    orch, run, task, marker, worker = _start_stubborn(tmp_path, 1.5, "--drain-timeout-ms", "20000")
    signalled_at = timezone.now()
    worker.send_signal(signal.SIGTERM)
    wait_until(lambda: "draining" in worker.err, alive=[worker])
    # Free slots, but a draining worker claims nothing more.
    later = orch.enqueue_task(run_id=run.id, kind="test.echo")

    assert worker.finish() == 0, worker.describe()
    task = Task.objects.get(pk=task.id)
    assert task.status == "completed"
    assert task.output == "done"
    assert task.completed_at > signalled_at  # it was still running when the signal came
    assert len(marker_lines(marker, "finished")) == 1
    assert event_counts(run.id, "task.completed") == {task.id: 1}
    assert not event_counts(run.id, "task.released")
    later = Task.objects.get(pk=later.id)
    assert (later.status, later.attempt_count) == ("queued", 0)
    assert "draining" in worker.err


def test_sigterm_releases_a_stubborn_task_at_the_drain_timeout(tmp_path):
    drain_ms = 1000
    orch, run, task, marker, worker = _start_stubborn(
        tmp_path, 60, "--drain-timeout-ms", str(drain_ms)
    )
    assert Task.objects.get(pk=task.id).attempt_count == 1
    started = time.monotonic()
    worker.send_signal(signal.SIGTERM)

    assert worker.finish() == 0, worker.describe()
    elapsed = time.monotonic() - started
    assert drain_ms / 1000 * 0.9 <= elapsed < drain_ms / 1000 + EXIT_MARGIN, elapsed

    task = Task.objects.get(pk=task.id)
    assert task.status == "queued"
    assert task.attempt_count == 0  # a release gives the attempt back
    assert (task.lease_id, task.leased_by, task.lease_expires_at) == (None, None, None)
    released = orch.list_run_events(run_id=run.id)
    released = [event for event in released if event.event_type == "task.released"]
    assert len(released) == 1
    assert released[0].task_id == task.id
    assert released[0].payload["worker_id"] == "drainer"
    assert released[0].payload["reason"]
    assert list(Attempt.objects.filter(task_id=task.id).values_list("status", flat=True)) == [
        "released"
    ]
    assert list(Lease.objects.filter(task_id=task.id).values_list("status", flat=True)) == [
        "released"
    ]
    assert not marker_lines(marker, "finished")
    # It can be claimed again at once.
    assert orch.claim_next_task(worker_id="next").task.id == task.id


def test_a_second_sigterm_exits_at_once_and_leaves_the_lease_to_expire(tmp_path):
    orch, run, task, _, worker = _start_stubborn(
        tmp_path, 60, "--drain-timeout-ms", "30000", "--lease-ms", "1500"
    )
    worker.send_signal(signal.SIGTERM)
    # A second signal that arrives before the first is handled would be merged with it.
    wait_until(lambda: "draining" in worker.err, alive=[worker])
    started = time.monotonic()
    worker.send_signal(signal.SIGTERM)

    code = worker.finish(timeout=10)
    assert time.monotonic() - started < 3.0
    assert code != 0, worker.describe()

    held = Task.objects.get(pk=task.id)
    assert held.status == "running"
    assert held.leased_by == "drainer"
    assert held.lease_id is not None
    assert Lease.objects.get(pk=held.lease_id).status == "active"
    assert not event_counts(run.id, "task.released")

    wait_until(lambda: Task.objects.get(pk=task.id).lease_expires_at < timezone.now(), timeout=10)
    assert orch.expire_leases().expired_task_ids == [task.id]
    expired = Task.objects.get(pk=task.id)
    assert (expired.status, expired.attempt_count, expired.lease_id) == ("queued", 1, None)
    assert Attempt.objects.get(pk=held.lease_id).status == "expired"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_an_idle_worker_stops_on_a_signal_with_exit_0(signum):
    worker = start_worker("--drain-timeout-ms", "30000")
    wait_until(lambda: " started: " in worker.err, alive=[worker])
    started = time.monotonic()
    worker.send_signal(signum)
    assert worker.finish(timeout=10) == 0, worker.describe()
    assert time.monotonic() - started < 3.0
    assert " stopped: " in worker.err

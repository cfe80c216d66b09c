"""The worker heartbeats with its own ``--lease-ms`` (bug 5 of the original extended leases by
the orchestrator's default lease instead)."""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from itertools import pairwise

import pytest
from django.utils import timezone

from parallel_mcp import Orchestrator
from parallel_mcp.models import Event, Lease, Task
from tests.workers import (
    kill_leftover_processes,  # noqa: F401 - autouse fixture
    start_worker,
    wait_until,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LEASE_MS = 3000  # the settings' default lease is 30 000 ms: a wrong heartbeat shows at once


def test_heartbeats_extend_by_the_workers_lease_and_the_lease_never_runs_out():
    orch = Orchestrator()
    run = orch.create_run(namespace="heartbeat")
    task = orch.enqueue_task(run_id=run.id, kind="test.sleep", input={"seconds": 5})
    worker = start_worker("--burst", "--lease-ms", str(LEASE_MS), "--worker-id", "beater")

    # While it runs, the lease is always in the future and an expiry pass finds nothing.
    wait_until(lambda: Task.objects.get(pk=task.id).status == "running", alive=[worker])
    samples = 0
    while worker.poll() is None:
        before = timezone.now()
        row = Task.objects.get(pk=task.id)
        if row.status not in ("leased", "running"):
            break
        assert row.lease_expires_at > before
        assert row.lease_expires_at <= before + timedelta(milliseconds=LEASE_MS + 500)
        assert orch.expire_leases().count == 0
        samples += 1
        time.sleep(0.2)
    assert worker.finish() == 0, worker.describe()
    assert samples >= 10

    task = Task.objects.get(pk=task.id)
    assert (task.status, task.output, task.attempt_count) == ("completed", {"slept": True}, 1)
    assert not Event.objects.filter(run_id=run.id, event_type="task.lease_expired").exists()

    beats = list(
        Event.objects.filter(task_id=task.id, event_type="task.lease_heartbeat").order_by("id")
    )
    assert len(beats) >= 3  # every LEASE_MS / 3 over five seconds
    for beat in beats:
        extended_to = datetime.fromisoformat(beat.payload["lease_expires_at"])
        assert (extended_to - beat.created_at).total_seconds() == pytest.approx(3.0, abs=0.01)
        assert beat.payload["worker_id"] == "beater"
    gaps = [(b.created_at - a.created_at).total_seconds() for a, b in pairwise(beats)]
    assert all(gap < LEASE_MS / 1000 for gap in gaps), gaps  # always before the lease ran out
    lease = Lease.objects.get(task_id=task.id)
    assert lease.heartbeat_at == beats[-1].created_at
    assert (lease.expires_at - lease.heartbeat_at).total_seconds() == pytest.approx(3.0, abs=0.01)

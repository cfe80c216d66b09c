"""A worker killed with SIGKILL mid-task: its leases run out, the expiry requeues the tasks and
another worker completes each exactly once (real processes, SQLite file or PostgreSQL)."""

from __future__ import annotations

import signal

import pytest
from django.utils import timezone

from parallel_mcp import Orchestrator
from parallel_mcp.models import Attempt, Lease, Task
from tests.workers import (
    event_counts,
    kill_leftover_processes,  # noqa: F401 - autouse fixture
    marker_lines,
    run_command,
    start_worker,
    wait_until,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LEASE_MS = 1500


def _leases_ran_out(task_ids) -> bool:
    return not Task.objects.filter(pk__in=task_ids, lease_expires_at__gte=timezone.now()).exists()


@pytest.mark.parametrize("expire_with", ["command", "orchestrator"])
def test_killed_worker_tasks_are_expired_then_completed_once_elsewhere(tmp_path, expire_with):
    orch = Orchestrator()
    marker = tmp_path / "marker"
    run = orch.create_run(namespace="crash")
    task_input = {"seconds": 60, "slow_worker": "doomed", "marker": str(marker)}
    tasks = [
        orch.enqueue_task(run_id=run.id, kind="test.slow_on_worker", input=task_input)
        for _ in range(3)
    ]
    all_ids = {task.id for task in tasks}

    doomed = start_worker(
        "--lease-ms", str(LEASE_MS), "--concurrency", "2", "--worker-id", "doomed"
    )
    wait_until(lambda: len(marker_lines(marker, "started")) == 2, alive=[doomed])
    in_flight = set(
        Task.objects.filter(run_id=run.id, status="running").values_list("id", flat=True)
    )
    assert len(in_flight) == 2
    (never_claimed,) = all_ids - in_flight

    doomed.send_signal(signal.SIGKILL)
    assert doomed.wait(10) == -signal.SIGKILL
    # Nobody gives the tasks back: they stay running under the dead worker's leases.
    assert (
        set(
            Task.objects.filter(pk__in=in_flight, status="running", leased_by="doomed").values_list(
                "id", flat=True
            )
        )
        == in_flight
    )
    assert Task.objects.get(pk=never_claimed).status == "queued"

    if expire_with == "command":
        wait_until(lambda: _leases_ran_out(in_flight), timeout=10)
        code, out, err = run_command("pmcp_expire_leases", "--once")
        assert code == 0, err
        lines = out.splitlines()
        assert lines[0] == "expired 2 lease(s)"
        assert {line.strip() for line in lines[1:]} == {str(task_id) for task_id in in_flight}
        rescuer = start_worker(
            "--burst", "--lease-ms", str(LEASE_MS), "--concurrency", "2", "--worker-id", "rescuer"
        )
        assert rescuer.finish() == 0, rescuer.describe()
    else:
        # The rescuer is already idle when the expiry requeues the tasks: it must notice.
        rescuer = start_worker(
            "--lease-ms", str(LEASE_MS), "--worker-id", "rescuer", "--no-expire-leases"
        )
        wait_until(
            lambda: Task.objects.get(pk=never_claimed).status == "completed", alive=[rescuer]
        )
        wait_until(lambda: _leases_ran_out(in_flight), timeout=10)
        assert set(orch.expire_leases().expired_task_ids) == in_flight
        wait_until(
            lambda: Task.objects.filter(run_id=run.id, status="completed").count() == 3,
            alive=[rescuer],
        )
        rescuer.send_signal(signal.SIGTERM)
        assert rescuer.finish() == 0, rescuer.describe()

    # Every task completed exactly once, by the rescuer, and nothing is left leased.
    assert set(Task.objects.filter(run_id=run.id).values_list("status", flat=True)) == {"completed"}
    completed = event_counts(run.id, "task.completed")
    assert completed == dict.fromkeys(all_ids, 1)
    assert not Task.objects.filter(run_id=run.id, lease_id__isnull=False).exists()
    assert not Task.objects.filter(run_id=run.id, leased_by__isnull=False).exists()
    assert not Lease.objects.filter(run_id=run.id, status="active").exists()
    assert orch.get_run(run_id=run.id).status == "completed"
    for task in Task.objects.filter(run_id=run.id):
        assert task.output == {"by": "rescuer"}

    # The killed attempts are recorded as expired; the retries as completed.
    assert event_counts(run.id, "task.lease_expired") == dict.fromkeys(in_flight, 1)
    for task_id in in_flight:
        attempts = list(Attempt.objects.filter(task_id=task_id).order_by("leased_at"))
        assert [(a.worker_id, a.status) for a in attempts] == [
            ("doomed", "expired"),
            ("rescuer", "completed"),
        ]
        assert attempts[0].error == "lease_expired"
        leases = list(Lease.objects.filter(task_id=task_id).order_by("acquired_at"))
        assert [lease.status for lease in leases] == ["expired", "released"]
        assert Task.objects.get(pk=task_id).attempt_count == 2
    assert list(
        Attempt.objects.filter(task_id=never_claimed).values_list("worker_id", "status")
    ) == [("rescuer", "completed")]
    assert Task.objects.get(pk=never_claimed).attempt_count == 1
    # The handler ran (started) once per attempt: 2 killed + 3 completed.
    assert len(marker_lines(marker, "started")) == 5
    assert len(marker_lines(marker, "finished")) == 3


def test_a_running_worker_expires_a_killed_workers_leases_itself_and_retries_them_once(
    tmp_path,
):
    """Two workers; one is killed with SIGKILL mid-task; nothing else runs (no
    pmcp_expire_leases): the other worker's own expiry pass requeues the tasks and it
    completes each exactly once."""
    orch = Orchestrator()
    marker = tmp_path / "marker"
    run = orch.create_run(namespace="crash")
    task_input = {"seconds": 60, "slow_worker": "doomed", "marker": str(marker)}
    tasks = [
        orch.enqueue_task(run_id=run.id, kind="test.slow_on_worker", input=task_input)
        for _ in range(2)
    ]
    all_ids = {task.id for task in tasks}
    doomed = start_worker(
        "--lease-ms", str(LEASE_MS), "--concurrency", "2", "--worker-id", "doomed"
    )
    wait_until(lambda: len(marker_lines(marker, "started")) == 2, alive=[doomed])
    rescuer = start_worker(
        "--lease-ms", str(LEASE_MS), "--worker-id", "rescuer", "--lease-expiry-interval-ms", "200"
    )
    wait_until(lambda: "lease expiry started: a pass every 200 ms" in rescuer.err, alive=[rescuer])
    doomed.send_signal(signal.SIGKILL)
    assert doomed.wait(10) == -signal.SIGKILL

    wait_until(
        lambda: Task.objects.filter(run_id=run.id, status="completed").count() == 2,
        alive=[rescuer],
    )
    rescuer.send_signal(signal.SIGTERM)
    assert rescuer.finish() == 0, rescuer.describe()
    assert "expired 1 lease(s)" in rescuer.err or "expired 2 lease(s)" in rescuer.err
    assert event_counts(run.id, "task.completed") == dict.fromkeys(all_ids, 1)
    assert event_counts(run.id, "task.lease_expired") == dict.fromkeys(all_ids, 1)
    for task_id in all_ids:
        assert list(
            Attempt.objects.filter(task_id=task_id)
            .order_by("leased_at")
            .values_list("worker_id", "status")
        ) == [("doomed", "expired"), ("rescuer", "completed")]
        assert Task.objects.get(pk=task_id).output == {"by": "rescuer"}
    assert not Lease.objects.filter(run_id=run.id, status="active").exists()
    assert orch.get_run(run_id=run.id).status == "completed"


def test_a_worker_told_not_to_expire_leases_leaves_them_to_pmcp_expire_leases(tmp_path):
    orch = Orchestrator()
    marker = tmp_path / "marker"
    run = orch.create_run(namespace="crash")
    task = orch.enqueue_task(
        run_id=run.id,
        kind="test.slow_on_worker",
        input={"seconds": 60, "slow_worker": "doomed", "marker": str(marker)},
    )
    doomed = start_worker("--lease-ms", str(LEASE_MS), "--worker-id", "doomed")
    wait_until(lambda: marker_lines(marker, "started"), alive=[doomed])
    bystander = start_worker("--worker-id", "bystander", "--no-expire-leases")
    doomed.send_signal(signal.SIGKILL)
    assert doomed.wait(10) == -signal.SIGKILL
    wait_until(lambda: _leases_ran_out([task.id]), timeout=10)
    # Past the lease, a marker task the bystander runs proves it has been looking all along.
    probe = orch.enqueue_task(run_id=run.id, kind="test.slow_on_worker", input={})
    wait_until(lambda: Task.objects.get(pk=probe.id).status == "completed", alive=[bystander])
    assert Task.objects.get(pk=task.id).status == "running"
    assert "lease expiry started" not in bystander.err
    code, out, err = run_command("pmcp_expire_leases", "--once")
    assert (code, out.splitlines()[0]) == (0, "expired 1 lease(s)"), err
    wait_until(lambda: Task.objects.get(pk=task.id).status == "completed", alive=[bystander])
    bystander.send_signal(signal.SIGTERM)
    assert bystander.finish() == 0, bystander.describe()


def test_a_frozen_worker_that_outlived_its_lease_lets_go_when_it_wakes_up(tmp_path):
    """SIGSTOP past the lease: the task is expired and completed elsewhere; on SIGCONT the
    first worker's heartbeat is refused, its handler is told, and it reports nothing."""
    orch = Orchestrator()
    marker = tmp_path / "marker"
    run = orch.create_run(namespace="frozen")
    task = orch.enqueue_task(
        run_id=run.id,
        kind="test.slow_on_worker",
        input={"seconds": 60, "slow_worker": "frozen", "marker": str(marker)},
    )
    frozen = start_worker("--lease-ms", str(LEASE_MS), "--worker-id", "frozen")
    wait_until(lambda: marker_lines(marker, "started"), alive=[frozen])
    frozen.send_signal(signal.SIGSTOP)
    try:
        wait_until(lambda: _leases_ran_out([task.id]), timeout=10)
        assert orch.expire_leases().expired_task_ids == [task.id]
        rescuer = start_worker("--burst", "--worker-id", "rescuer")
        assert rescuer.finish() == 0, rescuer.describe()
        assert Task.objects.get(pk=task.id).status == "completed"
    finally:
        frozen.send_signal(signal.SIGCONT)

    # Woken up, the frozen worker finds out at its next heartbeat and stops its handler.
    wait_until(lambda: len(marker_lines(marker, "finished")) == 2, timeout=10, alive=[frozen])
    frozen.send_signal(signal.SIGTERM)
    assert frozen.finish() == 0, frozen.describe()
    assert "lease lost" in frozen.err or "handler told to stop" in frozen.err

    task = Task.objects.get(pk=task.id)
    assert (task.status, task.output) == ("completed", {"by": "rescuer"})
    assert event_counts(run.id, "task.completed") == {task.id: 1}
    assert list(
        Attempt.objects.filter(task_id=task.id)
        .order_by("leased_at")
        .values_list("worker_id", "status")
    ) == [("frozen", "expired"), ("rescuer", "completed")]

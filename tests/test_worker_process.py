"""A ``pmcp_worker`` process: ``--burst`` and ``--concurrency``."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from parallel_mcp import Orchestrator
from parallel_mcp.models import Attempt, Task
from parallel_mcp.worker.loop import DEFAULT_CONCURRENCY
from tests.workers import (
    event_counts,
    kill_leftover_processes,  # noqa: F401 - autouse fixture
    marker_lines,
    start_worker,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]


def test_burst_exits_0_at_once_when_there_is_nothing_to_do():
    started = time.monotonic()
    worker = start_worker("--burst")
    assert worker.finish(timeout=20) == 0, worker.describe()
    assert time.monotonic() - started < 15
    assert "nothing claimable" in worker.err


def test_burst_exits_0_when_what_is_queued_cannot_be_claimed_now():
    orch = Orchestrator()
    run = orch.create_run(namespace="burst")
    later = orch.enqueue_task(
        run_id=run.id, kind="test.echo", not_before=timezone.now() + timedelta(hours=1)
    )
    blocker = orch.enqueue_task(run_id=run.id, kind="test.nobody_handles_this")
    dependent = orch.enqueue_task(run_id=run.id, kind="test.echo", depends_on=[blocker.id])
    worker = start_worker("--burst")
    assert worker.finish(timeout=20) == 0, worker.describe()
    for task in (later, blocker, dependent):
        task = Task.objects.get(pk=task.id)
        assert (task.status, task.attempt_count) == ("queued", 0)
    assert not Attempt.objects.exists()


@pytest.mark.parametrize(
    ("slots", "options"),
    [(3, ("--concurrency", "3")), (DEFAULT_CONCURRENCY, ())],
    ids=["concurrency-3", "default"],
)
def test_concurrency_n_runs_n_tasks_at_the_same_time(tmp_path, slots, options):
    """Each rendezvous task waits until all of them have started: they only all meet if the
    worker runs them at the same time (with fewer slots the first would wait out its
    timeout). Without --concurrency, a worker runs DEFAULT_CONCURRENCY (8) at once."""
    orch = Orchestrator()
    marker = tmp_path / "marker"
    run = orch.create_run(namespace="parallel")
    tasks = [
        orch.enqueue_task(
            run_id=run.id,
            kind="test.rendezvous",
            input={"parties": slots, "timeout": 20, "marker": str(marker)},
        )
        for _ in range(slots)
    ]
    worker = start_worker("--burst", *options, "--worker-id", "wide")
    assert worker.finish() == 0, worker.describe()
    assert f"started: {slots} slot(s)" in worker.err

    for task in tasks:
        task = Task.objects.get(pk=task.id)
        assert (task.status, task.output) == ("completed", {"met": True})
    lines = marker_lines(marker)
    assert [line.split()[0] for line in lines] == ["started"] * slots + ["finished"] * slots
    assert len({line.split()[2] for line in lines}) == 1  # one process (pid=...)
    # Three leases were held at once by the one worker.
    attempts = list(Attempt.objects.filter(run_id=run.id))
    assert {attempt.worker_id for attempt in attempts} == {"wide"}
    last_start = max(attempt.started_at for attempt in attempts)
    assert all(attempt.ended_at > last_start for attempt in attempts)


@pytest.mark.parametrize(
    ("concurrency", "max_parallel", "expected"),
    [(2, None, 2), (3, 1, 1)],
    ids=["slots", "run-max-parallel"],
)
def test_never_more_tasks_at_once_than_slots_or_the_runs_limit(concurrency, max_parallel, expected):
    orch = Orchestrator()
    if max_parallel is None:
        run = orch.create_run(namespace="parallel")
    else:
        run = orch.create_run(namespace="parallel", max_parallel=max_parallel)
    for _ in range(5):
        orch.enqueue_task(run_id=run.id, kind="test.sleep", input={"seconds": 0.3})
    worker = start_worker("--burst", "--concurrency", str(concurrency))
    assert worker.finish() == 0, worker.describe()

    attempts = list(Attempt.objects.filter(run_id=run.id))
    assert [a.status for a in attempts] == ["completed"] * 5
    edges = sorted(
        [(a.started_at, 1) for a in attempts] + [(a.ended_at, -1) for a in attempts],
        key=lambda edge: (edge[0], edge[1]),  # an end before a start at the same instant
    )
    running, most = 0, 0
    for _, step in edges:
        running += step
        most = max(most, running)
    assert most == expected


def test_burst_waits_for_running_tasks_that_make_more_work_claimable():
    """A burst worker must not stop while a running task can still unlock others: with two
    slots, one runs each link of the chain while the other finds nothing to claim."""
    orch = Orchestrator()
    run = orch.create_run(namespace="chain")
    first = orch.enqueue_task(run_id=run.id, kind="test.sleep", input={"seconds": 0.5})
    second = orch.enqueue_task(
        run_id=run.id, kind="test.sleep", input={"seconds": 0.5}, depends_on=[first.id]
    )
    third = orch.enqueue_task(run_id=run.id, kind="test.echo", depends_on=[second.id])
    worker = start_worker("--burst", "--concurrency", "2")
    assert worker.finish() == 0, worker.describe()
    assert [Task.objects.get(pk=t.id).status for t in (first, second, third)] == ["completed"] * 3
    assert orch.get_run(run_id=run.id).status == "completed"


def test_burst_against_an_unreachable_database_does_not_exit_0():
    """It could not even look for work: that is not "nothing claimable". The start-up check
    says so in one line (a claim that keeps failing later: test_worker_units)."""
    name = "pmcp_no_such_database" if connection.vendor == "postgresql" else "/nonexistent/x.db"
    worker = start_worker("--burst", env={"PMCP_DB_NAME": name})
    code = worker.finish()
    assert code == 1, worker.describe()
    assert worker.err.startswith(
        "CommandError: parallel_mcp: cannot reach the database 'default': "
    ), worker.describe()
    assert len(worker.err.strip().splitlines()) == 1, worker.describe()


def test_each_log_line_appears_once():
    """The project's LOGGING (tests/settings.py) already sends parallel_mcp to stderr: the
    command must not add a second stderr handler."""
    worker = start_worker("--burst")
    assert worker.finish() == 0, worker.describe()
    assert worker.err.count("burst: nothing claimable") == 1, worker.err


def test_several_worker_processes_complete_every_task_exactly_once():
    orch = Orchestrator()
    run = orch.create_run(namespace="many")
    tasks = orch.enqueue_tasks(
        run_id=run.id,
        tasks=[{"kind": "test.sleep", "input": {"seconds": 0.02}} for _ in range(60)],
    )
    workers = [
        start_worker("--burst", "--concurrency", "2", "--worker-id", f"w{n}") for n in range(3)
    ]
    for worker in workers:
        assert worker.finish(timeout=60) == 0, worker.describe()

    assert orch.get_run(run_id=run.id).status == "completed"
    assert event_counts(run.id, "task.completed") == {task.id: 1 for task in tasks}
    assert set(Task.objects.filter(run_id=run.id).values_list("attempt_count", flat=True)) == {1}
    assert Attempt.objects.filter(run_id=run.id).count() == 60
    assert not Task.objects.filter(run_id=run.id, lease_id__isnull=False).exists()

"""Lifecycle extensions: list_stuck_tasks."""

from __future__ import annotations

import pytest

from parallel_mcp.exceptions import ValidationError
from tests.conftest import at

pytestmark = pytest.mark.django_db


def lease_of(c, worker="w1") -> dict:
    return {"task_id": c.task.id, "lease_id": c.lease.id, "worker_id": worker}


def start(orch, run, kind, *, at_s, worker="w1", running=True, lease_ms=30_000, **kwargs):
    """Enqueue and claim a task at ``at_s`` (and mark it running); return the claim."""
    task = orch.enqueue_task(run_id=run.id, kind=kind, now=at(at_s), **kwargs)
    c = orch.claim_next_task(worker_id=worker, kinds=[kind], lease_ms=lease_ms, now=at(at_s))
    assert c is not None and c.task.id == task.id
    if running:
        orch.mark_task_running(**lease_of(c, worker), now=at(at_s))
    return c


def beat(orch, c, now, worker="w1", lease_ms=30_000):
    orch.heartbeat_lease(**lease_of(c, worker), lease_ms=lease_ms, now=now)


def ids(tasks) -> list:
    return [task.id for task in tasks]


def test_a_heart_beating_task_past_the_threshold_is_listed(orch, run):
    c = start(orch, run, "slow", at_s=0)
    for second in (20, 40, 60):
        beat(orch, c, at(second))

    stuck = orch.list_stuck_tasks(running_longer_than_ms=50_000, now=at(61))

    assert ids(stuck) == [c.task.id]
    assert stuck[0].status == "running"


def test_below_the_threshold_it_is_not_listed(orch, run):
    c = start(orch, run, "slow", at_s=0)
    beat(orch, c, at(20))
    assert orch.list_stuck_tasks(running_longer_than_ms=30_000, now=at(29)) == []
    assert ids(orch.list_stuck_tasks(running_longer_than_ms=30_000, now=at(31))) == [c.task.id]


def test_longest_running_first(orch, run):
    young = start(orch, run, "young", at_s=30, worker="a")
    old = start(orch, run, "old", at_s=0, worker="b", lease_ms=120_000)
    middle = start(orch, run, "middle", at_s=10, worker="c", lease_ms=120_000)
    beat(orch, young, at(35), worker="a", lease_ms=60_000)

    stuck = orch.list_stuck_tasks(running_longer_than_ms=5_000, now=at(40))

    assert ids(stuck) == [old.task.id, middle.task.id, young.task.id]


def test_a_task_past_its_own_timeout_is_listed_without_a_threshold(orch, run):
    quick = start(orch, run, "quick", at_s=0, timeout_ms=10_000)
    start(orch, run, "patient", at_s=0, worker="w2", timeout_ms=100_000)
    start(orch, run, "untimed", at_s=0, worker="w3")
    assert orch.list_stuck_tasks(now=at(9)) == []
    assert ids(orch.list_stuck_tasks(now=at(11))) == [quick.task.id]


def test_the_threshold_or_the_own_timeout_whichever_comes_first(orch, run):
    timed = start(orch, run, "timed", at_s=0, timeout_ms=10_000)
    untimed = start(orch, run, "untimed", at_s=0, worker="w2")
    stuck = orch.list_stuck_tasks(running_longer_than_ms=20_000, now=at(15))
    assert ids(stuck) == [timed.task.id]
    stuck = orch.list_stuck_tasks(running_longer_than_ms=20_000, now=at(25))
    assert set(ids(stuck)) == {timed.task.id, untimed.task.id}


def test_a_leased_but_not_yet_running_task_counts_too(orch, run):
    c = start(orch, run, "leased", at_s=0, running=False)
    assert ids(orch.list_stuck_tasks(running_longer_than_ms=10_000, now=at(20))) == [c.task.id]


def test_an_expired_lease_is_not_listed(orch, run):
    c = start(orch, run, "gone", at_s=0, lease_ms=30_000)
    # Still valid exactly at expiry (expiry is strict) ...
    assert ids(orch.list_stuck_tasks(running_longer_than_ms=1_000, now=at(30))) == [c.task.id]
    # ... gone once it has expired, even before expire_leases ran.
    assert orch.list_stuck_tasks(running_longer_than_ms=1_000, now=at(31)) == []
    orch.expire_leases(now=at(31))
    assert orch.list_stuck_tasks(running_longer_than_ms=1_000, now=at(32)) == []


@pytest.mark.parametrize("state", ["queued", "blocked", "waiting_input", "completed", "failed"])
def test_tasks_that_are_not_leased_or_running_are_not_listed(orch, run, state):
    task = orch.enqueue_task(run_id=run.id, kind="k", timeout_ms=1_000, now=at(0))
    if state != "queued":
        c = orch.claim_next_task(worker_id="w1", now=at(0))
        orch.mark_task_running(**lease_of(c), now=at(0))
        if state in ("blocked", "waiting_input"):
            orch.pause_task(**lease_of(c), status=state, now=at(5))
        elif state == "completed":
            orch.complete_task(**lease_of(c), now=at(5))
        else:
            orch.fail_task(**lease_of(c), error="x", now=at(5))
    assert orch.get_task(task_id=task.id).status == state
    assert orch.list_stuck_tasks(running_longer_than_ms=1_000, now=at(20)) == []


def test_the_clock_restarts_with_a_new_attempt(orch, run):
    c = start(orch, run, "k", at_s=0, lease_ms=10_000, max_attempts=3)
    orch.expire_leases(now=at(11))
    again = orch.claim_next_task(worker_id="w2", lease_ms=60_000, now=at(50))
    assert again.task.id == c.task.id
    assert orch.list_stuck_tasks(running_longer_than_ms=20_000, now=at(60)) == []
    assert ids(orch.list_stuck_tasks(running_longer_than_ms=20_000, now=at(71))) == [c.task.id]


def test_tasks_of_every_run_are_listed(orch, run):
    other = orch.create_run(now=at(0))
    a = start(orch, run, "a", at_s=0)
    b = start(orch, other, "b", at_s=0, worker="w2")
    assert set(ids(orch.list_stuck_tasks(running_longer_than_ms=1_000, now=at(5)))) == {
        a.task.id,
        b.task.id,
    }


@pytest.mark.parametrize("bad", [-1, "10", 1.5, True])
def test_list_stuck_tasks_refuses_a_bad_threshold(orch, bad):
    with pytest.raises(ValidationError):
        orch.list_stuck_tasks(running_longer_than_ms=bad, now=at(0))

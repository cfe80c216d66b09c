"""Lifecycle extensions: explain_task, one test per blocker kind."""

from __future__ import annotations

import uuid

import pytest

from parallel_mcp import Blocker
from parallel_mcp.exceptions import RecordNotFoundError, ValidationError
from parallel_mcp.models import Task
from parallel_mcp.results import BLOCKER_KINDS
from parallel_mcp.selectors import LEASE_LAPSED, no_worker_message
from parallel_mcp.services import record_worker_presence, remove_worker_presence
from tests.conftest import at, live_worker

pytestmark = pytest.mark.django_db


def lease_of(c, worker="w1") -> dict:
    return {"task_id": c.task.id, "lease_id": c.lease.id, "worker_id": worker}


def enqueue(orch, run, kind, **kwargs):
    kwargs.setdefault("now", at(0))
    return orch.enqueue_task(run_id=run.id, kind=kind, **kwargs)


def take(orch, task, worker="w1", now=None, **kwargs):
    c = orch.claim_next_task(worker_id=worker, kinds=[task.kind], now=now or at(1), **kwargs)
    assert c is not None and c.task.id == task.id
    return c


def test_a_claimable_task_has_no_blockers(orch, run):
    live_worker("k")
    task = enqueue(orch, run, "k")
    assert orch.explain_task(task_id=task.id, now=at(1)) == []
    assert orch.explain_task(task_id=str(task.id), now=at(1)) == []
    c = orch.claim_next_task(worker_id="w", now=at(1))
    assert c.task.id == task.id


def test_dependency_pending(orch, run):
    a = enqueue(orch, run, "a")
    b = enqueue(orch, run, "b", depends_on=[a.id])
    [blocker] = orch.explain_task(task_id=b.id, now=at(1))
    assert isinstance(blocker, Blocker)
    assert blocker.kind == "dependency_pending"
    assert blocker.task_id == a.id
    assert str(a.id) in blocker.message
    assert "queued" in blocker.message
    # While the dependency runs, it is still pending (and the message says so).
    c = take(orch, a, worker="wa", now=at(2))
    orch.mark_task_running(**lease_of(c, "wa"), now=at(2))
    [blocker] = orch.explain_task(task_id=b.id, now=at(3))
    assert blocker.kind == "dependency_pending" and "running" in blocker.message


@pytest.mark.parametrize("outcome", ["failed", "cancelled"])
def test_dependency_failed(orch, run, outcome):
    a = enqueue(orch, run, "a")
    b = enqueue(orch, run, "b", depends_on=[a.id])
    if outcome == "failed":
        c = take(orch, a, now=at(1))
        orch.fail_task(**lease_of(c), error="boom", now=at(2))
    else:
        orch.cancel_task(task_id=a.id, now=at(2))
    [blocker] = orch.explain_task(task_id=b.id, now=at(3))
    assert blocker.kind == "dependency_failed"
    assert blocker.task_id == a.id
    assert str(a.id) in blocker.message
    assert outcome in blocker.message


def test_not_before(orch, run):
    live_worker("k")
    task = enqueue(orch, run, "k", not_before=at(60))
    [blocker] = orch.explain_task(task_id=task.id, now=at(10))
    assert blocker.kind == "not_before"
    assert blocker.until == at(60)
    assert at(60).isoformat() in blocker.message
    assert orch.claim_next_task(worker_id="w", now=at(10)) is None
    # Exactly at not_before the task is claimable.
    assert orch.explain_task(task_id=task.id, now=at(60)) == []


def test_not_before_from_a_retry_backoff(orch, run):
    live_worker("k")
    task = enqueue(orch, run, "k", max_attempts=3, retry={"delay_ms": 5_000})
    c = take(orch, task, now=at(1))
    orch.fail_task(**lease_of(c), error="flaky", retry=True, now=at(2))
    [blocker] = orch.explain_task(task_id=task.id, now=at(3))
    assert (blocker.kind, blocker.until) == ("not_before", at(7))
    assert orch.explain_task(task_id=task.id, now=at(7)) == []


@pytest.mark.parametrize("status", ["blocked", "waiting_input"])
def test_paused_with_reason(orch, run, status):
    live_worker("k")
    task = enqueue(orch, run, "k")
    c = take(orch, task, now=at(1))
    orch.pause_task(**lease_of(c), status=status, reason="needs a human to approve", now=at(2))
    [blocker] = orch.explain_task(task_id=task.id, now=at(3))
    assert blocker.kind == "paused"
    assert "needs a human to approve" in blocker.message
    assert status in blocker.message
    orch.resume_task(task_id=task.id, now=at(4))
    assert orch.explain_task(task_id=task.id, now=at(5)) == []


def test_paused_reason_of_the_latest_pause(orch, run):
    task = enqueue(orch, run, "k")
    c = take(orch, task, now=at(1))
    orch.pause_task(**lease_of(c), status="blocked", reason="first reason", now=at(2))
    orch.resume_task(task_id=task.id, now=at(3))
    c = take(orch, task, now=at(4))
    orch.pause_task(**lease_of(c), status="blocked", reason="second reason", now=at(5))
    [blocker] = orch.explain_task(task_id=task.id, now=at(6))
    assert "second reason" in blocker.message
    assert "first reason" not in blocker.message


@pytest.mark.parametrize("running", [False, True])
def test_leased_names_worker_and_until(orch, run, running):
    task = enqueue(orch, run, "k")
    c = take(orch, task, worker="worker-7", now=at(1), lease_ms=45_000)
    if running:
        orch.mark_task_running(**lease_of(c, "worker-7"), now=at(2))
    [blocker] = orch.explain_task(task_id=task.id, now=at(3))
    assert blocker.kind == "leased"
    assert blocker.until == at(46)
    assert "worker-7" in blocker.message
    assert at(46).isoformat() in blocker.message
    assert ("running" if running else "leased") in blocker.message
    # After a heartbeat the time moves.
    orch.heartbeat_lease(**lease_of(c, "worker-7"), lease_ms=45_000, now=at(10))
    [blocker] = orch.explain_task(task_id=task.id, now=at(11))
    assert blocker.until == at(55)
    assert at(55).isoformat() in blocker.message
    assert "lapsed" not in blocker.message


def test_a_lease_that_lapsed_with_nothing_expiring_it_says_so(orch, run):
    task = enqueue(orch, run, "k")
    take(orch, task, worker="dead-worker", now=at(1), lease_ms=10_000)
    # Expiry is strict: at the lease's end it is still valid.
    [blocker] = orch.explain_task(task_id=task.id, now=at(11))
    assert LEASE_LAPSED not in blocker.message
    [blocker] = orch.explain_task(task_id=task.id, now=at(12))
    assert blocker.kind == "leased" and blocker.until == at(11)
    assert blocker.message.endswith(
        f"until {at(11).isoformat()}. That lease has lapsed (its worker stopped heart-beating) "
        "and nothing has expired it yet: a running local pmcp_worker does within "
        "WORKER_LEASE_EXPIRY_INTERVAL_MS, or run pmcp_expire_leases."
    )
    orch.expire_leases(now=at(12))
    assert orch.get_task(task_id=task.id).status == "queued"


def test_run_limit(orch):
    live_worker("k")
    limited = orch.create_run(max_parallel=1, now=at(0))
    first = orch.enqueue_task(run_id=limited.id, kind="k", now=at(0))
    second = orch.enqueue_task(run_id=limited.id, kind="k", now=at(1))
    c = orch.claim_next_task(worker_id="w", now=at(2))
    assert c.task.id == first.id
    [blocker] = orch.explain_task(task_id=second.id, now=at(3))
    assert blocker.kind == "run_limit"
    assert str(limited.id) in blocker.message
    assert "max_parallel=1" in blocker.message
    assert orch.claim_next_task(worker_id="w", now=at(3)) is None
    orch.complete_task(**lease_of(c, "w"), now=at(4))
    assert orch.explain_task(task_id=second.id, now=at(5)) == []


def test_run_limit_is_not_claimed_for_a_task_waiting_on_dependencies(orch):
    limited = orch.create_run(max_parallel=1, now=at(0))
    a = orch.enqueue_task(run_id=limited.id, kind="a", now=at(0))
    b = orch.enqueue_task(run_id=limited.id, kind="b", depends_on=[a.id], now=at(0))
    take(orch, a, now=at(1))
    [blocker] = orch.explain_task(task_id=b.id, now=at(2))
    assert blocker.kind == "dependency_pending"


def test_several_blockers_at_once(orch, run):
    a = enqueue(orch, run, "a")
    b = enqueue(orch, run, "b", depends_on=[a.id], not_before=at(60))
    kinds = sorted(blocker.kind for blocker in orch.explain_task(task_id=b.id, now=at(1)))
    assert kinds == ["dependency_pending", "not_before"]


def test_a_cancelled_run_leaves_nothing_to_explain(orch, run):
    # run_cancelled: cancel_run cancels every non-terminal task, so no task of a cancelled run
    # is left waiting; explain_task has nothing to say about terminal tasks.
    task = enqueue(orch, run, "k", not_before=at(60))
    orch.cancel_run(run_id=run.id, now=at(1))
    assert Task.objects.get(pk=task.id).status == "cancelled"
    assert orch.explain_task(task_id=task.id, now=at(2)) == []


def test_explain_task_of_an_unknown_or_malformed_id(orch, run):
    with pytest.raises(RecordNotFoundError):
        orch.explain_task(task_id=uuid.uuid4(), now=at(1))
    with pytest.raises(ValidationError):
        orch.explain_task(task_id="nope", now=at(1))


# -- no_worker: no running worker handles the kind -----------------------------------------------


def test_no_running_worker_handles_the_kind(orch, run):
    task = enqueue(orch, run, "k")
    [blocker] = orch.explain_task(task_id=task.id, now=at(1))
    assert blocker == Blocker("no_worker", no_worker_message("k"))
    assert blocker.message.startswith("No running worker handles kind 'k'")
    live_worker("other.kind")  # a worker, but not for this kind
    assert [b.kind for b in orch.explain_task(task_id=task.id, now=at(1))] == ["no_worker"]
    live_worker("other.kind", "k")
    assert orch.explain_task(task_id=task.id, now=at(1)) == []


def test_a_worker_counts_until_three_missed_reports(orch, run):
    task = enqueue(orch, run, "k")
    presence = {
        "using": "default",
        "process_id": uuid.uuid4(),
        "worker_id": "w1",
        "hostname": "h",
        "kinds": ["k"],
        "interval_ms": 1_000,
    }
    record_worker_presence(**presence, now=at(10))
    assert orch.explain_task(task_id=task.id, now=at(12.999)) == []
    # Three intervals after its last report it is gone (a kill -9 sends no goodbye).
    assert [b.kind for b in orch.explain_task(task_id=task.id, now=at(13))] == ["no_worker"]
    record_worker_presence(**presence, now=at(14))  # it reports again: running again
    assert orch.explain_task(task_id=task.id, now=at(16)) == []
    remove_worker_presence(using="default", process_id=presence["process_id"])
    assert [b.kind for b in orch.explain_task(task_id=task.id, now=at(16))] == ["no_worker"]


def test_no_worker_comes_with_time_and_slot_waits(orch, run):
    later = enqueue(orch, run, "k", not_before=at(60))
    kinds = [b.kind for b in orch.explain_task(task_id=later.id, now=at(1))]
    assert kinds == ["not_before", "no_worker"]
    limited = orch.create_run(max_parallel=1, now=at(0))
    orch.enqueue_task(run_id=limited.id, kind="k", now=at(0))
    second = orch.enqueue_task(run_id=limited.id, kind="k", now=at(1))
    orch.claim_next_task(worker_id="w", now=at(2))
    kinds = [b.kind for b in orch.explain_task(task_id=second.id, now=at(3))]
    assert kinds == ["run_limit", "no_worker"]


def test_no_worker_is_not_said_of_tasks_waiting_for_other_tasks_or_a_human(orch, run):
    """A task waiting for a dependency is explained by the dependency; paused and leased
    tasks are not waiting for a worker."""
    a = enqueue(orch, run, "a")
    b = enqueue(orch, run, "b", depends_on=[a.id])
    assert [x.kind for x in orch.explain_task(task_id=b.id, now=at(1))] == ["dependency_pending"]
    c = take(orch, a, now=at(1))
    assert [x.kind for x in orch.explain_task(task_id=a.id, now=at(2))] == ["leased"]
    orch.pause_task(**lease_of(c), status="waiting_input", now=at(2))
    assert [x.kind for x in orch.explain_task(task_id=a.id, now=at(3))] == ["paused"]
    orch.cancel_task(task_id=a.id, now=at(4))
    assert [x.kind for x in orch.explain_task(task_id=b.id, now=at(5))] == ["dependency_failed"]


def test_no_worker_is_in_the_blocker_kinds():
    assert "no_worker" in BLOCKER_KINDS


@pytest.mark.parametrize("served", [False, True])
def test_explaining_a_claimable_task_takes_three_queries(
    orch, run, served, django_assert_num_queries
):
    """The task with its run, its dependency edges, and one indexed look at the presence
    table, however many workers and kinds are recorded."""
    task = enqueue(orch, run, "k")
    for index in range(20):
        live_worker(*[f"kind-{index}-{n}" for n in range(10)], worker_id=f"w{index}")
    if served:
        live_worker("k")
    with django_assert_num_queries(3):
        blockers = orch.explain_task(task_id=task.id, now=at(1))
    assert [b.kind for b in blockers] == ([] if served else ["no_worker"])

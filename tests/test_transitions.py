"""The task state machine through the public API: every allowed and refused move, lease
fencing, lease columns, attempt counting, and the Attempt/Lease rows after each outcome."""

from __future__ import annotations

import uuid

import pytest

from parallel_mcp.exceptions import (
    InvalidTransitionError,
    LeaseConflictError,
    LeaseExpiredError,
)
from parallel_mcp.models import Attempt, ContextSnapshot, Event, Lease, Run, Task
from tests.conftest import at, claim

pytestmark = pytest.mark.django_db

ACTION_TIME = at(5)  # inside the default 30 s lease of a claim at at(1)

LEASED_STATES = ("leased", "running")
PAUSED_STATES = ("blocked", "waiting_input")
TERMINAL_STATES = ("completed", "failed", "cancelled")
ALL_STATES = ("queued", *LEASED_STATES, *PAUSED_STATES, *TERMINAL_STATES)

LEASE_ACTIONS = (
    "mark_running",
    "heartbeat",
    "pause_blocked",
    "pause_waiting_input",
    "complete",
    "fail",
    "fail_retry",
    "release",
)


def row_counts() -> dict[str, int]:
    return {
        m.__name__: m.objects.count() for m in (Run, Task, Attempt, Lease, ContextSnapshot, Event)
    }


def task_state(task_id) -> tuple:
    t = Task.objects.get(pk=task_id)
    return (
        t.status,
        t.attempt_count,
        t.lease_id,
        t.leased_by,
        t.lease_expires_at,
        t.output,
        t.error,
        t.not_before,
        t.updated_at,
    )


def act(orch, action, task_id, lease_id, worker="w1", now=ACTION_TIME):
    """Perform ``action`` as a worker holding (or claiming to hold) ``lease_id``."""
    lease = {"task_id": task_id, "lease_id": lease_id, "worker_id": worker, "now": now}
    if action == "mark_running":
        return orch.mark_task_running(**lease)
    if action == "heartbeat":
        return orch.heartbeat_lease(**lease)
    if action == "pause_blocked":
        return orch.pause_task(status="blocked", **lease)
    if action == "pause_waiting_input":
        return orch.pause_task(status="waiting_input", **lease)
    if action == "complete":
        return orch.complete_task(output={"ok": True}, **lease)
    if action == "fail":
        return orch.fail_task(error="boom", **lease)
    if action == "fail_retry":
        return orch.fail_task(error="boom", retry=True, **lease)
    if action == "release":
        return orch.release_task(**lease)
    if action == "resume":
        return orch.resume_task(task_id=task_id, now=now)
    raise AssertionError(action)


def bring_to(orch, run, state):
    """A task of ``run`` in ``state`` and the id of the last lease worker w1 held on it.

    The run keeps a second, never-ready task so that it stays open whatever happens to the
    first one (except for ``cancelled``, which cancels the run).
    """
    task = orch.enqueue_task(run_id=run.id, kind="k", max_attempts=5, now=at(0))
    orch.enqueue_task(run_id=run.id, kind="other", not_before=at(10_000), now=at(0))
    c = claim(orch, now=at(1))
    assert c.task.id == task.id
    lease = {"task_id": task.id, "lease_id": c.lease.id, "worker_id": "w1"}
    if state == "queued":
        orch.release_task(**lease, now=at(1))
    elif state == "running":
        orch.mark_task_running(**lease, now=at(2))
    elif state in PAUSED_STATES:
        orch.pause_task(**lease, status=state, now=at(2))
    elif state == "completed":
        orch.complete_task(**lease, now=at(2))
    elif state == "failed":
        orch.fail_task(**lease, error="first failure", now=at(2))
    elif state == "cancelled":
        orch.cancel_run(run_id=run.id, now=at(2))
    else:
        assert state == "leased"
    assert Task.objects.get(pk=task.id).status == state
    return task, c.lease.id


# The contract's table, as outcomes of each call: a resulting status or the error raised.
EXPECTED = {
    "leased": {
        "mark_running": "running",
        "heartbeat": "leased",
        "pause_blocked": "blocked",
        "pause_waiting_input": "waiting_input",
        "complete": "completed",
        "fail": "failed",
        "fail_retry": "queued",
        "release": "queued",
        "resume": InvalidTransitionError,
    },
    "running": {
        "mark_running": InvalidTransitionError,
        "heartbeat": "running",
        "pause_blocked": "blocked",
        "pause_waiting_input": "waiting_input",
        "complete": "completed",
        "fail": "failed",
        "fail_retry": "queued",
        "release": "queued",
        "resume": InvalidTransitionError,
    },
}
for _state in ("queued", *PAUSED_STATES, *TERMINAL_STATES):
    EXPECTED[_state] = dict.fromkeys(LEASE_ACTIONS, LeaseConflictError)
    EXPECTED[_state]["resume"] = "queued" if _state in PAUSED_STATES else InvalidTransitionError

MATRIX = [
    pytest.param(state, action, EXPECTED[state][action], id=f"{state}-{action}")
    for state in ALL_STATES
    for action in (*LEASE_ACTIONS, "resume")
]


def test_the_matrix_covers_every_state_and_call():
    assert len(MATRIX) == len(ALL_STATES) * (len(LEASE_ACTIONS) + 1)


@pytest.mark.parametrize(("state", "action", "expected"), MATRIX)
def test_transition_matrix(orch, run, state, action, expected):
    task, lease_id = bring_to(orch, run, state)
    before_rows = row_counts()
    before_task = task_state(task.id)

    if isinstance(expected, type):
        with pytest.raises(expected):
            act(orch, action, task.id, lease_id)
        assert row_counts() == before_rows
        assert task_state(task.id) == before_task
    else:
        act(orch, action, task.id, lease_id)
        stored = Task.objects.get(pk=task.id)
        assert stored.status == expected
        lease_columns = (stored.lease_id, stored.leased_by, stored.lease_expires_at)
        if expected in LEASED_STATES:
            assert lease_columns[:2] == (lease_id, "w1")
            assert lease_columns[2] is not None
        else:
            assert lease_columns == (None, None, None)


def test_a_never_leased_queued_task_refuses_every_lease_call(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    before = row_counts()
    for action in LEASE_ACTIONS:
        with pytest.raises(LeaseConflictError):
            act(orch, action, task.id, uuid.uuid4())
    assert row_counts() == before
    assert Task.objects.get(pk=task.id).status == "queued"


@pytest.mark.parametrize("state", ["queued", *LEASED_STATES, *PAUSED_STATES])
def test_cancel_run_moves_every_non_terminal_state_to_cancelled(orch, run, state):
    task, _ = bring_to(orch, run, state)
    orch.cancel_run(run_id=run.id, now=at(5))
    assert Task.objects.get(pk=task.id).status == "cancelled"


@pytest.mark.parametrize("state", ["completed", "failed"])
def test_cancel_run_does_not_move_a_terminal_task(orch, run, state):
    task, _ = bring_to(orch, run, state)
    orch.cancel_run(run_id=run.id, now=at(5))
    assert Task.objects.get(pk=task.id).status == state


@pytest.mark.parametrize("state", [s for s in ALL_STATES if s != "queued"])
def test_only_queued_tasks_are_claimed(orch, run, state):
    bring_to(orch, run, state)
    assert claim(orch, "w2", now=at(5), kinds=["k"]) is None


def test_a_queued_task_is_claimed(orch, run):
    task, _ = bring_to(orch, run, "queued")
    assert claim(orch, "w2", now=at(5), kinds=["k"]).task.id == task.id


# -- lease fencing ---------------------------------------------------------------------------


@pytest.mark.parametrize("state", LEASED_STATES)
@pytest.mark.parametrize("action", LEASE_ACTIONS)
def test_a_wrong_lease_id_is_a_lease_conflict(orch, run, state, action):
    task, _ = bring_to(orch, run, state)
    before_rows, before_task = row_counts(), task_state(task.id)

    with pytest.raises(LeaseConflictError):
        act(orch, action, task.id, uuid.uuid4())

    assert row_counts() == before_rows
    assert task_state(task.id) == before_task


@pytest.mark.parametrize("state", LEASED_STATES)
@pytest.mark.parametrize("action", LEASE_ACTIONS)
def test_a_wrong_worker_is_a_lease_conflict(orch, run, state, action):
    task, lease_id = bring_to(orch, run, state)
    before_rows, before_task = row_counts(), task_state(task.id)

    with pytest.raises(LeaseConflictError):
        act(orch, action, task.id, lease_id, worker="w-other")

    assert row_counts() == before_rows
    assert task_state(task.id) == before_task


@pytest.mark.parametrize("action", LEASE_ACTIONS)
def test_the_lease_of_another_task_is_a_lease_conflict(orch, run, action):
    first = orch.enqueue_task(run_id=run.id, kind="k", priority=1, now=at(0))
    second = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    c1 = claim(orch, now=at(1))
    claim(orch, now=at(1))
    before_rows, before_task = row_counts(), task_state(second.id)

    with pytest.raises(LeaseConflictError):
        act(orch, action, second.id, c1.lease.id)

    assert c1.task.id == first.id
    assert row_counts() == before_rows
    assert task_state(second.id) == before_task


@pytest.mark.parametrize("state", LEASED_STATES)
@pytest.mark.parametrize("action", LEASE_ACTIONS)
def test_an_expired_lease_is_refused(orch, run, state, action):
    task, lease_id = bring_to(orch, run, state)
    expires = Task.objects.get(pk=task.id).lease_expires_at
    assert expires == at(31)
    before_rows, before_task = row_counts(), task_state(task.id)

    with pytest.raises(LeaseExpiredError):
        act(orch, action, task.id, lease_id, now=at(31, ms=1))

    assert row_counts() == before_rows
    assert task_state(task.id) == before_task


@pytest.mark.parametrize("state", LEASED_STATES)
@pytest.mark.parametrize("action", [a for a in LEASE_ACTIONS if a != "mark_running"])
def test_a_lease_expiring_exactly_now_is_still_valid(orch, run, state, action):
    task, lease_id = bring_to(orch, run, state)
    assert Task.objects.get(pk=task.id).lease_expires_at == at(31)

    act(orch, action, task.id, lease_id, now=at(31))

    assert Task.objects.get(pk=task.id).status == EXPECTED[state][action]


def test_mark_running_exactly_at_expiry_is_still_valid(orch, run):
    task, lease_id = bring_to(orch, run, "leased")
    act(orch, "mark_running", task.id, lease_id, now=at(31))
    assert Task.objects.get(pk=task.id).status == "running"


def test_the_error_is_a_conflict_not_expiry_when_the_lease_is_wrong_and_late(orch, run):
    task, _ = bring_to(orch, run, "leased")
    with pytest.raises(LeaseConflictError):
        act(orch, "complete", task.id, uuid.uuid4(), now=at(100))


@pytest.mark.parametrize("action", LEASE_ACTIONS)
def test_after_expiry_and_requeue_the_old_lease_is_a_conflict(orch, run, action):
    task, lease_id = bring_to(orch, run, "running")
    orch.expire_leases(now=at(40))
    before = row_counts()

    with pytest.raises(LeaseConflictError):
        act(orch, action, task.id, lease_id, now=at(41))

    assert row_counts() == before
    assert Task.objects.get(pk=task.id).status == "queued"


@pytest.mark.parametrize("action", LEASE_ACTIONS)
def test_after_another_worker_reclaims_the_old_lease_is_a_conflict(orch, run, action):
    task, lease_id = bring_to(orch, run, "running")
    orch.expire_leases(now=at(40))
    c2 = claim(orch, "w2", now=at(41), kinds=["k"])
    assert c2.task.id == task.id
    before_rows, before_task = row_counts(), task_state(task.id)

    with pytest.raises(LeaseConflictError):
        act(orch, action, task.id, lease_id, now=at(42))

    assert row_counts() == before_rows
    assert task_state(task.id) == before_task
    assert Task.objects.get(pk=task.id).leased_by == "w2"


# -- lease columns and attempts ----------------------------------------------------------------


def test_lease_columns_are_set_exactly_while_leased_or_running(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))

    def columns():
        t = Task.objects.get(pk=task.id)
        return (t.status, t.lease_id, t.leased_by, t.lease_expires_at)

    assert columns() == ("queued", None, None, None)
    c = orch.claim_next_task(worker_id="w1", lease_ms=10_000, now=at(1))
    assert columns() == ("leased", c.lease.id, "w1", at(11))
    orch.mark_task_running(task_id=task.id, lease_id=c.lease.id, worker_id="w1", now=at(2))
    assert columns() == ("running", c.lease.id, "w1", at(11))
    orch.heartbeat_lease(
        task_id=task.id, lease_id=c.lease.id, worker_id="w1", lease_ms=10_000, now=at(3)
    )
    assert columns() == ("running", c.lease.id, "w1", at(13))
    orch.pause_task(
        task_id=task.id, lease_id=c.lease.id, worker_id="w1", status="blocked", now=at(4)
    )
    assert columns() == ("blocked", None, None, None)
    orch.resume_task(task_id=task.id, now=at(5))
    assert columns() == ("queued", None, None, None)
    c2 = orch.claim_next_task(worker_id="w2", lease_ms=10_000, now=at(6))
    assert columns() == ("leased", c2.lease.id, "w2", at(16))
    orch.complete_task(task_id=task.id, lease_id=c2.lease.id, worker_id="w2", now=at(7))
    assert columns() == ("completed", None, None, None)


def test_every_claim_increments_attempt_count(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", max_attempts=10, now=at(0))
    counts = []

    c = orch.claim_next_task(worker_id="w1", lease_ms=1_000, now=at(1))
    counts.append(c.task.attempt_count)
    orch.fail_task(
        task_id=task.id, lease_id=c.lease.id, worker_id="w1", error="e", retry=True, now=at(1)
    )
    c = orch.claim_next_task(worker_id="w1", lease_ms=1_000, now=at(2))
    counts.append(c.task.attempt_count)
    orch.expire_leases(now=at(4))
    c = orch.claim_next_task(worker_id="w1", lease_ms=1_000, now=at(5))
    counts.append(c.task.attempt_count)
    orch.pause_task(
        task_id=task.id, lease_id=c.lease.id, worker_id="w1", status="blocked", now=at(5)
    )
    orch.resume_task(task_id=task.id, now=at(5))
    c = orch.claim_next_task(worker_id="w1", lease_ms=1_000, now=at(6))
    counts.append(c.task.attempt_count)

    assert counts == [1, 2, 3, 4]
    assert Task.objects.get(pk=task.id).attempt_count == 4
    assert Attempt.objects.filter(task_id=task.id).count() == 4
    assert [e.payload["attempt"] for e in Event.objects.filter(event_type="task.claimed")] == [
        1,
        2,
        3,
        4,
    ]


def _outcome(orch, run, outcome):
    """Claim (lease 30 s at at(1)), go running, then apply ``outcome`` at at(5)."""
    task = orch.enqueue_task(run_id=run.id, kind="k", max_attempts=3, now=at(0))
    orch.enqueue_task(run_id=run.id, kind="other", not_before=at(10_000), now=at(0))
    c = claim(orch, now=at(1))
    lease = {"task_id": task.id, "lease_id": c.lease.id, "worker_id": "w1"}
    orch.mark_task_running(**lease, now=at(2))
    when = at(5)
    if outcome == "completed":
        orch.complete_task(**lease, output={"ok": 1}, now=when)
    elif outcome == "failed":
        orch.fail_task(**lease, error="boom", now=when)
    elif outcome == "failed_retry":
        orch.fail_task(**lease, error="boom", retry=True, now=when)
    elif outcome == "expired":
        when = at(40)
        orch.expire_leases(now=when)
    elif outcome == "released":
        orch.release_task(**lease, reason="bye", now=when)
    elif outcome == "paused":
        orch.pause_task(**lease, status="waiting_input", now=when)
    elif outcome == "cancelled":
        orch.cancel_run(run_id=run.id, now=when)
    else:
        raise AssertionError(outcome)
    return c, when


@pytest.mark.parametrize(
    ("outcome", "attempt_status", "lease_status"),
    [
        ("completed", "completed", "released"),
        ("failed", "failed", "released"),
        ("failed_retry", "failed", "released"),
        ("expired", "expired", "expired"),
        ("released", "released", "released"),
        ("paused", "released", "released"),
        ("cancelled", "cancelled", "cancelled"),
    ],
)
def test_attempt_and_lease_rows_after_each_outcome(
    orch, run, outcome, attempt_status, lease_status
):
    c, when = _outcome(orch, run, outcome)

    attempt = Attempt.objects.get(pk=c.attempt.id)
    lease = Lease.objects.get(pk=c.lease.id)
    assert attempt.status == attempt_status
    assert attempt.ended_at == when
    assert attempt.started_at == at(2)
    assert attempt.leased_at == at(1)
    assert lease.status == lease_status
    assert lease.released_at == when
    assert lease.acquired_at == at(1)


def test_attempt_and_lease_rows_while_the_task_is_held(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    c = claim(orch, now=at(1))
    assert Attempt.objects.get(pk=c.attempt.id).status == "leased"
    assert Lease.objects.get(pk=c.lease.id).status == "active"

    orch.mark_task_running(task_id=task.id, lease_id=c.lease.id, worker_id="w1", now=at(2))

    attempt = Attempt.objects.get(pk=c.attempt.id)
    lease = Lease.objects.get(pk=c.lease.id)
    assert (attempt.status, attempt.ended_at) == ("running", None)
    assert (lease.status, lease.released_at) == ("active", None)


def test_each_attempt_keeps_its_own_outcome(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", max_attempts=5, now=at(0))
    c1 = orch.claim_next_task(worker_id="w1", lease_ms=1_000, now=at(1))
    orch.fail_task(
        task_id=task.id, lease_id=c1.lease.id, worker_id="w1", error="e1", retry=True, now=at(1)
    )
    c2 = orch.claim_next_task(worker_id="w2", lease_ms=1_000, now=at(2))
    orch.expire_leases(now=at(4))
    c3 = orch.claim_next_task(worker_id="w3", lease_ms=1_000, now=at(5))
    orch.complete_task(task_id=task.id, lease_id=c3.lease.id, worker_id="w3", now=at(5))

    rows = {a.id: (a.worker_id, a.status) for a in Attempt.objects.filter(task_id=task.id)}
    assert rows == {
        c1.attempt.id: ("w1", "failed"),
        c2.attempt.id: ("w2", "expired"),
        c3.attempt.id: ("w3", "completed"),
    }
    assert Attempt.objects.get(pk=c1.attempt.id).error == "e1"
    leases = {lease.id: lease.status for lease in Lease.objects.filter(task_id=task.id)}
    assert leases == {c1.lease.id: "released", c2.lease.id: "expired", c3.lease.id: "released"}

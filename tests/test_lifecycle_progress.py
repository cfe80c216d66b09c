"""Lifecycle extensions: report_progress."""

from __future__ import annotations

import math

import pytest

from parallel_mcp.exceptions import LeaseConflictError, LeaseExpiredError, ValidationError
from parallel_mcp.models import Event, Task
from tests.conftest import at

pytestmark = pytest.mark.django_db


def lease_of(c, worker="w1") -> dict:
    return {"task_id": c.task.id, "lease_id": c.lease.id, "worker_id": worker}


@pytest.fixture
def leased(orch, run):
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    return orch.claim_next_task(worker_id="w1", lease_ms=10_000, now=at(1))


def progress_events(run) -> list[Event]:
    return list(Event.objects.filter(run_id=run.id, event_type="task.progress").order_by("id"))


@pytest.mark.parametrize(
    "bad", [-0.1, 1.1, "x", "0.5", True, False, None, math.nan, math.inf, [0.5]]
)
def test_report_progress_refuses_values_outside_0_to_1(orch, run, leased, bad):
    orch.report_progress(**lease_of(leased), progress=0.25, now=at(2))
    with pytest.raises(ValidationError) as info:
        orch.report_progress(**lease_of(leased), progress=bad, now=at(3))
    assert info.value.details.get("field") == "progress"
    assert Task.objects.get(pk=leased.task.id).progress == 0.25
    assert len(progress_events(run)) == 1


@pytest.mark.parametrize("value", [0, 0.0, 0.5, 1, 1.0])
def test_report_progress_accepts_the_bounds(orch, run, leased, value):
    task = orch.report_progress(**lease_of(leased), progress=value, now=at(2))
    assert task.progress == float(value)
    assert Task.objects.get(pk=leased.task.id).progress == float(value)


def test_report_progress_records_an_event_with_the_message(orch, run, leased):
    orch.report_progress(**lease_of(leased), progress=0.3, message="a third", now=at(2))
    orch.mark_task_running(**lease_of(leased), now=at(3))
    task = orch.report_progress(**lease_of(leased), progress=0.6, now=at(4))

    assert task.progress == 0.6
    first, second = progress_events(run)
    assert first.task_id == leased.task.id
    assert first.attempt_id == leased.lease.id
    assert first.payload["progress"] == 0.3
    assert first.payload["message"] == "a third"
    assert first.payload["worker_id"] == "w1"
    assert first.created_at == at(2)
    assert second.payload["progress"] == 0.6
    assert second.payload["message"] is None
    stored = Task.objects.get(pk=leased.task.id)
    assert stored.status == "running"
    # Progress does not extend the lease.
    assert stored.lease_expires_at == at(11)


def test_progress_may_go_down(orch, run, leased):
    orch.report_progress(**lease_of(leased), progress=0.8, now=at(2))
    orch.report_progress(**lease_of(leased), progress=0.1, message="restarted", now=at(3))
    assert Task.objects.get(pk=leased.task.id).progress == 0.1


def test_complete_sets_progress_to_one_without_a_progress_event(orch, run, leased):
    orch.report_progress(**lease_of(leased), progress=0.4, now=at(2))
    task = orch.complete_task(**lease_of(leased), output={"ok": True}, now=at(3))
    assert task.progress == 1.0
    assert Task.objects.get(pk=leased.task.id).progress == 1.0
    assert len(progress_events(run)) == 1


def test_complete_without_any_report_sets_progress_to_one(orch, run, leased):
    orch.complete_task(**lease_of(leased), now=at(3))
    assert Task.objects.get(pk=leased.task.id).progress == 1.0
    assert progress_events(run) == []


def test_a_stale_lease_cannot_report_progress(orch, run, leased):
    orch.report_progress(**lease_of(leased), progress=0.2, now=at(2))
    orch.expire_leases(now=at(20))
    fresh = orch.claim_next_task(worker_id="w2", now=at(21))
    assert fresh is not None and fresh.task.id == leased.task.id

    with pytest.raises(LeaseConflictError):
        orch.report_progress(**lease_of(leased), progress=0.9, now=at(22))

    orch.report_progress(**lease_of(fresh, "w2"), progress=0.5, now=at(23))
    assert Task.objects.get(pk=leased.task.id).progress == 0.5
    assert [e.payload["worker_id"] for e in progress_events(run)] == ["w1", "w2"]


def test_report_progress_after_the_task_finished_or_by_another_worker(orch, run, leased):
    with pytest.raises(LeaseConflictError):
        orch.report_progress(
            task_id=leased.task.id,
            lease_id=leased.lease.id,
            worker_id="w2",
            progress=0.5,
            now=at(2),
        )
    orch.complete_task(**lease_of(leased), now=at(3))
    with pytest.raises(LeaseConflictError):
        orch.report_progress(**lease_of(leased), progress=0.5, now=at(4))
    assert progress_events(run) == []


def test_report_progress_on_an_expired_but_unswept_lease(orch, run, leased):
    with pytest.raises(LeaseExpiredError):
        orch.report_progress(**lease_of(leased), progress=0.5, now=at(12))
    # Strict expiry: exactly at the expiry time the lease is still valid.
    orch.report_progress(**lease_of(leased), progress=0.5, now=at(11))
    assert Task.objects.get(pk=leased.task.id).progress == 0.5


def test_report_progress_on_a_paused_task_is_refused(orch, run, leased):
    orch.pause_task(**lease_of(leased), status="waiting_input", now=at(2))
    with pytest.raises(LeaseConflictError):
        orch.report_progress(**lease_of(leased), progress=0.5, now=at(3))

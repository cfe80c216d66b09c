"""Operator actions record why (and, from the admin and API, who) in their events."""

from __future__ import annotations

import pytest

from parallel_mcp.exceptions import ValidationError
from parallel_mcp.models import Event
from tests.conftest import at, claim


def test_copy_run_records_its_reason_on_the_copy(orch, run):
    copy = orch.copy_run(run_id=run.id, reason="admin: alice", now=at(1))
    created = Event.objects.get(run_id=copy.id, event_type="run.created")
    assert created.payload["reason"] == "admin: alice"
    assert created.payload["source_run_id"] == str(run.id)


def test_resume_task_records_its_reason(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    c = claim(orch, now=at(1))
    orch.pause_task(
        task_id=task.id, lease_id=c.lease.id, worker_id="w1", status="waiting_input", now=at(2)
    )
    orch.resume_task(task_id=task.id, input={"answer": 42}, reason="admin: bob", now=at(3))
    resumed = Event.objects.get(task_id=task.id, event_type="task.resumed")
    assert resumed.payload == {
        "from": "waiting_input",
        "input_replaced": True,
        "reason": "admin: bob",
    }
    assert orch.get_task(task_id=task.id).input == {"answer": 42}


@pytest.mark.parametrize("reason", ["", "x" * 10_001, 5])
def test_bad_reasons_are_refused(orch, run, reason):
    with pytest.raises(ValidationError):
        orch.copy_run(run_id=run.id, reason=reason)

"""pmcp_status --stuck: tasks still heart-beating but running past their limit."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone


def status(*args: str) -> str:
    out = io.StringIO()
    call_command("pmcp_status", *args, stdout=out)
    return out.getvalue()


def test_stuck_lists_a_task_running_past_the_threshold(orch, run, settings):
    settings.PARALLEL_MCP = {**settings.PARALLEL_MCP, "MAX_LEASE_MS": 4 * 3600 * 1000}
    started = timezone.now() - timedelta(hours=1)
    wedged = orch.enqueue_task(run_id=run.id, kind="wedged", key="wedged", now=started)
    orch.enqueue_task(run_id=run.id, kind="fresh", key="fresh", priority=-1, now=started)
    claim = orch.claim_next_task(worker_id="w1", lease_ms=3 * 3600 * 1000, now=started)
    orch.mark_task_running(task_id=wedged.id, lease_id=claim.lease.id, worker_id="w1", now=started)
    orch.claim_next_task(worker_id="w2", lease_ms=3 * 3600 * 1000)  # just started

    text = status("--stuck", "--longer-than", "30m")
    assert "wedged" in text and "running for" in text
    assert "fresh" not in text
    assert status("--stuck", "--longer-than", "2h").strip() == "no stuck tasks"


def test_stuck_uses_the_tasks_own_timeout(orch, run):
    started = timezone.now() - timedelta(minutes=5)
    orch.enqueue_task(run_id=run.id, kind="slow", key="slow", timeout_ms=60_000, now=started)
    orch.claim_next_task(worker_id="w1", lease_ms=3600 * 1000, now=started)
    assert "slow" in status("--stuck")


def test_stuck_lists_a_lapsed_lease_that_nothing_expired(orch, run):
    lapsed_at = timezone.now() - timedelta(minutes=2)
    dead = orch.enqueue_task(run_id=run.id, kind="orphan", key="orphan")
    orch.claim_next_task(
        worker_id="killed-9", lease_ms=60_000, now=lapsed_at - timedelta(minutes=1)
    )
    text = status("--stuck")
    assert "Lapsed leases not expired yet (1)" in text
    assert "orphan" in text
    assert f"run {run.id}, worker 'killed-9', lease lapsed at {lapsed_at.isoformat()}" in text
    assert "pmcp_expire_leases" in text
    # pmcp_status RUN says it under the task.
    assert "That lease has lapsed" in status(str(run.id))
    orch.expire_leases()
    assert orch.get_task(task_id=dead.id).status == "queued"
    assert status("--stuck").strip() == "no stuck tasks"


@pytest.mark.parametrize(
    "args",
    [["--longer-than", "5m"], ["--stuck", "--longer-than", "soon"], ["--stuck", "abc"]],
)
def test_stuck_option_errors(db, args):
    with pytest.raises(CommandError):
        status(*args)

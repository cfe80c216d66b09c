"""Lifecycle extensions: optional and required dependencies."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from parallel_mcp.exceptions import InvalidDependencyError, ValidationError
from parallel_mcp.models import Run, Task, TaskDependency
from tests.conftest import at, live_worker

pytestmark = pytest.mark.django_db


def lease_of(c, worker="w1") -> dict:
    return {"task_id": c.task.id, "lease_id": c.lease.id, "worker_id": worker}


def enqueue(orch, run, kind, **kwargs):
    kwargs.setdefault("now", at(0))
    return orch.enqueue_task(run_id=run.id, kind=kind, **kwargs)


def take(orch, task, worker="w1", now=None):
    c = orch.claim_next_task(worker_id=worker, kinds=[task.kind], now=now or at(1))
    assert c is not None and c.task.id == task.id
    return c


def finish(orch, task, outcome, now=None):
    now = now or at(1)
    if outcome == "cancelled":
        orch.cancel_task(task_id=task.id, now=now)
        return
    c = take(orch, task, now=now)
    if outcome == "completed":
        orch.complete_task(**lease_of(c), now=now)
    else:
        orch.fail_task(**lease_of(c), error="boom", now=now)


def can_claim(orch, task, now) -> bool:
    c = orch.claim_next_task(worker_id="probe", kinds=[task.kind], now=now)
    if c is None:
        return False
    assert c.task.id == task.id
    orch.release_task(**lease_of(c, "probe"), now=now)
    return True


def counters(run) -> dict:
    stored = Run.objects.get(pk=run.id)
    return {
        "status": stored.status,
        "active": stored.tasks_active,
        "stuck": stored.tasks_stuck,
    }


def optional(task) -> dict:
    return {"task_id": task.id, "required": False}


@pytest.mark.parametrize("outcome", ["completed", "failed", "cancelled"])
def test_an_optional_dependency_is_satisfied_by_any_terminal_state(orch, run, outcome):
    live_worker("b")
    a = enqueue(orch, run, "a")
    b = enqueue(orch, run, "b", depends_on=[optional(a)])
    assert not can_claim(orch, b, at(1))
    [blocker] = orch.explain_task(task_id=b.id, now=at(1))
    assert blocker.kind == "dependency_pending" and blocker.task_id == a.id

    finish(orch, a, outcome, now=at(2))

    assert orch.explain_task(task_id=b.id, now=at(3)) == []
    assert can_claim(orch, b, at(3))
    assert counters(run)["stuck"] == 0
    assert counters(run)["status"] == "active"
    c = take(orch, b, now=at(4))
    orch.complete_task(**lease_of(c), now=at(5))
    expected = {"completed": "completed", "failed": "failed", "cancelled": "completed"}[outcome]
    assert orch.get_run(run_id=run.id).status == expected


@pytest.mark.parametrize("outcome", ["failed", "cancelled"])
def test_a_required_dependency_is_satisfied_only_by_completed(orch, run, outcome):
    a = enqueue(orch, run, "a")
    b = enqueue(orch, run, "b", depends_on=[a.id])

    finish(orch, a, outcome, now=at(2))

    assert not can_claim(orch, b, at(3))
    [blocker] = orch.explain_task(task_id=b.id, now=at(3))
    assert blocker.kind == "dependency_failed"
    assert blocker.task_id == a.id
    assert str(a.id) in blocker.message and outcome in blocker.message
    assert counters(run) == {"status": "failed", "active": 0, "stuck": 1}


def test_a_required_dependency_completed_releases_the_dependent(orch, run):
    live_worker("b")
    a = enqueue(orch, run, "a")
    b = enqueue(orch, run, "b", depends_on=[a.id])
    [blocker] = orch.explain_task(task_id=b.id, now=at(1))
    assert blocker.kind == "dependency_pending"
    assert str(a.id) in blocker.message
    finish(orch, a, "completed", now=at(2))
    assert orch.explain_task(task_id=b.id, now=at(3)) == []
    assert can_claim(orch, b, at(3))


def test_a_task_with_an_optional_dependency_on_a_stuck_task_is_stuck(orch, run):
    a = enqueue(orch, run, "a")
    b = enqueue(orch, run, "b", depends_on=[a.id])
    c = enqueue(orch, run, "c", depends_on=[optional(b)])
    keep = enqueue(orch, run, "keep")

    finish(orch, a, "failed", now=at(2))

    assert counters(run) == {"status": "active", "active": 1, "stuck": 2}
    assert not can_claim(orch, c, at(3))
    [blocker] = orch.explain_task(task_id=c.id, now=at(3))
    assert blocker.kind == "dependency_failed"
    assert blocker.task_id == b.id
    assert str(b.id) in blocker.message
    finish(orch, keep, "completed", now=at(4))
    assert counters(run) == {"status": "failed", "active": 0, "stuck": 2}

    orch.retry_task(task_id=a.id, now=at(5))
    assert counters(run) == {"status": "active", "active": 3, "stuck": 0}
    [blocker] = orch.explain_task(task_id=c.id, now=at(6))
    assert blocker.kind == "dependency_pending" and blocker.task_id == b.id


def test_mixed_required_and_optional_edges(orch, run):
    live_worker("c")
    a = enqueue(orch, run, "a")
    b = enqueue(orch, run, "b")
    c = enqueue(orch, run, "c", depends_on=[a.id, optional(b)])
    finish(orch, b, "failed", now=at(1))
    [blocker] = orch.explain_task(task_id=c.id, now=at(2))
    assert (blocker.kind, blocker.task_id) == ("dependency_pending", a.id)
    finish(orch, a, "completed", now=at(3))
    assert orch.explain_task(task_id=c.id, now=at(4)) == []
    assert can_claim(orch, c, at(4))


def test_explain_lists_every_unsatisfied_dependency(orch, run):
    a = enqueue(orch, run, "a")
    b = enqueue(orch, run, "b")
    x = enqueue(orch, run, "x")
    c = enqueue(orch, run, "c", depends_on=[a.id, optional(b), x.id])
    finish(orch, x, "failed", now=at(1))
    blockers = orch.explain_task(task_id=c.id, now=at(2))
    assert {(blocker.kind, blocker.task_id) for blocker in blockers} == {
        ("dependency_pending", a.id),
        ("dependency_pending", b.id),
        ("dependency_failed", x.id),
    }


@pytest.mark.parametrize("outcome", ["completed", "failed", "cancelled"])
def test_enqueueing_onto_an_already_terminal_dependency(orch, run, outcome):
    a = enqueue(orch, run, "a")
    keep = enqueue(orch, run, "keep")  # keeps the run from becoming terminal
    finish(orch, a, outcome, now=at(1))

    req = enqueue(orch, run, "req", depends_on=[a.id], now=at(2))
    opt = enqueue(orch, run, "opt", depends_on=[optional(a)], now=at(2))

    assert can_claim(orch, opt, at(3))
    assert can_claim(orch, req, at(3)) is (outcome == "completed")
    assert counters(run)["stuck"] == (0 if outcome == "completed" else 1)
    assert keep.status == "queued"


def test_dependency_edges_record_the_required_flag(orch, run):
    a = enqueue(orch, run, "a")
    b = enqueue(orch, run, "b")
    c = enqueue(
        orch, run, "c", depends_on=[{"task_id": a.id}, {"task_id": str(b.id), "required": False}]
    )
    edges = dict(
        TaskDependency.objects.filter(task_id=c.id).values_list("depends_on_id", "required")
    )
    assert edges == {a.id: True, b.id: False}
    assert orch.get_task(task_id=c.id).depends_on_task_ids == [a.id, b.id]
    assert Task.objects.get(pk=c.id).unmet_dependencies == 2


@pytest.mark.parametrize(
    ("entry", "error"),
    [
        ({"task_id": "A", "required": "no"}, ValidationError),
        ({"task_id": "A", "optional": True}, ValidationError),
        ({"required": False}, ValidationError),
        ({"task_id": "not-a-uuid", "required": False}, InvalidDependencyError),
    ],
)
def test_bad_dependency_entries_are_refused(orch, run, entry, error):
    a = enqueue(orch, run, "a")
    entry = {key: (str(a.id) if value == "A" else value) for key, value in entry.items()}
    with pytest.raises(error):
        enqueue(orch, run, "b", depends_on=[entry])
    assert Task.objects.filter(run_id=run.id).count() == 1


def test_a_mapping_of_task_ids_is_not_a_list_of_them(orch, run):
    """Any iterable is a list but a string or a mapping: a mapping's keys are not taken for
    dependencies, whatever kind of mapping it is."""
    a = enqueue(orch, run, "a")
    with pytest.raises(ValidationError, match="depends_on must be a list"):
        enqueue(orch, run, "b", depends_on=MappingProxyType({str(a.id): True}))
    assert enqueue(orch, run, "c", depends_on=(a.id for _ in [1])).unmet_dependencies == 1
    assert Task.objects.filter(run_id=run.id).count() == 2


def test_the_same_dependency_twice_once_optional_is_refused(orch, run):
    a = enqueue(orch, run, "a")
    with pytest.raises(InvalidDependencyError):
        enqueue(orch, run, "b", depends_on=[a.id, optional(a)])
    assert Task.objects.filter(run_id=run.id).count() == 1

"""Client tokens: replayed claims and outcomes are answered from the record, never re-applied."""

from __future__ import annotations

import pytest
from django.db import connection, connections

from parallel_mcp.exceptions import IdempotencyConflictError, LeaseConflictError, ValidationError
from parallel_mcp.models import (
    Attempt,
    ClientTokenRecord,
    ContextSnapshot,
    Event,
    Lease,
    Run,
    Task,
)
from tests.conftest import at, claim, event_types

pytestmark = pytest.mark.django_db


def row_counts() -> dict[str, int]:
    models = (Run, Task, Attempt, Lease, ContextSnapshot, Event, ClientTokenRecord)
    return {model.__name__: model.objects.count() for model in models}


def lease_of(c, worker="w1") -> dict:
    return {"task_id": c.task.id, "lease_id": c.lease.id, "worker_id": worker}


def count_of(orch, run_id, event_type: str) -> int:
    return event_types(orch, run_id).count(event_type)


# -- claim_next_task --------------------------------------------------------------------------


def test_a_replayed_claim_returns_the_same_lease_without_a_second_attempt(orch, run):
    first_task = orch.enqueue_task(run_id=run.id, kind="k", priority=1, now=at(0))
    second_task = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    first = claim(orch, client_token="tok-1", now=at(1))
    before = row_counts()

    again = claim(orch, client_token="tok-1", now=at(2))

    assert again.lease.id == first.lease.id
    assert again.attempt.id == first.attempt.id
    assert again.task.id == first_task.id
    assert again.run.id == run.id
    assert again.lease.client_token == "tok-1"
    assert again.task.attempt_count == 1
    assert row_counts() == before
    assert count_of(orch, run.id, "task.claimed") == 1
    assert orch.get_task(task_id=second_task.id).status == "queued"


def test_a_replayed_claim_does_not_extend_the_lease(orch, run):
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    first = orch.claim_next_task(worker_id="w1", lease_ms=10_000, client_token="t", now=at(1))

    again = orch.claim_next_task(worker_id="w1", lease_ms=10_000, client_token="t", now=at(5))

    assert again.lease.expires_at == first.lease.expires_at == at(11)


def test_a_claim_token_replays_the_same_lease_even_after_release(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    first = claim(orch, client_token="tok-a", now=at(1))
    orch.release_task(**lease_of(first), now=at(2))
    before = row_counts()

    again = claim(orch, client_token="tok-a", now=at(3))

    assert again.lease.id == first.lease.id
    assert again.task.id == task.id
    assert again.task.status == "queued"
    assert again.lease.status == "released"
    assert row_counts() == before


def test_a_claim_that_found_nothing_does_not_use_up_the_token(orch, run):
    assert claim(orch, client_token="early", now=at(1)) is None
    task = orch.enqueue_task(run_id=run.id, kind="k", now=at(2))

    c = claim(orch, client_token="early", now=at(3))

    assert c.task.id == task.id
    assert claim(orch, client_token="early", now=at(4)).lease.id == c.lease.id


def test_different_tokens_make_different_claims(orch, run):
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))

    a = claim(orch, client_token="a", now=at(1))
    b = claim(orch, client_token="b", now=at(1))

    assert a.task.id != b.task.id
    assert a.lease.id != b.lease.id


def test_a_claim_token_reused_by_another_worker_is_a_conflict(orch, run):
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    claim(orch, "w1", client_token="shared", now=at(1))
    before = row_counts()

    with pytest.raises(IdempotencyConflictError):
        claim(orch, "w2", client_token="shared", now=at(2))

    assert row_counts() == before


def test_an_empty_client_token_is_refused(orch, run):
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    with pytest.raises(ValidationError):
        claim(orch, client_token="", now=at(1))


# -- complete_task ----------------------------------------------------------------------------


def test_a_replayed_completion_returns_the_recorded_result_without_reapplying(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    c = claim(orch, now=at(1))
    first = orch.complete_task(**lease_of(c), output={"n": 1}, client_token="done-1", now=at(2))
    before = row_counts()

    again = orch.complete_task(
        **lease_of(c),
        output={"n": 2},
        next_context={"should": "not be written"},
        client_token="done-1",
        now=at(3),
    )

    assert again.id == first.id == task.id
    assert again.status == "completed"
    assert again.output == {"n": 1}
    assert row_counts() == before
    stored = orch.get_task(task_id=task.id)
    assert stored.output == {"n": 1}
    assert stored.completed_at == at(2)
    assert Attempt.objects.get(pk=c.attempt.id).output == {"n": 1}
    assert count_of(orch, run.id, "task.completed") == 1


def test_a_completion_token_reused_for_another_task_is_a_conflict(orch, run):
    first = orch.enqueue_task(run_id=run.id, kind="k", priority=1, now=at(0))
    second = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    c1 = claim(orch, now=at(1))
    c2 = claim(orch, now=at(1))
    orch.complete_task(**lease_of(c1), client_token="dup", now=at(2))
    before = row_counts()

    with pytest.raises(IdempotencyConflictError):
        orch.complete_task(**lease_of(c2), client_token="dup", now=at(3))

    assert c1.task.id == first.id
    assert row_counts() == before
    assert orch.get_task(task_id=second.id).status == "leased"


def test_a_completion_token_reused_to_fail_the_same_task_is_a_conflict(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    c = claim(orch, now=at(1))
    orch.complete_task(**lease_of(c), client_token="outcome", now=at(2))
    before = row_counts()

    with pytest.raises(IdempotencyConflictError):
        orch.fail_task(**lease_of(c), error="bad", client_token="outcome", now=at(3))

    assert row_counts() == before
    assert orch.get_task(task_id=task.id).status == "completed"


def test_a_completion_that_raised_does_not_use_up_its_token(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    c = claim(orch, now=at(1))
    with pytest.raises(LeaseConflictError):
        orch.complete_task(
            task_id=task.id, lease_id=c.lease.id, worker_id="intruder", client_token="t", now=at(2)
        )
    assert ClientTokenRecord.objects.count() == 0

    result = orch.complete_task(**lease_of(c), output="ok", client_token="t", now=at(3))

    assert result.status == "completed"
    assert orch.get_task(task_id=task.id).output == "ok"


# -- fail_task --------------------------------------------------------------------------------


def test_a_replayed_failure_returns_the_recorded_result_without_reapplying(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", max_attempts=3, now=at(0))
    c = claim(orch, now=at(1))
    first = orch.fail_task(**lease_of(c), error="fatal", client_token="fail-1", now=at(2))
    before = row_counts()

    again = orch.fail_task(**lease_of(c), error="other", client_token="fail-1", now=at(3))

    assert again.id == first.id == task.id
    assert again.status == "failed"
    assert again.error == "fatal"
    assert row_counts() == before
    assert orch.get_task(task_id=task.id).completed_at == at(2)
    assert count_of(orch, run.id, "task.failed") == 1


def test_a_replayed_retrying_failure_schedules_only_one_retry(orch, run):
    task = orch.enqueue_task(
        run_id=run.id, kind="k", max_attempts=3, retry={"delay_ms": 1_000}, now=at(0)
    )
    c = claim(orch, now=at(1))
    orch.fail_task(**lease_of(c), error="flaky", retry=True, client_token="f", now=at(2))
    before = row_counts()

    again = orch.fail_task(**lease_of(c), error="flaky", retry=True, client_token="f", now=at(5))

    assert again.id == task.id
    assert row_counts() == before
    stored = orch.get_task(task_id=task.id)
    assert stored.status == "queued"
    assert stored.attempt_count == 1
    assert stored.not_before == at(3)
    assert count_of(orch, run.id, "task.retry_scheduled") == 1


def test_a_replayed_failure_does_not_touch_the_next_attempt(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", max_attempts=3, now=at(0))
    c1 = claim(orch, "w1", now=at(1))
    orch.fail_task(**lease_of(c1), error="flaky", retry=True, client_token="f", now=at(2))
    c2 = claim(orch, "w2", now=at(3))
    before = row_counts()

    orch.fail_task(**lease_of(c1), error="flaky", retry=True, client_token="f", now=at(4))

    assert row_counts() == before
    stored = orch.get_task(task_id=task.id)
    assert (stored.status, stored.lease_id, stored.leased_by) == ("leased", c2.lease.id, "w2")
    assert Lease.objects.get(pk=c2.lease.id).status == "active"


def test_a_failure_token_reused_for_another_task_is_a_conflict(orch, run):
    orch.enqueue_task(run_id=run.id, kind="k", priority=1, now=at(0))
    second = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    c1 = claim(orch, now=at(1))
    c2 = claim(orch, now=at(1))
    orch.fail_task(**lease_of(c1), error="x", client_token="dup", now=at(2))
    before = row_counts()

    with pytest.raises(IdempotencyConflictError):
        orch.fail_task(**lease_of(c2), error="x", client_token="dup", now=at(3))

    assert row_counts() == before
    assert orch.get_task(task_id=second.id).status == "leased"


def test_a_failure_token_reused_to_complete_the_same_task_is_a_conflict(orch, run):
    task = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    c = claim(orch, now=at(1))
    orch.fail_task(**lease_of(c), error="x", retry=True, client_token="outcome", now=at(2))
    c2 = claim(orch, now=at(3))
    before = row_counts()

    with pytest.raises(IdempotencyConflictError):
        orch.complete_task(**lease_of(c2), client_token="outcome", now=at(4))

    assert row_counts() == before
    assert orch.get_task(task_id=task.id).status == "leased"


def test_a_completion_token_used_before_a_re_execution_replays_instead_of_completing_again(
    orch, run
):
    """The token was recorded by the first completion: the same token on the re-executed
    task's new lease is that call again, answered from the record (one rule on both
    databases: only a token this write records lets its item through)."""
    task = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    first = claim(orch, now=at(1))
    orch.complete_task(**lease_of(first), output={"n": 1}, client_token="done", now=at(2))
    orch.retry_task(task_id=task.id, now=at(3))
    second = claim(orch, now=at(4))
    assert second.task.id == task.id
    before = count_of(orch, run.id, "task.completed")
    replayed = orch.complete_task(
        **lease_of(second), output={"n": 2}, client_token="done", now=at(5)
    )
    assert replayed.id == task.id
    assert orch.get_task(task_id=task.id).status == second.task.status  # not completed again
    assert count_of(orch, run.id, "task.completed") == before
    assert ClientTokenRecord.objects.filter(token="done").count() == 1


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite's writers are serial")
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("cycle", [False, True], ids=["claim", "cycle"])
def test_twin_claims_with_one_token_take_one_claim_between_them(cycle):
    """Two claims sent at once with one client token (a worker's retry racing its first try)
    wait for the token's lock in their write's first statement: the later one's claim then
    sees the earlier one's leases and replays them (services/claim.py, ``token_lock``)."""
    import threading

    from parallel_mcp import Orchestrator
    from parallel_mcp.services import complete_and_claim
    from parallel_mcp.services.claim import TOKEN_LOCK_NAMESPACE
    from tests.run_lock_support import held
    from tests.workers import wait_until

    orch = Orchestrator()
    run = orch.create_run()
    for _ in range(3):
        orch.enqueue_task(run_id=run.id, kind="k")
    leases: list[object] = []

    def twin() -> None:
        try:
            if cycle:
                _, claims = complete_and_claim(
                    using="default", worker_id="w", items=[], limit=1, lease_ms=60_000,
                    client_token="twin", start=True,
                )  # fmt: skip
            else:
                claims = [orch.claim_next_task(worker_id="w", client_token="twin")]
            leases.extend(claim.lease.id for claim in claims)
        finally:
            connections.close_all()

    def take() -> None:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_advisory_xact_lock(%s, hashtext(%s))", [TOKEN_LOCK_NAMESPACE, "twin"]
            )

    def waiting() -> int:
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT COUNT(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database() AND pid <> pg_backend_pid()"
            )
            return cursor.fetchone()[0]

    with held(take):
        threads = [threading.Thread(target=twin, daemon=True) for _ in range(2)]
        for thread in threads:
            thread.start()
        wait_until(lambda: waiting() == 2, message="the twins did not both wait for the token")
    for thread in threads:
        thread.join(10)
    assert len(leases) == 2 and len(set(leases)) == 1, leases
    assert Lease.objects.count() == 1
    assert Task.objects.filter(status="queued").count() == 2

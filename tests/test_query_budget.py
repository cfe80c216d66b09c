"""Hot-path query counts and index use. The numbers here are quoted in docs/performance.md."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from parallel_mcp.models import Attempt, ClientTokenRecord, Lease, Task
from tests.conftest import assert_reads_the_claim_index_in_order, at, claim_query_plan

# Each count includes the transaction's two boundary statements (SAVEPOINT/RELEASE inside
# the test's transaction; BEGIN/COMMIT in production). Every write is static SQL on the write
# unit (services/write.py). On PostgreSQL the event fence (pg_advisory_xact_lock_shared) is a
# one-time filter of the event insert, not a statement of its own, and what a write sends with
# its flush (rows, deferred updates, run updates, NOTIFY, events) is one statement: data-
# modifying CTEs ending in the event insert (services/chain.py); SQLite sends them one by one.
#
# claim — SQLite: guarded UPDATE … RETURNING with the candidate subquery, run select, attempt
# insert (the attempt row holds its lease: models/leases.py), event insert. PostgreSQL: the
# update, the attempt insert and the run read are one statement (CTEs), the event insert
# another (the chain).
CLAIM = {"sqlite": 6, "postgresql": 4}
# a claim with a client token adds the token's check (SELECT of an attempt with it); on
# PostgreSQL the token's advisory lock instead, pipelined with the claim (no round trip of its
# own), the check being a CTE of the claim's statement. Outside a transaction the lock is
# taken by the write prelude's statement (claim.token_lock): no statement of its own.
CLAIM_TOKEN = {"sqlite": 7, "postgresql": 5}
# a batch claim — SQLite selects the candidates apart from the update; PostgreSQL does not.
BATCH_CLAIM = {"sqlite": 7, "postgresql": 4}
# running: fenced task update, attempt update, event insert (PostgreSQL: the last two chained).
RUNNING = {"sqlite": 5, "postgresql": 4}
# heartbeat: fenced task update, attempt update (its lease's expiry and heartbeat), event
# insert.
HEARTBEAT = {"sqlite": 5, "postgresql": 5}
# complete: the run read (on PostgreSQL: locked, before the task), fenced task update,
# attempt update, dependents update (on PostgreSQL with the NOTIFY that wakes idle
# workers in the same statement), run counters and status update, event insert. Inside a
# transaction (as here) a PostgreSQL completion locks its run like any write that locks a run
# (services/write.py): its writer lock rides in the statement that locks the run, and the
# fold of the run's delta rows is one statement more, pipelined with it (outside a
# transaction: COMPLETE_APART below). PostgreSQL chains the attempt, dependents, run and
# event writes into one statement.
COMPLETE = {"sqlite": 8, "postgresql": 6}
# client tokens on a completion: the tokens' insert (PostgreSQL: a CTE of the guarded update).
COMPLETE_TOKENS = {"sqlite": 1, "postgresql": 0}
# next_context: the snapshots' insert (PostgreSQL: in the chain).
NEXT_CONTEXT = {"sqlite": 1, "postgresql": 0}
# a worker's cycle (complete_and_claim): a completion with client tokens (COMPLETE + the
# tokens' insert) and a batch claim with its token in one transaction, so the boundaries, the
# run update and the event insert are shared: on SQLite the completion's run read
# stays and the claim reads the claimed tasks' runs (a batch claim: SQLite selects the
# candidates apart from the update). On PostgreSQL: the run locks, the fold, the guarded
# completion (with the tokens' insert), the claim token's lock, the claim (with the token's
# check), the chain.
CYCLE = {"sqlite": 14, "postgresql": 8}


def budget(counts: dict[str, int]) -> int:
    return counts[connection.vendor]


def test_claim_running_heartbeat_complete_query_counts(orch, run, django_assert_num_queries):
    first = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    orch.enqueue_task(run_id=run.id, kind="k", depends_on=[first.id], now=at(0))
    with django_assert_num_queries(budget(CLAIM)):
        claim = orch.claim_next_task(worker_id="w", now=at(1))
    ids = {"task_id": claim.task.id, "lease_id": claim.lease.id, "worker_id": "w"}
    with django_assert_num_queries(budget(RUNNING)):
        orch.mark_task_running(**ids, now=at(2))
    with django_assert_num_queries(budget(HEARTBEAT)):
        orch.heartbeat_lease(**ids, now=at(3))
    with django_assert_num_queries(budget(COMPLETE)):
        orch.complete_task(**ids, output={"ok": True}, now=at(4))


def test_the_worker_cycle_claims_into_running_and_completes_with_tokens(
    orch, run, django_assert_num_queries
):
    """What pmcp_worker sends per task: one claim straight into running (both events in
    one insert) and one completion with its client token (one more insert; on PostgreSQL in
    the guard's statement)."""
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))  # keeps the run's status as it is
    with django_assert_num_queries(budget(CLAIM_TOKEN)):
        claim = orch.claim_next_task(
            worker_id="w", kinds=["k"], client_token="c-1", start=True, now=at(1)
        )
    ids = {"task_id": claim.task.id, "lease_id": claim.lease.id, "worker_id": "w"}
    with django_assert_num_queries(budget(COMPLETE) + budget(COMPLETE_TOKENS)):
        orch.complete_task(**ids, client_token="d-1", now=at(2))


@pytest.mark.parametrize("size", [1, 10, 50])
def test_batches_cost_the_same_statements_whatever_their_size(
    orch, run, django_assert_num_queries, size
):
    """A batch claim costs the same whatever its size, and a batch completion the same as a
    single one (here it also finishes the run: its status moves in the counters' update)."""
    from parallel_mcp.services import complete_tasks

    for _ in range(size):
        orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    with django_assert_num_queries(budget(BATCH_CLAIM)):
        claims = orch.claim_next_tasks(worker_id="w", limit=size + 1, start=True, now=at(1))
    assert len(claims) == size
    items = [{"task_id": c.task.id, "lease_id": c.lease.id, "output": None} for c in claims]
    with django_assert_num_queries(budget(COMPLETE)):
        results = complete_tasks(using="default", worker_id="w", items=items, now=at(2))
    assert {result.status for result in results} == {"completed"}
    assert orch.get_run(run_id=run.id).status == "completed"


@pytest.mark.parametrize("size", [1, 8])
def test_completions_with_next_context_cost_at_most_one_statement_more_whatever_their_number(
    orch, run, django_assert_num_queries, size
):
    """The snapshots of a batch go in one INSERT with the flush, and the run's current
    snapshot moves in the run's counters update: one statement more than without on SQLite,
    none on PostgreSQL (the insert is chained)."""
    from parallel_mcp.models import ContextSnapshot
    from parallel_mcp.services import complete_tasks

    for _ in range(size + 1):
        orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    claims = orch.claim_next_tasks(worker_id="w", limit=size, start=True, now=at(1))
    items = [
        {"task_id": c.task.id, "lease_id": c.lease.id, "next_context": {"n": n}}
        for n, c in enumerate(claims)
    ]
    with django_assert_num_queries(budget(COMPLETE) + budget(NEXT_CONTEXT)):
        complete_tasks(using="default", worker_id="w", items=items, now=at(2))
    snapshots = list(ContextSnapshot.objects.filter(run_id=run.id).order_by("payload__n"))
    assert [snapshot.payload for snapshot in snapshots] == [{"n": n} for n in range(size)]
    # Each derives from the one before it; the last is the run's current one.
    assert [s.parent_snapshot_id for s in snapshots] == [None] + [s.id for s in snapshots[:-1]]
    assert orch.get_run(run_id=run.id).current_context_snapshot_id == snapshots[-1].id


@pytest.mark.parametrize("size", [1, 8])
def test_a_worker_cycle_costs_the_same_whatever_its_size(
    orch, run, django_assert_num_queries, size
):
    """What pmcp_worker sends per cycle: its slots' completions (each with its client token)
    and the claims for its free slots straight into running, in one transaction."""
    from parallel_mcp.services import complete_and_claim

    for _ in range(2 * size + 1):
        orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    claims = orch.claim_next_tasks(worker_id="w", limit=size, start=True, now=at(1))
    items = [
        {"task_id": c.task.id, "lease_id": c.lease.id, "client_token": f"done-{n}"}
        for n, c in enumerate(claims)
    ]
    with django_assert_num_queries(budget(CYCLE)):
        results, taken = complete_and_claim(
            using="default",
            worker_id="w",
            items=items,
            limit=size + 1,
            lease_ms=60_000,
            kinds=["k"],
            client_token="cycle",
            start=True,
            now=at(2),
        )
    assert results == [None] * size
    assert Task.objects.filter(status="completed").count() == size
    assert [c.task.status for c in taken] == ["running"] * (size + 1)


def test_a_claim_writes_its_attempts_and_leases_without_reading_the_tasks_again(orch, run):
    """PostgreSQL selects a claim's attempt rows (each holding its lease) from its own CTE,
    in the claim's statement; SQLite inserts them as values built from the rows its claim
    returned, with the flush: read back from pmcp_task (INSERT … SELECT, tokens numbered by a
    window) they cost a one-slot worker 8-12 % (bench/FINDINGS.md, "SQLite one-slot
    claims"). Nothing is written to pmcp_lease, a view of pmcp_attempt."""
    from parallel_mcp.services import complete_and_claim

    for _ in range(3):
        orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    with CaptureQueriesContext(connection) as captured:
        _, taken = complete_and_claim(
            using="default", worker_id="w", items=[], limit=2, lease_ms=60_000,
            client_token="cycle", start=True, now=at(1),
        )  # fmt: skip
    assert len(taken) == 2
    sent = [q["sql"] for q in captured.captured_queries]
    assert not [sql for sql in sent if "pmcp_lease" in sql]
    statements = [sql for sql in sent if "INSERT INTO pmcp_attempt " in sql]
    assert len(statements) == 1, statements
    if connection.vendor == "sqlite":
        assert statements[0].startswith("INSERT INTO pmcp_attempt (")
        assert " VALUES " in statements[0] and "SELECT" not in statements[0]
    else:
        assert "UPDATE pmcp_task" in statements[0]  # a CTE of the claim


def test_claim_cost_does_not_depend_on_backlog_size(orch, run, django_assert_num_queries):
    root = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    for _ in range(50):
        orch.enqueue_task(run_id=run.id, kind="k", depends_on=[root.id], now=at(0))
    with django_assert_num_queries(budget(CLAIM)):
        orch.claim_next_task(worker_id="w", now=at(1))


def _seed_backlog(run, *, ready: int, blocked: int) -> None:
    """Bulk rows: ``ready`` queued tasks and ``blocked`` ones waiting on a dependency."""
    rows = []
    for index in range(ready + blocked):
        rows.append(
            Task(
                run_id=run.id,
                kind="bulk",
                priority=index % 7,
                unmet_dependencies=0 if index < ready else 1,
                created_at=at(index),
                updated_at=at(index),
            )
        )
    Task.objects.bulk_create(rows, batch_size=2000)


def _plan(queryset) -> str:
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("ANALYZE pmcp_task")
        return queryset.explain()


def _plan_sql(sql: str, params: list) -> str:
    explain = "EXPLAIN QUERY PLAN " if connection.vendor == "sqlite" else "EXPLAIN "
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            cursor.execute("ANALYZE pmcp_task")
        cursor.execute(explain + sql, params or None)
        return "\n".join(" ".join(str(part) for part in row) for row in cursor.fetchall())


def test_a_client_token_is_looked_up_in_the_attempts_token_index(orch, run):
    """A lease's client token lives on its attempt row (models/leases.py): the claim's token
    check (claim.USED_SQL), the replay of a used token and a lease read by token (through the
    view pmcp_lease) each probe the attempts' partial unique index on the token, never scan."""
    from parallel_mcp.services.claim import USED_SQL

    task = orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    Attempt.objects.bulk_create(
        Attempt(
            run_id=run.id,
            task_id=task.id,
            worker_id="w",
            status="completed",
            leased_at=at(1),
            lease_expires_at=at(2),
            client_token=f"filler-{n}",
        )
        for n in range(20_000)  # not tiny: on a small table any scan is as cheap as probes
    )
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("ANALYZE pmcp_attempt")
    batch = [f"filler-7#{n}" for n in range(16)]  # what a batch claim's replay reads
    plans = [
        _plan_sql(USED_SQL, ["filler-7"]),
        Attempt.objects.filter(client_token__in=batch).explain(),
        Lease.objects.filter(client_token="filler-7").explain(),
    ]
    for plan in plans:
        assert "pmcp_attempt_client_token_uniq" in plan, plan
        assert "Seq Scan" not in plan and "SCAN pmcp_attempt" not in plan, plan


@pytest.mark.parametrize("blocked", [0, 3000])
def test_claim_picks_the_same_task_regardless_of_blocked_backlog(orch, run, blocked):
    _seed_backlog(run, ready=20, blocked=blocked)
    claim = orch.claim_next_task(worker_id="w", now=at(10_000) + timedelta(seconds=1))
    assert claim.task.priority == 6
    assert claim.task.unmet_dependencies == 0


@pytest.mark.parametrize("kinds", [None, ["bulk", "other"]])
def test_the_claim_query_uses_the_partial_claim_index(orch, run, kinds):
    _seed_backlog(run, ready=200, blocked=5000)
    assert_reads_the_claim_index_in_order(claim_query_plan(at(10_000), kinds))


# A partial index on a boolean column is usable only by queries that spell its predicate the
# way it was written when the index was created: Django 5.2 writes ``Q(flag=True)`` as a bare
# ``"flag"`` on SQLite, Django 6 as ``"flag" = 1``. Each Django's choice is played here.
@pytest.mark.parametrize("index_name", ["pmcp_task_claim_idx", "pmcp_task_dead_idx"])
def test_boolean_partial_index_predicates_are_the_same_under_every_django(monkeypatch, index_name):
    index = next(index for index in Task._meta.indexes if index.name == index_name)
    editor = connection.schema_editor(collect_sql=True)
    spellings = set()
    for bare_booleans in (True, False):
        monkeypatch.setattr(
            connection.ops,
            "conditional_expression_supported_in_where_clause",
            lambda expression, bare=bare_booleans: bare,
        )
        spellings.add(str(index.create_sql(Task, editor)))
    assert len(spellings) == 1, spellings


@pytest.mark.skipif(connection.vendor != "sqlite", reason="PostgreSQL proves predicates itself")
def test_the_static_claim_query_repeats_the_stored_claim_index_predicate(db):
    from parallel_mcp.services.claim import candidates_sql
    from parallel_mcp.services.dialect import dialect_for

    with connection.cursor() as cursor:
        cursor.execute("SELECT sql FROM sqlite_master WHERE name = 'pmcp_task_claim_idx'")
        (index_sql,) = cursor.fetchone()
    predicate = index_sql.split(" WHERE ", 1)[1]
    sql, _ = candidates_sql(dialect_for("default"), now=at(0), kinds=None)
    assert predicate in sql, (predicate, sql)


def test_the_dead_letter_listing_uses_the_partial_dead_index(orch, run):
    _seed_backlog(run, ready=5000, blocked=0)
    Task.objects.filter(pk__in=Task.objects.order_by("id").values("id")[:20]).update(
        dead=True, status="failed"
    )
    with CaptureQueriesContext(connection) as queries:
        assert len(orch.list_dead_tasks(limit=50)) == 20
    (listing,) = [query["sql"] for query in queries]
    plan = _plan_sql(listing, [])
    assert "pmcp_task_dead_idx" in plan, plan


def _task_reads(queries) -> list[str]:
    return [q["sql"] for q in queries if '"pmcp_task"' in q["sql"]]


def test_a_lease_expiry_pass_with_nothing_to_do_reads_two_small_indexes(orch, run):
    """Every local worker runs this pass every few seconds: a big ready queue costs it one
    look at the index of delayed tasks waiting for a slot and one at the lease-expiry index."""
    _seed_backlog(run, ready=5000, blocked=0)
    with CaptureQueriesContext(connection) as queries:
        assert orch.expire_leases().count == 0
    _assert_the_expiry_pass_reads_its_indexes(queries)


def test_a_lease_expiry_pass_reads_no_task_of_a_capped_run_that_waits_undelayed(orch, run):
    _seed_backlog(run, ready=5000, blocked=0)
    capped = orch.create_run(namespace="capped", max_parallel=1)
    orch.enqueue_tasks(run_id=capped.id, tasks=[{"kind": "k"} for _ in range(500)])
    orch.claim_next_task(worker_id="w")  # the capped run is active, its slot taken
    with CaptureQueriesContext(connection) as queries:
        assert orch.expire_leases().count == 0
    _assert_the_expiry_pass_reads_its_indexes(queries)


def _assert_the_expiry_pass_reads_its_indexes(queries) -> None:
    delayed, lapsed = _task_reads(queries)
    assert "not_before" in delayed and "lease_expires_at" in lapsed
    for query, index in (
        (delayed, "pmcp_task_slot_delayed_idx"),
        (lapsed, "pmcp_task_lease_expiry_idx"),
    ):
        plan = _plan_sql(query, [])
        assert index in plan, plan
        assert "Seq Scan on pmcp_task" not in plan and "SCAN pmcp_task" not in plan, plan


# enqueue_task (one task, no dependencies), the same write as a batch: BEGIN, the run locked
# and read, the task insert (with a key: ON CONFLICT DO NOTHING, no read first), the run's
# counters and status, the event insert, COMMIT; PostgreSQL adds the NOTIFY that wakes idle
# workers, pipelined with the inserts and the COMMIT. On PostgreSQL, every write that locks a
# run also takes the run's writer lock (in the statement that locks the run) and folds its
# delta rows (one statement more, pipelined with it; services/write.py). PostgreSQL chains the
# run update, the NOTIFY and the event insert into one statement.
ENQUEUE = {"sqlite": 6, "postgresql": 6}
# without a key the task insert is not guarded (nothing to read back): PostgreSQL chains it.
ENQUEUE_NO_KEY = {"sqlite": 6, "postgresql": 5}


def test_enqueueing_one_task_query_count(orch, run, django_assert_num_queries):
    with django_assert_num_queries(budget(ENQUEUE)):
        first = orch.enqueue_task(run_id=run.id, kind="k", key="a", input={"n": 1}, now=at(1))
    with django_assert_num_queries(budget(ENQUEUE_NO_KEY)):
        second = orch.enqueue_task(run_id=run.id, kind="k", priority=3, now=at(2))
    assert (first.key, first.input, first.status, first.attempt_count) == (
        "a",
        {"n": 1},
        "queued",
        0,
    )
    assert (second.priority, second.claimable, second.unmet_dependencies) == (3, True, 0)
    assert Task.objects.get(pk=first.id).input == {"n": 1}
    assert orch.get_run(run_id=run.id).tasks_active == 2


# A release (and a pause) locks the run and sends its guard in one round trip: one fenced
# UPDATE … RETURNING (a refusal is explained by one read after it); the attempt update (which
# ends its lease), the run's counters and the events go with the commit (+ the NOTIFY on
# PostgreSQL when the task is queued again).
# release: run read, task update, attempt update, run update, event.
RELEASE = {"sqlite": 7, "postgresql": 6}
# A failure reads the run (locked) and the task in one round trip (its target, a retry or
# not, depends on the task's attempts), checks the lease on what it read, then writes the
# task with one guarded UPDATE.
# fail with a retry left: release's writes + the task read (it stays in the active counter).
FAIL_RETRY = {"sqlite": 8, "postgresql": 7}
# fail (final): + the dependents' edges read (a failed task blocks its dependents); no NOTIFY.
FAIL = {"sqlite": 9, "postgresql": 8}


def test_fail_and_release_query_counts(orch, run, django_assert_num_queries):
    for _ in range(3):
        orch.enqueue_task(run_id=run.id, kind="k", max_attempts=2, now=at(0))

    def leased(second: int) -> dict:
        claim = orch.claim_next_task(worker_id="w", start=True, now=at(second))
        return {"task_id": claim.task.id, "lease_id": claim.lease.id, "worker_id": "w"}

    ids = leased(1)
    with django_assert_num_queries(budget(RELEASE)):
        orch.release_task(**ids, reason="shutting down", now=at(2))
    ids = leased(3)
    with django_assert_num_queries(budget(FAIL_RETRY)):
        orch.fail_task(**ids, error="boom", retry=True, now=at(4))
    ids = leased(5)
    with django_assert_num_queries(budget(FAIL)):
        orch.fail_task(**ids, error="boom", now=at(6))


# A completion in a run with max_parallel that hands the freed slots on: the plain batch
# completion + the hand-out under the run lock, one statement (write.hand_out_sql: the slot
# holders, on PostgreSQL those a claim is not taking right now (SKIP LOCKED), the tasks in
# flight and the best ready ones are its subqueries, the claimable flags its update). On
# PostgreSQL it must see the chain's updates, so the chain is cut in two around it: +2.
CAPPED_COMPLETE = {"sqlite": 9, "postgresql": 8}


def test_a_capped_completion_costs_the_plain_one_plus_the_hand_out(orch, django_assert_num_queries):
    from parallel_mcp.services import complete_tasks

    run = orch.create_run(max_parallel=8)
    orch.enqueue_tasks(run_id=run.id, tasks=[{"kind": "k"}] * 20, now=at(0))
    claims = orch.claim_next_tasks(worker_id="w", limit=4, start=True, now=at(1))
    items = [{"task_id": c.task.id, "lease_id": c.lease.id} for c in claims]
    with django_assert_num_queries(budget(CAPPED_COMPLETE)):
        complete_tasks(using="default", worker_id="w", items=items, now=at(2))
    assert Task.objects.filter(run_id=run.id, claimable=True, status="queued").count() == 8


def test_a_completion_probes_each_client_token_by_its_primary_key(orch, run):
    """The guard of a completion with client tokens looks each task's own token up in the
    token table's primary key and never scans that table (issue 15: its tokens as one filter
    let PostgreSQL hash a scan of the whole table for every completion while the table's
    statistics said it was small). The table is probed only by the tokens' insert's conflict
    check: on PostgreSQL the insert is a CTE of the guard, which reads what it recorded; on
    SQLite the guard is told which tokens the insert before it recorded."""
    from parallel_mcp.services import complete_tasks

    for _ in range(2):
        orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    claims = orch.claim_next_tasks(worker_id="w", limit=2, start=True, now=at(1))
    items = [
        {"task_id": c.task.id, "lease_id": c.lease.id, "client_token": f"done-{n}"}
        for n, c in enumerate(claims)
    ]
    sent: list[tuple[str, list]] = []

    def keep(execute, sql, params, many, context):
        sent.append((sql, list(params or [])))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(keep):
        complete_tasks(using="default", worker_id="w", items=items, now=at(2))
    (guard,) = [
        (sql, p)
        for sql, p in sent
        if sql.startswith(("UPDATE pmcp_task SET status", "WITH recorded AS"))
    ]
    explain = "EXPLAIN QUERY PLAN " if connection.vendor == "sqlite" else "EXPLAIN "
    with transaction.atomic(), connection.cursor() as cursor:
        if connection.vendor == "postgresql":
            # The plan as a live database has it: a token table with statistics that say it
            # is not tiny (on a one-page table any scan is as cheap as a probe).
            ClientTokenRecord.objects.bulk_create(
                ClientTokenRecord(
                    token=f"filler-{n}",
                    run_id=run.id,
                    task_id=claims[0].task.id,
                    outcome="completed",
                    created_at=at(2),
                )
                for n in range(2_000)
            )
            cursor.execute("ANALYZE pmcp_client_token")
        cursor.execute(explain + guard[0], guard[1])
        plan = "\n".join(" ".join(str(part) for part in row) for row in cursor.fetchall())
    if connection.vendor == "postgresql":
        assert "Conflict Arbiter Indexes: pmcp_client_token_pkey" in plan, plan
        assert "Scan on pmcp_client_token" not in plan, plan
    else:
        # The guard lets through the items whose token the insert before it recorded: it
        # reads nothing of the token table (the insert's conflict check probes the index).
        assert "pmcp_client_token" not in plan, plan


@pytest.mark.skipif(connection.vendor != "postgresql", reason="array parameters: PostgreSQL")
def test_a_completion_batch_sends_one_statement_text_whatever_its_size(orch, run):
    """The guard with its tokens' insert has the same text and number of parameters for 1
    item as for 8 (arrays and one JSON document): psycopg converts a statement text once
    (not one of more than 50 parameters: 70 us at every call for a batch of 8) and the server
    keeps one prepared statement for it (bench/FINDINGS.md, "CPU per task with 8 slots")."""
    from parallel_mcp.services import complete_tasks

    for _ in range(9):
        orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    claims = orch.claim_next_tasks(worker_id="w", limit=9, start=True, now=at(1))
    sent: list[tuple[str, int]] = []

    def keep(execute, sql, params, many, context):
        sent.append((sql, len(params or [])))
        return execute(sql, params, many, context)

    for batch in (claims[:1], claims[1:]):
        items = [
            {"task_id": c.task.id, "lease_id": c.lease.id, "client_token": f"done-{c.task.id}"}
            for c in batch
        ]
        with connection.execute_wrapper(keep):
            results = complete_tasks(using="default", worker_id="w", items=items, now=at(2))
        assert [result.status for result in results] == ["completed"] * len(batch)
    (one, eight) = [shape for shape in sent if shape[0].startswith("WITH recorded AS")]
    assert one == eight and one[1] < 20


# Every index of a table takes an entry at each insert and at each update that is not HOT
# (every task transition changes an indexed column), so the hot tables keep only what is read.
HOT_TABLE_INDEXES = {
    "pmcp_task": {
        "pmcp_task_pkey",
        "pmcp_task_claim_idx",
        "pmcp_task_run_ready_idx",
        "pmcp_task_lease_expiry_idx",
        "pmcp_task_run_status_idx",
        "pmcp_task_dead_idx",
        "pmcp_task_run_key_uniq",
        "pmcp_task_context_snapshot_idx",
        "pmcp_task_slot_delayed_idx",
    },
    "pmcp_client_token": {
        "pmcp_client_token_pkey",
        "pmcp_client_token_run_id_80a056da",
        "pmcp_client_token_task_id_1d85199a",
    },
    # A completion counted apart inserts one row; its fold deletes the run's rows by run_id.
    "pmcp_run_delta": {"pmcp_run_delta_pkey", "pmcp_run_delta_run_id_46132309"},
}


@pytest.mark.skipif(connection.vendor != "postgresql", reason="index names of PostgreSQL")
@pytest.mark.parametrize("table", sorted(HOT_TABLE_INDEXES))
def test_hot_tables_keep_only_the_indexes_that_are_read(db, table):
    with connection.cursor() as cursor:
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s", [table])
        found = dict(cursor.fetchall())
    assert set(found) == HOT_TABLE_INDEXES[table], found
    if table == "pmcp_task":
        # Tasks without a context snapshot (nearly all) take no entry at their updates.
        assert "WHERE (context_snapshot_id IS NOT NULL)" in found["pmcp_task_context_snapshot_idx"]
        # Only delayed tasks of capped runs waiting for a slot: no hot-path update takes one.
        delayed = found["pmcp_task_slot_delayed_idx"]
        assert "(claimable = false)" in delayed and "(not_before IS NOT NULL)" in delayed, delayed


# A completion outside any transaction on PostgreSQL (what a worker sends) never waits for its
# run's row lock (services/write.py, "Run counters apart"). Its write: BEGIN, the prelude that
# keeps the write's statements on their generic plans (dialect.py, write_prelude: a write
# outside any transaction only), one guard statement (Write.send_guard: the run's writer lock
# shared, then the fenced task update, then the run's row when free, SKIP LOCKED, its delta
# rows deleted: each step held back by a one-time filter until the one before it is done, so
# that a holder of a run row never waits for a task), then one chained statement (attempt
# update, dependents update, the run's counters and status update if it got the row, else its
# delta row insert, event insert), COMMIT.
COMPLETE_APART = {"postgresql": 5}
# Counted by delta row, it then folds the run: BEGIN, the prelude, one statement that makes
# its commit asynchronous, locks the run row, deletes and sums its delta rows, then the run's
# counters and status update (+ the status event when it moved, chained), COMMIT.
FOLD = {"postgresql": 5}
# A worker's cycle, likewise: CYCLE's statements with the completion's guard statement (the
# writer lock and the row with the delta rows' fold in it, instead of the gated lock and the
# fold), + the prelude, which takes the claim token's lock (instead of its own statement).
CYCLE_APART = {"postgresql": 6}
# A claim alone with its token (a worker with nothing to complete): BEGIN, the prelude with
# the token's lock, the claim with the token's check, the chain, COMMIT.
CLAIM_TOKEN_APART = {"postgresql": 5}


@pytest.mark.skipif(connection.vendor != "postgresql", reason="SQLite counts in the write")
@pytest.mark.django_db(transaction=True)
def test_a_completion_outside_a_transaction_costs_its_write_and_a_fold_when_contended(
    django_assert_num_queries,
):
    from parallel_mcp import Orchestrator
    from parallel_mcp.services import complete_and_claim
    from tests.run_lock_support import run_row_held

    orch = Orchestrator()
    run = orch.create_run(now=at(0))
    for _ in range(6):
        orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    claims = orch.claim_next_tasks(worker_id="w", limit=3, start=True, now=at(1))

    def ids(n: int) -> dict:
        return {"task_id": claims[n].task.id, "lease_id": claims[n].lease.id, "worker_id": "w"}

    with django_assert_num_queries(budget(COMPLETE_APART)):
        orch.complete_task(**ids(0), now=at(2))
    committed = Task.objects.filter(pk=claims[1].task.id, status="completed").exists
    with run_row_held(run.id, until=committed):
        with django_assert_num_queries(budget(COMPLETE_APART) + budget(FOLD)):
            orch.complete_task(**ids(1), now=at(3))
    items = [{"task_id": claims[2].task.id, "lease_id": claims[2].lease.id, "client_token": "d"}]
    with django_assert_num_queries(budget(CYCLE_APART)):
        complete_and_claim(
            using="default",
            worker_id="w",
            items=items,
            limit=2,
            lease_ms=60_000,
            kinds=["k"],
            client_token="cycle",
            start=True,
            now=at(4),
        )
    with django_assert_num_queries(budget(CLAIM_TOKEN_APART)):
        alone = orch.claim_next_tasks(worker_id="w", limit=1, client_token="alone", now=at(5))
    assert len(alone) == 1
    assert orch.get_run(run_id=run.id).tasks_completed == 3

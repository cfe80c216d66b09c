"""How a write's final statements are chained (services/chain.py): what may share a statement,
in which order, with which parameters."""

from __future__ import annotations

from dataclasses import replace
from uuid import uuid4

import pytest
from django.db import connection

from parallel_mcp.services.chain import WAKE_CHANNEL, Deferred, Main, statements
from parallel_mcp.services.dialect import dialect_for

UPDATE_TASK = Deferred("UPDATE pmcp_task SET priority = %s WHERE id = %s", [1, "a"])
UPDATE_TASK_AGAIN = Deferred("UPDATE pmcp_task SET priority = %s WHERE id = %s", [2, "a"])
INSERT_ATTEMPT = Deferred("INSERT INTO pmcp_attempt (id) VALUES (%s)", ["l"])
UPDATE_ATTEMPT = Deferred("UPDATE pmcp_attempt SET status = %s WHERE id = %s", ["released", "l0"])
HAND_OUT = Deferred("WITH holders AS (SELECT id FROM pmcp_task) UPDATE pmcp_task SET x = 1", [])
EVENTS = Main(
    "INSERT INTO pmcp_event (event_type) SELECT * FROM (VALUES (%s)) AS e WHERE {gate} IS NOT NULL",
    ["task.completed"],
    "pg_advisory_xact_lock_shared(%s)",
    [7],
)


@pytest.fixture
def chaining(db):
    return replace(dialect_for("default"), chains=True)


def test_statements_that_change_other_rows_go_as_one_the_events_last(chaining):
    (sent,) = statements(chaining, [UPDATE_ATTEMPT, INSERT_ATTEMPT, UPDATE_TASK], notify=False,
                         main=EVENTS)  # fmt: skip
    sql, params = sent
    assert sql.startswith("WITH c0 AS (UPDATE pmcp_attempt ")
    assert "c1 AS (INSERT INTO pmcp_attempt " in sql and "c2 AS (UPDATE pmcp_task " in sql
    # Every sub-statement is read, in order, before the fence is taken and the events made.
    assert (
        "(SELECT pg_advisory_xact_lock_shared(%s) FROM (SELECT count(*) AS n FROM "
        "(SELECT 1 FROM c0 UNION ALL SELECT 1 FROM c1 UNION ALL SELECT 1 FROM c2) AS d) AS d "
        "WHERE d.n >= 0) IS NOT NULL"
    ) in sql
    assert params == ["released", "l0", "l", 1, "a", "task.completed", 7]
    assert sql.count("%s") == len(params)


def test_a_second_update_of_a_table_starts_a_new_statement(chaining):
    """One statement cannot change a row twice (the second change would be lost)."""
    sent = statements(chaining, [UPDATE_TASK, UPDATE_TASK_AGAIN], notify=False, main=None)
    assert sent == [(UPDATE_TASK.sql, UPDATE_TASK.params), (UPDATE_TASK_AGAIN.sql, [2, "a"])]


def test_a_statement_that_must_see_the_others_goes_alone_between_them(chaining):
    sent = statements(chaining, [UPDATE_ATTEMPT, UPDATE_TASK, HAND_OUT, INSERT_ATTEMPT],
                      notify=False, main=EVENTS)  # fmt: skip
    assert [sql.split(" AS (")[0] for sql, _ in sent] == ["WITH c0", "WITH holders", "WITH c0"]
    assert sent[1] == (HAND_OUT.sql, [])
    assert "c0 AS (INSERT INTO pmcp_attempt " in sent[2][0]


def test_a_statement_that_wakes_workers_notifies_only_when_it_changed_rows(chaining):
    waking = Deferred(UPDATE_TASK.sql, UPDATE_TASK.params, wakes=True)
    (sent,) = statements(chaining, [UPDATE_ATTEMPT, waking], notify=False, main=EVENTS)
    assert "wake AS (SELECT pg_notify(%s, '') WHERE EXISTS (SELECT 1 FROM c1))" in sent[0]
    assert WAKE_CHANNEL in sent[1]
    (alone,) = statements(chaining, [waking], notify=False, main=None)
    assert alone[0].startswith("WITH moved AS (UPDATE pmcp_task ")
    (told,) = statements(chaining, [], notify=True, main=EVENTS)
    assert "wake AS (SELECT pg_notify(%s, ''))" in told[0]


def test_without_chains_every_statement_goes_alone_in_order(db):
    plain = replace(dialect_for("default"), chains=False)
    sent = statements(plain, [UPDATE_ATTEMPT, INSERT_ATTEMPT], notify=True, main=EVENTS)
    assert [sql for sql, _ in sent] == [
        UPDATE_ATTEMPT.sql,
        INSERT_ATTEMPT.sql,
        "INSERT INTO pmcp_event (event_type) SELECT * FROM (VALUES (%s)) AS e WHERE "
        "(SELECT pg_advisory_xact_lock_shared(%s)) IS NOT NULL",
    ]


needs_chains = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="SQLite sends the statements one by one"
)


@needs_chains
def test_the_fence_is_taken_after_every_sub_statement_ran(db):
    """The plan reads every sub-statement's rows inside the gate that takes the fence, so they
    run (and take their row locks) before it: none is left for the end of the statement."""
    d = dialect_for("default")
    touch = Deferred("UPDATE pmcp_run SET status = status WHERE id = %s", [uuid4()])
    attempt = Deferred("UPDATE pmcp_attempt SET status = status WHERE id = %s", [uuid4()])
    (sent,) = statements(d, [touch, attempt], notify=True, main=EVENTS)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + sent[0], sent[1])
        plan = "\n".join(row[0] for row in cursor.fetchall())
    gate = plan[plan.index("InitPlan") :]
    for scanned in ("CTE Scan on c0", "CTE Scan on c1", "CTE Scan on wake"):
        assert scanned in gate, plan


@needs_chains
@pytest.mark.django_db(transaction=True)
def test_a_chained_notify_reaches_a_listening_worker():
    import psycopg

    from parallel_mcp import Orchestrator

    settings = connection.settings_dict
    listener = psycopg.connect(
        host=settings["HOST"],
        port=settings["PORT"],
        user=settings["USER"],
        password=settings["PASSWORD"],
        dbname=settings["NAME"],
        autocommit=True,
    )
    try:
        listener.execute(f"LISTEN {WAKE_CHANNEL}")
        orch = Orchestrator()
        run = orch.create_run()
        orch.enqueue_task(run_id=run.id, kind="k")  # one chained statement with its NOTIFY
        assert [n.channel for n in listener.notifies(timeout=5, stop_after=1)] == [WAKE_CHANNEL]
    finally:
        listener.close()

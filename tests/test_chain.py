"""How a write's final statements are chained (services/chain.py): what may share a statement,
in which order, with which parameters."""

from __future__ import annotations

from dataclasses import replace

import pytest

from parallel_mcp.services.chain import WAKE_CHANNEL, Deferred, Main, statements
from parallel_mcp.services.dialect import dialect_for

UPDATE_TASK = Deferred("UPDATE pmcp_task SET priority = %s WHERE id = %s", [1, "a"])
UPDATE_TASK_AGAIN = Deferred("UPDATE pmcp_task SET priority = %s WHERE id = %s", [2, "a"])
INSERT_LEASE = Deferred("INSERT INTO pmcp_lease (id) VALUES (%s)", ["l"])
UPDATE_LEASE = Deferred("UPDATE pmcp_lease SET status = %s WHERE id = %s", ["released", "l0"])
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
    (sent,) = statements(chaining, [UPDATE_LEASE, INSERT_LEASE, UPDATE_TASK], notify=False,
                         main=EVENTS)  # fmt: skip
    sql, params = sent
    assert sql.startswith("WITH c0 AS (UPDATE pmcp_lease ")
    assert "c1 AS (INSERT INTO pmcp_lease " in sql and "c2 AS (UPDATE pmcp_task " in sql
    # Every sub-statement is read, in order, before the fence is taken and the events made.
    assert (
        "(SELECT pg_advisory_xact_lock_shared(%s) FROM (SELECT count(*) AS n FROM "
        "(SELECT 1 FROM c0 UNION ALL SELECT 1 FROM c1 UNION ALL SELECT 1 FROM c2) AS d) AS d) "
        "IS NOT NULL"
    ) in sql
    assert params == ["released", "l0", "l", 1, "a", "task.completed", 7]
    assert sql.count("%s") == len(params)


def test_a_second_update_of_a_table_starts_a_new_statement(chaining):
    """One statement cannot change a row twice (the second change would be lost)."""
    sent = statements(chaining, [UPDATE_TASK, UPDATE_TASK_AGAIN], notify=False, main=None)
    assert sent == [(UPDATE_TASK.sql, UPDATE_TASK.params), (UPDATE_TASK_AGAIN.sql, [2, "a"])]


def test_a_statement_that_must_see_the_others_goes_alone_between_them(chaining):
    sent = statements(chaining, [UPDATE_LEASE, UPDATE_TASK, HAND_OUT, INSERT_LEASE],
                      notify=False, main=EVENTS)  # fmt: skip
    assert [sql.split(" AS (")[0] for sql, _ in sent] == ["WITH c0", "WITH holders", "WITH c0"]
    assert sent[1] == (HAND_OUT.sql, [])
    assert "c0 AS (INSERT INTO pmcp_lease " in sent[2][0]


def test_a_statement_that_wakes_workers_notifies_only_when_it_changed_rows(chaining):
    waking = Deferred(UPDATE_TASK.sql, UPDATE_TASK.params, wakes=True)
    (sent,) = statements(chaining, [UPDATE_LEASE, waking], notify=False, main=EVENTS)
    assert "wake AS (SELECT pg_notify(%s, '') WHERE EXISTS (SELECT 1 FROM c1))" in sent[0]
    assert WAKE_CHANNEL in sent[1]
    (alone,) = statements(chaining, [waking], notify=False, main=None)
    assert alone[0].startswith("WITH moved AS (UPDATE pmcp_task ")
    (told,) = statements(chaining, [], notify=True, main=EVENTS)
    assert "wake AS (SELECT pg_notify(%s, ''))" in told[0]


def test_without_chains_every_statement_goes_alone_in_order(db):
    plain = replace(dialect_for("default"), chains=False)
    sent = statements(plain, [UPDATE_LEASE, INSERT_LEASE], notify=True, main=EVENTS)
    assert [sql for sql, _ in sent] == [
        UPDATE_LEASE.sql,
        INSERT_LEASE.sql,
        "INSERT INTO pmcp_event (event_type) SELECT * FROM (VALUES (%s)) AS e WHERE "
        "(SELECT pg_advisory_xact_lock_shared(%s)) IS NOT NULL",
    ]

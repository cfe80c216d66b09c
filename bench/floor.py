"""The floor: the least work a durable claim → complete cycle can do, in plain ``sqlite3`` /
``psycopg`` on the same database, with no ORM.

Two tables of its own: ``floor_task`` (status, lease columns, a partial index in claim order)
and ``floor_event``. One cycle is two transactions:

1. claim: a conditional ``UPDATE … WHERE id = (first queued in claim order) AND status =
   'queued' RETURNING id`` (``FOR UPDATE SKIP LOCKED`` on PostgreSQL) + one event ``INSERT``;
2. complete: a fenced ``UPDATE … WHERE id = ? AND lease_id = ? AND status = 'leased'`` (row
   count checked) + one event ``INSERT``.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

SQLITE_SCHEMA = [
    "DROP TABLE IF EXISTS floor_event",
    "DROP TABLE IF EXISTS floor_task",
    "CREATE TABLE floor_task (id char(32) PRIMARY KEY, status varchar(16) NOT NULL, "
    "priority integer NOT NULL, created_at datetime NOT NULL, attempt_count integer NOT NULL, "
    "lease_id char(32), leased_by varchar(200), lease_expires_at datetime, "
    "completed_at datetime, output text)",
    "CREATE INDEX floor_claim_idx ON floor_task (priority DESC, created_at, id) "
    "WHERE status = 'queued'",
    "CREATE TABLE floor_event (id integer PRIMARY KEY AUTOINCREMENT, task_id char(32) NOT NULL, "
    "event_type varchar(64) NOT NULL, payload text NOT NULL, created_at datetime NOT NULL)",
]
PG_SCHEMA = [
    "DROP TABLE IF EXISTS floor_event",
    "DROP TABLE IF EXISTS floor_task",
    "CREATE TABLE floor_task (id uuid PRIMARY KEY, status varchar(16) NOT NULL, "
    "priority integer NOT NULL, created_at timestamptz NOT NULL, attempt_count integer NOT NULL, "
    "lease_id uuid, leased_by varchar(200), lease_expires_at timestamptz, "
    "completed_at timestamptz, output jsonb)",
    "CREATE INDEX floor_claim_idx ON floor_task (priority DESC, created_at, id) "
    "WHERE status = 'queued'",
    "CREATE TABLE floor_event (id bigserial PRIMARY KEY, task_id uuid NOT NULL, "
    "event_type varchar(64) NOT NULL, payload jsonb NOT NULL, created_at timestamptz NOT NULL)",
]

CLAIM_SQLITE = (
    "UPDATE floor_task SET status = 'leased', attempt_count = attempt_count + 1, lease_id = ?, "
    "leased_by = ?, lease_expires_at = ? WHERE id = (SELECT id FROM floor_task "
    "WHERE status = 'queued' ORDER BY priority DESC, created_at, id LIMIT 1) "
    "AND status = 'queued' RETURNING id"
)
COMPLETE_SQLITE = (
    "UPDATE floor_task SET status = 'completed', lease_id = NULL, leased_by = NULL, "
    "lease_expires_at = NULL, completed_at = ?, output = ? "
    "WHERE id = ? AND lease_id = ? AND status = 'leased'"
)
EVENT_SQLITE = (
    "INSERT INTO floor_event (task_id, event_type, payload, created_at) VALUES (?, ?, ?, ?)"
)
CLAIM_PG = (
    "UPDATE floor_task SET status = 'leased', attempt_count = attempt_count + 1, lease_id = %s, "
    "leased_by = %s, lease_expires_at = %s WHERE id = (SELECT id FROM floor_task "
    "WHERE status = 'queued' ORDER BY priority DESC, created_at, id LIMIT 1 "
    "FOR UPDATE SKIP LOCKED) RETURNING id"
)
COMPLETE_PG = COMPLETE_SQLITE.replace("?", "%s")
EVENT_PG = EVENT_SQLITE.replace("?", "%s")


def _sqlite_ts(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")


class SqliteFloor:
    def __init__(self, path: str, sync: str) -> None:
        self.conn = sqlite3.connect(path, isolation_level=None, timeout=30)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute(f"PRAGMA synchronous={sync}")
        self.conn.execute("PRAGMA busy_timeout=30000")

    def create(self, count: int) -> None:
        for statement in SQLITE_SCHEMA:
            self.conn.execute(statement)
        base = datetime(2026, 1, 1, tzinfo=UTC)
        rows = [
            (uuid.uuid4().hex, "queued", 0, _sqlite_ts(base + timedelta(microseconds=n)), 0)
            for n in range(count)
        ]
        self.conn.execute("BEGIN IMMEDIATE")
        self.conn.executemany(
            "INSERT INTO floor_task (id, status, priority, created_at, attempt_count) "
            "VALUES (?, ?, ?, ?, ?)",
            rows,
        )
        self.conn.execute("COMMIT")

    def cycle(self, worker_id: str) -> bool:
        conn = self.conn
        now = datetime.now(UTC)
        lease_id = uuid.uuid4().hex
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute(
            CLAIM_SQLITE, (lease_id, worker_id, _sqlite_ts(now + timedelta(seconds=30)))
        ).fetchone()
        if row is None:
            conn.execute("COMMIT")
            return False
        task_id = row[0]
        payload = json.dumps({"worker_id": worker_id, "lease_id": lease_id})
        conn.execute(EVENT_SQLITE, (task_id, "task.claimed", payload, _sqlite_ts(now)))
        conn.execute("COMMIT")
        now = datetime.now(UTC)
        conn.execute("BEGIN IMMEDIATE")
        updated = conn.execute(
            COMPLETE_SQLITE, (_sqlite_ts(now), "null", task_id, lease_id)
        ).rowcount
        if updated != 1:
            conn.execute("ROLLBACK")
            raise RuntimeError("floor: lost the lease")
        payload = json.dumps({"worker_id": worker_id})
        conn.execute(EVENT_SQLITE, (task_id, "task.completed", payload, _sqlite_ts(now)))
        conn.execute("COMMIT")
        return True

    def close(self) -> None:
        self.conn.close()


class PostgresFloor:
    def __init__(self, params: dict[str, Any]) -> None:
        import psycopg

        self.conn = psycopg.connect(**params)

    def create(self, count: int) -> None:
        conn = self.conn
        with conn.cursor() as cursor:
            for statement in PG_SCHEMA:
                cursor.execute(statement)
            cursor.execute(
                "INSERT INTO floor_task (id, status, priority, created_at, attempt_count) "
                "SELECT gen_random_uuid(), 'queued', 0, "
                "TIMESTAMPTZ '2026-01-01 00:00:00+00' + g * INTERVAL '1 microsecond', 0 "
                "FROM generate_series(1, %s) AS g",
                [count],
            )
            cursor.execute("ANALYZE floor_task")
        conn.commit()

    def cycle(self, worker_id: str) -> bool:
        from psycopg.types.json import Jsonb

        conn = self.conn
        now = datetime.now(UTC)
        lease_id = uuid.uuid4()
        with conn.cursor() as cursor:
            cursor.execute(CLAIM_PG, (lease_id, worker_id, now + timedelta(seconds=30)))
            row = cursor.fetchone()
            if row is None:
                conn.commit()
                return False
            task_id = row[0]
            payload = Jsonb({"worker_id": worker_id, "lease_id": str(lease_id)})
            cursor.execute(EVENT_PG, (task_id, "task.claimed", payload, now))
            conn.commit()
            now = datetime.now(UTC)
            cursor.execute(COMPLETE_PG, (now, Jsonb(None), task_id, lease_id))
            if cursor.rowcount != 1:
                conn.rollback()
                raise RuntimeError("floor: lost the lease")
            cursor.execute(
                EVENT_PG, (task_id, "task.completed", Jsonb({"worker_id": worker_id}), now)
            )
            conn.commit()
        return True

    def close(self) -> None:
        self.conn.close()


def open_floor() -> SqliteFloor | PostgresFloor:
    """A floor connection to the work database of this process (from the Django settings)."""
    from django.db import connection

    if connection.vendor == "sqlite":
        return SqliteFloor(
            connection.settings_dict["NAME"], os.environ.get("PMCP_BENCH_SYNC", "FULL")
        )
    params = connection.get_connection_params()
    keep = ("host", "port", "user", "password", "dbname")
    return PostgresFloor({k: params[k] for k in keep if params.get(k)})


def measure(*, count: int, seconds: float, worker_id: str = "floor") -> dict[str, Any]:
    """Create ``count`` tasks, then run cycles until they run out or ``seconds`` pass."""
    floor = open_floor()
    try:
        floor.create(count)
        done = 0
        started = time.perf_counter()
        deadline = started + seconds
        while time.perf_counter() < deadline and floor.cycle(worker_id):
            done += 1
        elapsed = time.perf_counter() - started
    finally:
        floor.close()
    return {"cycles": done, "seconds": elapsed, "rate": done / elapsed if elapsed else 0.0}

"""A lease is read from its attempt's row: ``pmcp_lease`` is a view of ``pmcp_attempt``
(migration 0013, models/leases.py). Each lease reads what the lease table held before, and
the instances the write path builds (``services.leases.lease_of``) are what the view reads."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.core.management.base import CommandError
from django.db import DatabaseError, IntegrityError, connection, transaction
from django.db.migrations.executor import MigrationExecutor

from parallel_mcp import Orchestrator
from parallel_mcp.ids import new_id
from parallel_mcp.models import Attempt, Lease
from parallel_mcp.services.leases import lease_of
from parallel_mcp.states import LEASE_STATUS_OF_ATTEMPT, AttemptStatus
from tests.conftest import at

BEFORE = [("parallel_mcp", "0012_run_delta")]  # the last migration with a lease table
AFTER = [("parallel_mcp", "0013_attempt_holds_lease")]


def _migrate(targets: list[tuple[str, str]]) -> Any:
    """Migrate to ``targets``; the historical models (apps) there."""
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(targets)
    return executor.loader.project_state(targets).apps


def _leases(model: Any) -> list[dict[str, Any]]:
    return list(model.objects.order_by("id").values())


# (attempt status, lease status, heartbeat after the claim in seconds or None, client token,
# principal): one lease per state the lease table could hold.
OLD_LEASES = [
    ("leased", "active", None, None, None),
    ("running", "active", 4, "job-1", "user:7"),
    ("running", "active", None, "cycle#0", None),
    ("completed", "released", 3, "cycle#1", "token:9"),
    ("failed", "released", None, None, None),
    ("released", "released", 2, "job-2", None),
    ("expired", "expired", 1, None, "user:7"),
    ("expired", "expired", None, "job-3", None),
    ("cancelled", "cancelled", None, "job-4", None),
    ("cancelled", "cancelled", 5, None, None),
]


@pytest.mark.django_db(transaction=True)
def test_the_migration_keeps_every_lease_as_it_read_and_goes_back():
    orch = Orchestrator()
    run = orch.create_run(namespace="migration", now=at(0))
    tasks = [orch.enqueue_task(run_id=run.id, kind="k", now=at(0)) for _ in OLD_LEASES]
    try:
        old = _migrate(BEFORE)
        OldAttempt = old.get_model("parallel_mcp", "Attempt")
        OldLease = old.get_model("parallel_mcp", "Lease")
        for n, (task, row) in enumerate(zip(tasks, OLD_LEASES, strict=True)):
            attempt_status, lease_status, heartbeat, token, principal = row
            leased_at = at(10 + n, ms=n)
            expires_at = leased_at + timedelta(seconds=30 + n)
            closed = lease_status != "active"
            ended_at = leased_at + timedelta(seconds=20) if closed else None
            attempt = OldAttempt.objects.create(
                id=new_id(),
                run_id=run.id,
                task_id=task.id,
                worker_id=f"w{n}",
                status=attempt_status,
                leased_at=leased_at,
                started_at=leased_at if attempt_status != "leased" else None,
                ended_at=ended_at,
                lease_expires_at=expires_at,
                error="boom" if attempt_status == "failed" else None,
                output={"n": n} if attempt_status == "completed" else None,
            )
            OldLease.objects.create(
                id=attempt.id,
                run_id=run.id,
                task_id=task.id,
                attempt_id=attempt.id,
                worker_id=f"w{n}",
                status=lease_status,
                acquired_at=leased_at,
                expires_at=expires_at,
                heartbeat_at=leased_at + timedelta(seconds=heartbeat or 0),
                released_at=ended_at,
                client_token=token,
                principal=principal,
            )
        before = _leases(OldLease)
        attempts_before = list(OldAttempt.objects.order_by("id").values())
        assert {lease["status"] for lease in before} == {
            "active",
            "released",
            "expired",
            "cancelled",
        }

        _migrate(AFTER)
        assert _leases(Lease) == before  # field for field
        moved = {a.pk: a for a in Attempt.objects.all()}
        for attempt in attempts_before:
            lease = Lease.objects.get(pk=attempt["id"])
            stored = moved[attempt["id"]]
            assert {k: getattr(stored, k) for k in attempt} == attempt
            # Only a heartbeat after the claim is kept; the lease reads leased_at otherwise.
            assert stored.heartbeat_at == (
                None if lease.heartbeat_at == stored.leased_at else lease.heartbeat_at
            )
            assert (stored.client_token, stored.principal) == (
                lease.client_token,
                lease.principal,
            )
            assert _fields(lease_of(stored, "default")) == _fields(lease)
        # The tokens stay unique, now on the attempts.
        with pytest.raises(IntegrityError), transaction.atomic():
            Attempt.objects.filter(pk=before[1]["id"]).update(client_token="job-2")

        back = _migrate(BEFORE)
        assert _leases(back.get_model("parallel_mcp", "Lease")) == before
        assert list(back.get_model("parallel_mcp", "Attempt").objects.order_by("id").values()) == (
            attempts_before
        )
    finally:
        # Forward to the newest migration: the rest of the session needs every one applied.
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes("parallel_mcp"))


def _fields(lease: Lease) -> dict[str, Any]:
    return {f.attname: getattr(lease, f.attname) for f in Lease._meta.concrete_fields}


@pytest.mark.django_db
@pytest.mark.parametrize("status", list(AttemptStatus))
def test_the_view_and_the_write_path_read_a_lease_alike_in_every_attempt_status(orch, run, status):
    """The view spells ``states.LEASE_STATUS_OF_ATTEMPT`` in SQL (migration 0013); the write
    path's instances use the map: both must agree for every status an attempt can have."""
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    claim = orch.claim_next_task(worker_id="w", client_token="t", now=at(1))
    ended = at(5) if LEASE_STATUS_OF_ATTEMPT[status] != "active" else None
    Attempt.objects.filter(pk=claim.attempt.pk).update(status=status, ended_at=ended)
    lease = Lease.objects.get(pk=claim.lease.pk)
    assert lease.status == LEASE_STATUS_OF_ATTEMPT[status]
    assert lease.released_at == ended
    assert _fields(lease_of(Attempt.objects.get(pk=claim.attempt.pk), "default")) == _fields(lease)


@pytest.mark.django_db
def test_a_heartbeat_is_the_leases_heartbeat_and_nothing_writes_the_view(orch, run):
    from django.test.utils import CaptureQueriesContext

    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    with CaptureQueriesContext(connection) as captured:
        claim = orch.claim_next_task(worker_id="w", now=at(1))
        ids = {"task_id": claim.task.id, "lease_id": claim.lease.id, "worker_id": "w"}
        assert Lease.objects.get(pk=claim.lease.pk).heartbeat_at == at(1)  # the claim's time
        beat = orch.heartbeat_lease(**ids, lease_ms=10_000, now=at(4))
        orch.complete_task(**ids, now=at(6))
    assert (beat.heartbeat_at, beat.expires_at) == (at(4), at(14))
    lease = Lease.objects.get(pk=claim.lease.pk)
    assert (lease.heartbeat_at, lease.expires_at, lease.released_at) == (at(4), at(14), at(6))
    assert lease.status == "released"
    writes = [
        q["sql"]
        for q in captured.captured_queries
        if not q["sql"].lstrip().upper().startswith("SELECT") and "pmcp_lease" in q["sql"]
    ]
    assert writes == []


def _alters_attempts_under_the_view(migration: Any) -> bool:
    """Whether ``migration`` changes pmcp_attempt without dropping and recreating the view:
    SQLite remakes the table for most changes and then cannot rename it back while a view
    reads it ("error in view pmcp_lease: no such table"); PostgreSQL refuses to change a
    column a view reads."""
    from django.db.migrations.operations import AddIndex, RemoveIndex, RunSQL

    altered = any(
        str(getattr(op, "model_name", None) or getattr(op, "name", "")).lower() == "attempt"
        and not isinstance(op, AddIndex | RemoveIndex)
        for op in migration.operations
    )
    sql = " ".join(
        f"{op.sql} {op.reverse_sql}" for op in migration.operations if isinstance(op, RunSQL)
    )
    return altered and not ("DROP VIEW pmcp_lease" in sql and "CREATE VIEW pmcp_lease" in sql)


def test_a_later_migration_that_alters_the_attempts_recreates_the_view():
    from django.db import models
    from django.db.migrations import AlterField, Migration
    from django.db.migrations.loader import MigrationLoader

    careless = Migration("0099_careless", "parallel_mcp")
    careless.operations = [AlterField("attempt", "error", models.TextField(null=True))]
    assert _alters_attempts_under_the_view(careless)
    loader = MigrationLoader(None, ignore_no_migrations=True)
    later = [
        migration
        for (app, name), migration in loader.disk_migrations.items()
        if app == "parallel_mcp" and name >= AFTER[0][1]
    ]
    assert later and not [m.name for m in later if _alters_attempts_under_the_view(m)]


WRITES_OF_THE_VIEW = [
    "UPDATE pmcp_lease SET worker_id = 'intruder'",
    "UPDATE pmcp_lease SET expires_at = heartbeat_at",
    "DELETE FROM pmcp_lease",
    f"INSERT INTO pmcp_lease (id, worker_id) VALUES ('{new_id().hex}', 'w')",
]


COLUMNS = [str(field.column) for field in Lease._meta.concrete_fields]
# Our triggers' refusal (migration 0015), or SQLite's own for a DELETE (it has no trigger).
REFUSAL = "read-only view of pmcp_attempt|because it is a view"


@pytest.mark.django_db
@pytest.mark.parametrize("sql", WRITES_OF_THE_VIEW)
def test_the_lease_view_refuses_every_write_and_its_attempts_stay(orch, run, sql):
    """PostgreSQL takes a write of a one-table view as a write of the table under it (a
    lease's worker rewritten, attempts deleted) unless a trigger refuses; SQLite refuses by
    itself."""
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    claim = orch.claim_next_task(worker_id="w", client_token="t", now=at(1))
    attempts = list(Attempt.objects.values())
    refusal = REFUSAL
    with pytest.raises(DatabaseError, match=refusal), transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(sql)
    with pytest.raises(DatabaseError, match=refusal), transaction.atomic():
        Lease.objects.filter(pk=claim.lease.pk).update(worker_id="intruder")
    assert list(Attempt.objects.values()) == attempts


@pytest.mark.django_db
def test_the_lease_view_takes_a_write_of_what_it_shows_and_changes_nothing(orch, run):
    """What ``loaddata`` does with a dumped lease (migration 0015): an UPDATE of every column
    to the values the view shows, and an INSERT when the UPDATE matched nothing. Both are
    no-ops; one value off and the write is refused."""
    orch.enqueue_task(run_id=run.id, kind="k", now=at(0))
    claim = orch.claim_next_task(worker_id="w", client_token="t", now=at(1))
    orch.heartbeat_lease(
        task_id=claim.task.id, lease_id=claim.lease.id, worker_id="w", lease_ms=5_000, now=at(2)
    )
    attempts = list(Attempt.objects.values())
    lease = Lease.objects.get(pk=claim.lease.pk)
    lease.save()  # an UPDATE of every column, each to what it holds
    Lease.objects.filter(pk=lease.pk).update(worker_id="w", heartbeat_at=at(2))
    # Counted as written on PostgreSQL; SQLite counts no row an INSTEAD OF trigger took.
    written = 1 if connection.vendor == "postgresql" else 0
    assert Lease.objects.filter(pk=lease.pk).update(status="active") == written
    with connection.cursor() as cursor:  # an INSERT of the row it shows
        cursor.execute(
            f"INSERT INTO pmcp_lease ({', '.join(COLUMNS)}) SELECT {', '.join(COLUMNS)} "
            "FROM pmcp_lease WHERE id = %s",
            [Lease._meta.pk.get_db_prep_value(lease.pk, connection)],
        )
    assert list(Attempt.objects.values()) == attempts
    assert _fields(Lease.objects.get(pk=lease.pk)) == _fields(lease)
    for change in ({"worker_id": "intruder"}, {"heartbeat_at": at(3)}, {"client_token": None}):
        with pytest.raises(DatabaseError, match=REFUSAL), transaction.atomic():
            Lease.objects.filter(pk=lease.pk).update(**change)
    lease.expires_at = at(99)
    with pytest.raises(DatabaseError, match=REFUSAL), transaction.atomic():
        lease.save()
    with pytest.raises(DatabaseError, match=REFUSAL), transaction.atomic():
        lease.save(force_insert=True)
    assert list(Attempt.objects.values()) == attempts


@pytest.mark.django_db(transaction=True)
def test_the_migration_stops_before_objects_that_depend_on_the_lease_table():
    """A project's foreign key to the lease table (or, on PostgreSQL, its view reading it)
    would be dropped with the table or left pointing at a view: 0013 refuses, changing
    nothing, and says what to do."""
    own = ["CREATE TABLE audit_leasenote (id integer PRIMARY KEY, lease_id char(32) "]
    if connection.vendor == "postgresql":
        own = ["CREATE TABLE audit_leasenote (id integer PRIMARY KEY, lease_id uuid "]
    own[0] += "REFERENCES pmcp_lease (id))"
    expected = ["foreign key audit_leasenote.lease_id"]
    if connection.vendor == "postgresql":
        own.append("CREATE VIEW audit_lease_report AS SELECT id, worker_id FROM pmcp_lease")
        expected.append("view audit_lease_report")
    own += _own_trigger_on_leases()
    expected.append("trigger audit_lease_touched")
    try:
        _migrate(BEFORE)
        with connection.cursor() as cursor:
            for statement in own:
                cursor.execute(statement)
        with pytest.raises(CommandError) as refused:
            _migrate(AFTER)
        assert f"these depend on the table: {', '.join(expected)}. Nothing was changed" in str(
            refused.value
        )
        assert "docs/upgrading.md" in str(refused.value)
        with connection.cursor() as cursor:
            tables = connection.introspection.get_table_list(cursor)
        assert ("pmcp_lease", "t") in {(t.name, t.type) for t in tables}  # still a table
        assert "heartbeat_at" not in {
            c.name
            for c in connection.introspection.get_table_description(
                connection.cursor(), "pmcp_attempt"
            )
        }
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP VIEW IF EXISTS audit_lease_report")
            cursor.execute("DROP TABLE IF EXISTS audit_leasenote")
            cursor.execute("DROP TRIGGER IF EXISTS audit_lease_touched" + _ON_LEASES)
        _migrate_to_the_last()


_ON_LEASES = " ON pmcp_lease" if connection.vendor == "postgresql" else ""


def _own_trigger_on_leases() -> list[str]:
    """A trigger of the project's own on pmcp_lease (dropped with a table or a view)."""
    if connection.vendor != "postgresql":
        return ["CREATE TRIGGER audit_lease_touched AFTER UPDATE ON pmcp_lease BEGIN SELECT 1; END"]
    return [
        "CREATE OR REPLACE FUNCTION audit_touched() RETURNS trigger LANGUAGE plpgsql "
        "AS $$ BEGIN RETURN NULL; END $$",
        # Per statement: a view takes no row-level AFTER trigger.
        "CREATE TRIGGER audit_lease_touched AFTER UPDATE ON pmcp_lease FOR EACH STATEMENT "
        "EXECUTE FUNCTION audit_touched()",
    ]


def _migrate_to_the_last() -> None:
    executor = MigrationExecutor(connection)
    executor.loader.build_graph()
    executor.migrate(executor.loader.graph.leaf_nodes("parallel_mcp"))


@pytest.mark.django_db(transaction=True)
def test_going_back_stops_before_objects_that_depend_on_the_lease_view():
    """Back to 0012 the view becomes a table again: a view of the project's own on it would
    make PostgreSQL refuse the drop, a trigger would go with it. The way back refuses first,
    changing nothing."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite keeps a view of another view and drops no trigger of its own here")
    own = [
        "CREATE VIEW audit_lease_report AS SELECT id, worker_id FROM pmcp_lease",
        *_own_trigger_on_leases(),
    ]
    try:
        with connection.cursor() as cursor:
            for statement in own:
                cursor.execute(statement)
        with pytest.raises(CommandError) as refused:
            _migrate(BEFORE)
        assert (
            "these depend on the view: view audit_lease_report, trigger audit_lease_touched. "
            "Nothing was changed."
        ) in str(refused.value)
        with connection.cursor() as cursor:
            tables = connection.introspection.get_table_list(cursor)
        assert ("pmcp_lease", "v") in {(t.name, t.type) for t in tables}  # still the view
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT tgname FROM pg_trigger WHERE tgrelid = 'pmcp_lease'::regclass ORDER BY 1"
            )
            assert cursor.fetchall() == [("audit_lease_touched",), ("pmcp_lease_read_only",)]
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP VIEW IF EXISTS audit_lease_report")
            cursor.execute("DROP TRIGGER IF EXISTS audit_lease_touched" + _ON_LEASES)
        _migrate_to_the_last()


@pytest.mark.django_db(transaction=True)
def test_grants_of_select_on_leases_are_kept_both_ways():
    """A role of the project's that may read pmcp_lease still may once it is a view, and
    again once it is a table (PostgreSQL; SQLite has no grants)."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite has no grants")
    role = f"pmcp_reader_{new_id().hex[:12]}"

    def may_read() -> bool:
        with connection.cursor() as cursor:
            cursor.execute("SELECT has_table_privilege(%s, 'pmcp_lease', 'SELECT')", [role])
            return cursor.fetchone()[0]

    with connection.cursor() as cursor:
        cursor.execute(f"CREATE ROLE {role}")
    try:
        _migrate(BEFORE)
        with connection.cursor() as cursor:
            cursor.execute(f"GRANT SELECT ON pmcp_lease TO {role}")
        _migrate(AFTER)
        assert may_read()
        _migrate(BEFORE)
        assert may_read()
        _migrate(AFTER)
        assert may_read()
    finally:
        _migrate_to_the_last()
        with connection.cursor() as cursor:
            cursor.execute(f"REVOKE ALL ON pmcp_lease FROM {role}")
            cursor.execute(f"DROP ROLE {role}")

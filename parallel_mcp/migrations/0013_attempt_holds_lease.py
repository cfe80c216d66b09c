"""An attempt and its lease as one row (issue 15): the lease's own columns move to
``pmcp_attempt`` and ``pmcp_lease`` becomes a view of it, so a claim inserts one row and an
outcome updates one, while ``Lease`` reads what it read (models/leases.py).

The lease's other columns were always written in step with the attempt's (same id, same
times, the status in lockstep: ``states.LEASE_STATUS_OF_ATTEMPT``), so only the last
heartbeat (kept only when there was one after the claim), the client token and the
principal are copied. Reversible: going back recreates the table from the view's rows.
"""

from typing import Any

import django.db.models.deletion
from django.core.management.base import CommandError
from django.db import migrations, models

import parallel_mcp.ids
import parallel_mcp.states

# What a lease is, read from its attempt; the view, and on the way back the table's rows.
# Expired and cancelled are spelled alike for both; the other closed attempts released theirs.
LEASE_OF_ATTEMPT = """
SELECT id, run_id, task_id, id AS attempt_id, worker_id,
    CASE WHEN status IN ('leased', 'running') THEN 'active'
         WHEN status IN ('completed', 'failed', 'released') THEN 'released'
         ELSE status END AS status,
    leased_at AS acquired_at, lease_expires_at AS expires_at,
    COALESCE(heartbeat_at, leased_at) AS heartbeat_at, ended_at AS released_at,
    client_token, principal
FROM pmcp_attempt"""

LEASE_COLUMNS = (
    "id, run_id, task_id, attempt_id, worker_id, status, acquired_at, expires_at, "
    "heartbeat_at, released_at, client_token, principal"
)

COPY_LEASES = """
UPDATE pmcp_attempt SET
    heartbeat_at = (SELECT NULLIF(l.heartbeat_at, l.acquired_at) FROM pmcp_lease l
                    WHERE l.attempt_id = pmcp_attempt.id),
    client_token = (SELECT l.client_token FROM pmcp_lease l WHERE l.attempt_id = pmcp_attempt.id),
    principal = (SELECT l.principal FROM pmcp_lease l WHERE l.attempt_id = pmcp_attempt.id)"""

RESTORE_LEASES = f"INSERT INTO pmcp_lease ({LEASE_COLUMNS}) {LEASE_OF_ATTEMPT}"


def refuse_objects_on_the_lease_table(apps: Any, schema_editor: Any) -> None:
    """Stop before anything changes when objects of the project's own depend on the table:
    a foreign key to it would point at a view (SQLite fails the migration's own check,
    PostgreSQL drops the constraint with the table, as it drops a view that reads it), and
    both drop a trigger on it with the table. Grants of SELECT on it are kept for the view
    (``make_read_only``)."""
    connection = schema_editor.connection
    with connection.cursor() as cursor:
        found = [
            f"foreign key {table}.{column}"
            for table in connection.introspection.table_names(cursor)
            if table != "pmcp_lease"
            # (column it references, table it references[, on delete]: Django 6)
            for column, target in connection.introspection.get_relations(cursor, table).items()
            if target[1] == "pmcp_lease"
        ]
        found += _own_objects(cursor, connection.vendor)
        schema_editor.pmcp_lease_grants = _grants(cursor, connection.vendor)
    if found:
        raise CommandError(
            "parallel_mcp's migration 0013 turns the table pmcp_lease into a view of "
            f"pmcp_attempt, and these depend on the table: {', '.join(found)}. Nothing was "
            "changed. Point a ForeignKey to parallel_mcp.Lease at parallel_mcp.Attempt (a "
            "lease has its attempt's id) in a migration of yours that runs before this one "
            '(run_before = [("parallel_mcp", "0013_attempt_holds_lease")]), drop a view or '
            "trigger of yours on pmcp_lease (create it again after the upgrade); then "
            "migrate. See docs/upgrading.md."
        )


def _own_objects(cursor: Any, vendor: str) -> list[str]:
    """Views that read pmcp_lease (PostgreSQL: SQLite keeps them, unchecked) and triggers on
    it that are not this migration's."""
    if vendor != "postgresql":
        cursor.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'pmcp_lease' "
            "ORDER BY 1"
        )
        return [f"trigger {name}" for (name,) in cursor.fetchall()]
    cursor.execute(DEPENDENT_VIEWS)
    found = [f"view {name}" for (name,) in cursor.fetchall()]
    cursor.execute(
        "SELECT tgname FROM pg_trigger WHERE tgrelid = 'pmcp_lease'::regclass "
        "AND NOT tgisinternal AND tgname <> 'pmcp_lease_read_only' ORDER BY 1"
    )
    return found + [f"trigger {name}" for (name,) in cursor.fetchall()]


def _grants(cursor: Any, vendor: str) -> list[str]:
    """PostgreSQL: the grants of SELECT on pmcp_lease (to others than its owner), as the
    statements that give them again once the table is a view, or the view a table."""
    if vendor != "postgresql":
        return []
    cursor.execute(
        "SELECT 'GRANT SELECT ON pmcp_lease TO ' || CASE WHEN a.grantee = 0 THEN 'PUBLIC' "
        "ELSE quote_ident(pg_get_userbyid(a.grantee)) END "
        "|| CASE WHEN a.is_grantable THEN ' WITH GRANT OPTION' ELSE '' END "
        "FROM pg_class c, aclexplode(c.relacl) a WHERE c.oid = 'pmcp_lease'::regclass "
        "AND a.privilege_type = 'SELECT' AND a.grantee <> c.relowner ORDER BY 1"
    )
    return [statement for (statement,) in cursor.fetchall()]


def grant_again(apps: Any, schema_editor: Any) -> None:
    """Back to the table: the view's grants of SELECT, read by ``drop_read_only``."""
    for statement in getattr(schema_editor, "pmcp_lease_grants", []):
        schema_editor.execute(statement)


# Views and rules of other relations that read pmcp_lease.
DEPENDENT_VIEWS = """
SELECT DISTINCT c.relname FROM pg_depend d
JOIN pg_rewrite r ON r.oid = d.objid
JOIN pg_class c ON c.oid = r.ev_class
WHERE d.classid = 'pg_rewrite'::regclass AND d.refobjid = 'pmcp_lease'::regclass
  AND c.relname <> 'pmcp_lease'
ORDER BY 1"""

# PostgreSQL would take an UPDATE, INSERT or DELETE on a one-table view and apply it to
# pmcp_attempt: a lease's worker rewritten, attempts deleted. The trigger refuses every row.
READ_ONLY = (
    """
CREATE FUNCTION pmcp_lease_read_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'pmcp_lease is a read-only view of pmcp_attempt'
        USING ERRCODE = 'wrong_object_type',
        HINT = 'Change a lease through parallel_mcp (the Orchestrator, the API, the admin); '
            'leave parallel_mcp.lease out of fixtures: its rows are in parallel_mcp.attempt.';
END $$""",
    """
CREATE TRIGGER pmcp_lease_read_only INSTEAD OF INSERT OR UPDATE OR DELETE ON pmcp_lease
    FOR EACH ROW EXECUTE FUNCTION pmcp_lease_read_only()""",
)


def make_read_only(apps: Any, schema_editor: Any) -> None:
    """SQLite refuses to write a view by itself ("cannot modify pmcp_lease because it is a
    view"); PostgreSQL needs the trigger. The table's grants of SELECT go to the view."""
    if schema_editor.connection.vendor == "postgresql":
        for statement in (*READ_ONLY, *getattr(schema_editor, "pmcp_lease_grants", [])):
            schema_editor.execute(statement)


def drop_read_only(apps: Any, schema_editor: Any) -> None:
    """Going back, first: stop before a view or trigger of the project's own on the view
    (PostgreSQL would refuse to drop it, or drop the trigger with it); keep its grants."""
    if schema_editor.connection.vendor != "postgresql":
        return
    with schema_editor.connection.cursor() as cursor:
        found = _own_objects(cursor, "postgresql")
        schema_editor.pmcp_lease_grants = _grants(cursor, "postgresql")
    if found:
        raise CommandError(
            "Going back before parallel_mcp's migration 0013 turns the view pmcp_lease into a "
            f"table again, and these depend on the view: {', '.join(found)}. Nothing was "
            "changed. Drop them, migrate back, and create them again on the table."
        )
    schema_editor.execute("DROP TRIGGER pmcp_lease_read_only ON pmcp_lease")
    schema_editor.execute("DROP FUNCTION pmcp_lease_read_only()")


class Migration(migrations.Migration):
    dependencies = [
        ("parallel_mcp", "0012_run_delta"),
    ]

    operations = [
        migrations.RunPython(refuse_objects_on_the_lease_table, grant_again),
        migrations.AddField(
            model_name="attempt",
            name="heartbeat_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="attempt",
            name="client_token",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.AddField(
            model_name="attempt",
            name="principal",
            field=models.CharField(blank=True, max_length=200, null=True),
        ),
        migrations.RunSQL(COPY_LEASES, reverse_sql=RESTORE_LEASES),
        migrations.AddConstraint(
            model_name="attempt",
            constraint=models.UniqueConstraint(
                condition=models.Q(("client_token__isnull", False)),
                fields=("client_token",),
                name="pmcp_attempt_client_token_uniq",
            ),
        ),
        migrations.DeleteModel(name="Lease"),
        migrations.CreateModel(
            name="Lease",
            fields=[
                (
                    "id",
                    models.UUIDField(
                        default=parallel_mcp.ids.new_id,
                        editable=False,
                        primary_key=True,
                        serialize=False,
                    ),
                ),
                ("worker_id", models.CharField(max_length=200)),
                (
                    "status",
                    models.CharField(
                        choices=[
                            (parallel_mcp.states.LeaseStatus["ACTIVE"], "active"),
                            (parallel_mcp.states.LeaseStatus["EXPIRED"], "expired"),
                            (parallel_mcp.states.LeaseStatus["RELEASED"], "released"),
                            (parallel_mcp.states.LeaseStatus["CANCELLED"], "cancelled"),
                        ],
                        default=parallel_mcp.states.LeaseStatus["ACTIVE"],
                        max_length=16,
                    ),
                ),
                ("acquired_at", models.DateTimeField()),
                ("expires_at", models.DateTimeField()),
                ("heartbeat_at", models.DateTimeField(blank=True, null=True)),
                ("released_at", models.DateTimeField(blank=True, null=True)),
                ("client_token", models.CharField(blank=True, max_length=200, null=True)),
                ("principal", models.CharField(blank=True, max_length=200, null=True)),
                (
                    "attempt",
                    models.OneToOneField(
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="lease",
                        to="parallel_mcp.attempt",
                    ),
                ),
                (
                    "run",
                    models.ForeignKey(
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="parallel_mcp.run",
                    ),
                ),
                (
                    "task",
                    models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="leases",
                        to="parallel_mcp.task",
                    ),
                ),
            ],
            options={
                "db_table": "pmcp_lease",
                "ordering": ["acquired_at", "id"],
                "managed": False,
            },
        ),
        migrations.RunSQL(
            f"CREATE VIEW pmcp_lease AS {LEASE_OF_ATTEMPT}",
            reverse_sql="DROP VIEW pmcp_lease",
        ),
        migrations.RunPython(make_read_only, drop_read_only),
    ]

"""An attempt and its lease as one row (issue 15): the lease's own columns move to
``pmcp_attempt`` and ``pmcp_lease`` becomes a view of it, so a claim inserts one row and an
outcome updates one, while ``Lease`` reads what it read (models/leases.py).

The lease's other columns were always written in step with the attempt's (same id, same
times, the status in lockstep: ``states.LEASE_STATUS_OF_ATTEMPT``), so only the last
heartbeat (kept only when there was one after the claim), the client token and the
principal are copied. Reversible: going back recreates the table from the view's rows.
"""

import django.db.models.deletion
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


class Migration(migrations.Migration):
    dependencies = [
        ("parallel_mcp", "0012_run_delta"),
    ]

    operations = [
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
    ]

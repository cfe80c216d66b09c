"""The lease view takes a write of what it already shows, as a no-op, and still refuses every
other write (models/leases.py).

``dumpdata parallel_mcp`` lists the leases, and ``loaddata`` writes each one back, after the
attempts it is read from (an UPDATE, then an INSERT when none matched). Refused, a plain dump
and load (a backup, a move from SQLite to PostgreSQL) failed at the first lease; now each
lease's write finds the row its attempt already gives and changes nothing. A lease that
differs from its attempt's is refused as before.
"""

from typing import Any

from django.db import migrations

# The view's columns (migration 0013); a write must give each the value the view shows.
COLUMNS = (
    "id",
    "run_id",
    "task_id",
    "attempt_id",
    "worker_id",
    "status",
    "acquired_at",
    "expires_at",
    "heartbeat_at",
    "released_at",
    "client_token",
    "principal",
)

REFUSAL = "pmcp_lease is a read-only view of pmcp_attempt"
HINT = (
    "Change a lease through parallel_mcp (the Orchestrator, the API, the admin). Loading a "
    "fixture: its lease must be what its attempt, loaded before it, shows; dump with every "
    "writer stopped, attempts before leases (the order dumpdata uses)."
)


def _function(body: str, message: str, hint: str) -> str:
    return (
        "CREATE OR REPLACE FUNCTION pmcp_lease_read_only() RETURNS trigger LANGUAGE plpgsql "
        f"AS $$\nBEGIN\n{body}    RAISE EXCEPTION '{message}'\n"
        f"        USING ERRCODE = 'wrong_object_type', HINT = '{hint}';\nEND $$"
    )


# PostgreSQL: the trigger of 0013 (INSTEAD OF INSERT OR UPDATE OR DELETE, each row) keeps its
# name; its function lets a row the view already shows through. Returning the row counts it
# as written, so Django's save stops at the UPDATE. The hint is in the message too: Django's
# errors (loaddata's among them) show only the message.
TAKES_WHAT_IT_SHOWS = _function(
    "    IF TG_OP = 'UPDATE' AND NEW IS NOT DISTINCT FROM OLD THEN\n"
    "        RETURN NEW;\n"
    "    END IF;\n"
    "    IF TG_OP = 'INSERT' AND EXISTS (SELECT 1 FROM pmcp_lease l WHERE l.id = NEW.id\n"
    "            AND l IS NOT DISTINCT FROM NEW) THEN\n"
    "        RETURN NEW;\n"
    "    END IF;\n",
    f"{REFUSAL}. {HINT}",
    HINT,
)
# 0013's function, as it was.
REFUSES_EVERY_WRITE = _function(
    "",
    REFUSAL,
    "Change a lease through parallel_mcp (the Orchestrator, the API, the admin); "
    "leave parallel_mcp.lease out of fixtures: its rows are in parallel_mcp.attempt.",
)

# SQLite refuses a write of a view that has no INSTEAD OF trigger for it; DELETE keeps none.
SQLITE_TRIGGERS = (
    "CREATE TRIGGER pmcp_lease_insert INSTEAD OF INSERT ON pmcp_lease BEGIN "
    f"SELECT RAISE(ABORT, '{REFUSAL}. {HINT}') WHERE NOT EXISTS (SELECT 1 FROM pmcp_lease l WHERE "
    + " AND ".join(f"l.{column} IS NEW.{column}" for column in COLUMNS)
    + "); END",
    "CREATE TRIGGER pmcp_lease_update INSTEAD OF UPDATE ON pmcp_lease BEGIN "
    f"SELECT RAISE(ABORT, '{REFUSAL}. {HINT}') WHERE NOT ("
    + " AND ".join(f"OLD.{column} IS NEW.{column}" for column in COLUMNS)
    + "); END",
)
SQLITE_DROPS = ("DROP TRIGGER pmcp_lease_insert", "DROP TRIGGER pmcp_lease_update")


def take_what_it_shows(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(TAKES_WHAT_IT_SHOWS)
    else:
        for statement in SQLITE_TRIGGERS:
            schema_editor.execute(statement)


def refuse_every_write(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(REFUSES_EVERY_WRITE)
    else:
        for statement in SQLITE_DROPS:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [
        ("parallel_mcp", "0014_task_slot_delayed_idx"),
    ]

    operations = [migrations.RunPython(take_what_it_shows, refuse_every_write)]

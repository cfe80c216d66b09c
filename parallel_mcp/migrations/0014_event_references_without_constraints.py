"""The event log's references (run, task, attempt) without foreign-key constraints on
PostgreSQL (issue 15): a task's three events cost 9 of its 13 foreign-key checks at each
commit, 3-10 % of the server's CPU per task (bench/FINDINGS.md, "Issue 15: the claim in the
guard's round trip"). Events are inserted only by the write unit, with the rows they name,
and deleted with their run (``prune_runs``); models/events.py.

SQLite keeps its constraints: dropping one there copies the table, and the copy would lose
the high-water mark of its AUTOINCREMENT ids (an id of a pruned last event could be drawn
again, behind a consumer's cursor). The model says ``db_constraint=False`` on both: the
constraint is the database's, Django's behaviour is the same.
"""

import copy

import django.db.models.deletion
from django.db import migrations, models

REFERENCES = ("run", "task", "attempt")


def _alter(apps, schema_editor, *, constraint: bool) -> None:
    if schema_editor.connection.vendor != "postgresql":
        return
    event = apps.get_model("parallel_mcp", "Event")
    for name in REFERENCES:
        # The historical model is the state before this migration in both directions (the
        # state change is apart): the database holds the opposite of ``constraint``.
        old = copy.copy(event._meta.get_field(name))
        old.db_constraint = not constraint
        new = copy.copy(old)
        new.db_constraint = constraint
        schema_editor.alter_field(event, old, new)


def drop(apps, schema_editor):
    _alter(apps, schema_editor, constraint=False)


def restore(apps, schema_editor):
    _alter(apps, schema_editor, constraint=True)


class Migration(migrations.Migration):
    dependencies = [
        ("parallel_mcp", "0013_attempt_holds_lease"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunPython(drop, restore)],
            state_operations=[
                migrations.AlterField(
                    model_name="event",
                    name="attempt",
                    field=models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="parallel_mcp.attempt",
                    ),
                ),
                migrations.AlterField(
                    model_name="event",
                    name="run",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="events",
                        to="parallel_mcp.run",
                    ),
                ),
                migrations.AlterField(
                    model_name="event",
                    name="task",
                    field=models.ForeignKey(
                        blank=True,
                        db_constraint=False,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="+",
                        to="parallel_mcp.task",
                    ),
                ),
            ],
        ),
    ]

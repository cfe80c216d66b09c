"""Fewer index entries per task (issue 15): a task's updates no longer write an entry for its
NULL context snapshot (the index holds only the tasks that name one), and a client token is
no longer indexed by its run twice, nor by pattern (the LIKE index Django adds beside a text
primary key on PostgreSQL; tokens are only looked up by equality)."""

import django.db.models.deletion
from django.db import migrations, models


def _like_index(schema_editor, apps):
    model = apps.get_model("parallel_mcp", "ClientTokenRecord")
    field = model._meta.get_field("token")
    name = schema_editor._create_index_name(model._meta.db_table, [field.column], suffix="_like")
    return model, field, name


def drop_token_like_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    _model, _field, name = _like_index(schema_editor, apps)
    schema_editor.execute(f"DROP INDEX IF EXISTS {schema_editor.quote_name(name)}")


def restore_token_like_index(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    model, field, _name = _like_index(schema_editor, apps)
    schema_editor.execute(schema_editor._create_like_index_sql(model, field))


class Migration(migrations.Migration):
    dependencies = [
        ("parallel_mcp", "0008_mcp_tool_calls"),
    ]

    operations = [
        migrations.RemoveIndex(
            model_name="clienttokenrecord",
            name="pmcp_client_token_run_idx",
        ),
        migrations.AlterField(
            model_name="task",
            name="context_snapshot",
            field=models.ForeignKey(
                blank=True,
                db_index=False,
                null=True,
                on_delete=django.db.models.deletion.DO_NOTHING,
                related_name="+",
                to="parallel_mcp.contextsnapshot",
            ),
        ),
        migrations.AddIndex(
            model_name="task",
            index=models.Index(
                condition=models.Q(("context_snapshot__isnull", False)),
                fields=["context_snapshot"],
                name="pmcp_task_context_snapshot_idx",
            ),
        ),
        migrations.RunPython(drop_token_like_index, restore_token_like_index),
    ]

"""ToolCall.expires_at (created_at + ttl_ms), so that expired MCP tasks are found by index."""

from datetime import timedelta

from django.db import migrations, models


def fill_expires_at(apps, schema_editor):
    ToolCall = apps.get_model("parallel_mcp", "ToolCall")
    using = schema_editor.connection.alias
    calls = (
        ToolCall.objects.using(using)
        .filter(ttl_ms__isnull=False)
        .only("pk", "created_at", "ttl_ms")
    )
    for call in calls.iterator():
        expires_at = call.created_at + timedelta(milliseconds=call.ttl_ms)
        ToolCall.objects.using(using).filter(pk=call.pk).update(expires_at=expires_at)


class Migration(migrations.Migration):
    dependencies = [
        ("parallel_mcp", "0009_write_fewer_index_entries"),
    ]

    operations = [
        migrations.AddField(
            model_name="toolcall",
            name="expires_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(fill_expires_at, migrations.RunPython.noop, elidable=True),
        migrations.AddIndex(
            model_name="toolcall",
            index=models.Index(
                condition=models.Q(("expires_at__isnull", False)),
                fields=["expires_at"],
                name="pmcp_tool_call_expiry_idx",
            ),
        ),
    ]

"""The start-up check of the commands that use the database: its parallel_mcp migrations must
all be applied. Without it a forgotten ``migrate`` shows up later as "no such table" tracebacks
(or, in the worker, as database hiccups retried forever)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import OperationalError, connections
from django.db.migrations.executor import MigrationExecutor

APP_LABEL = "parallel_mcp"


@dataclass(frozen=True)
class SchemaState:
    unapplied: list[str]  # parallel_mcp migrations migrate would still apply, in order
    any_applied: bool  # whether the database has parallel_mcp tables at all


def schema_state(using: str) -> SchemaState:
    """Read from Django's migration records (one query), not by trying the tables."""
    executor = MigrationExecutor(connections[using])
    targets = [node for node in executor.loader.graph.leaf_nodes() if node[0] == APP_LABEL]
    plan = executor.migration_plan(targets)
    return SchemaState(
        unapplied=[migration.name for migration, _ in plan if migration.app_label == APP_LABEL],
        any_applied=any(app == APP_LABEL for app, _ in executor.loader.applied_migrations),
    )


def require_migrated(using: str) -> None:
    """A one-line ``CommandError`` (exit status 1) when parallel_mcp's tables are missing or
    behind the code, or when the database cannot be reached at all."""
    try:
        state = schema_state(using)
    except OperationalError as exc:  # the connection itself failed: say so in one line
        detail = " ".join(str(exc).split())
        raise CommandError(f"{APP_LABEL}: cannot reach the database {using!r}: {detail}") from None
    if not state.unapplied:
        return
    command = "python manage.py migrate" + ("" if using == "default" else f" --database {using}")
    if not state.any_applied:
        raise CommandError(
            f"{APP_LABEL}: the database {using!r} has no {APP_LABEL} tables — run `{command}`"
        )
    raise CommandError(
        f"{APP_LABEL}: the database {using!r} lacks the {APP_LABEL} migration(s) "
        f"{', '.join(state.unapplied)} — run `{command}`"
    )


class DatabaseCommand(BaseCommand):
    """Base of the commands that use parallel_mcp's tables. Each calls ``require_migrated``
    once its options are checked; Django's system checks run without the databases, which
    Django 6 would otherwise open first, answering an unreachable one with a traceback."""

    def get_check_kwargs(self, options: Any) -> Any:  # Django 6 (5.2 checks no database)
        kwargs = super().get_check_kwargs(options)
        kwargs["databases"] = []
        return kwargs

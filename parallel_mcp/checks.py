"""System checks with stable ids.

- parallel_mcp.E001: ``PARALLEL_MCP`` is not a dict.
- parallel_mcp.E002: ``PARALLEL_MCP`` has an unknown key.
- parallel_mcp.E003: a ``PARALLEL_MCP`` value has the wrong type or range.
- parallel_mcp.E004: the database parallel_mcp writes to is not SQLite 3.35+ or PostgreSQL.
- parallel_mcp.E005: a model of the project has a relation to ``parallel_mcp.Lease`` (a view).
- parallel_mcp.W001: a SQLite database does not use IMMEDIATE transactions.
- parallel_mcp.W002: a SQLite database does not use WAL journal mode.
"""

from __future__ import annotations

import difflib
from typing import Any

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register

from .conf import DEFAULTS, SETTING_NAME

_POSITIVE_INTS = (
    "DEFAULT_LEASE_MS",
    "DEFAULT_LIST_LIMIT",
    "MAX_LIST_LIMIT",
    "DEFAULT_EVENT_PAGE_LIMIT",
    "DEFAULT_PRUNE_LIMIT",
    "MAX_JSON_BYTES",
    "AUTH_FAILURE_WINDOW_SECONDS",
    "WORKER_PRESENCE_INTERVAL_MS",
    "MCP_TASK_POLL_INTERVAL_MS",
    "MCP_TOOL_WAIT_TIMEOUT_MS",
    "MCP_TASK_NOTIFY_POLL_MS",
)
_POSITIVE_INTS_OR_NONE = (
    "AUTH_FAILURE_LIMIT",
    "MCP_TASK_TTL_MS",
    "WORKER_LEASE_EXPIRY_INTERVAL_MS",
)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


# The whole fix, in the hint itself: it is read where the docs may not be (a pip install).
SQLITE_FIX = (
    'Add to the database\'s OPTIONS: {"transaction_mode": "IMMEDIATE", "init_command": '
    '"PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=20000", '
    '"timeout": 20}. IMMEDIATE takes the write lock when a transaction begins, so a write '
    "never fails halfway; WAL lets readers run while a writer commits; the timeouts let a "
    "connection wait up to 20 s for the write lock."
)


@register(Tags.compatibility)
def check_settings(app_configs: Any = None, **kwargs: Any) -> list:
    value = getattr(settings, SETTING_NAME, None)
    if value is None:
        return []
    if not isinstance(value, dict):
        return [
            Error(
                f"settings.{SETTING_NAME} must be a dict, not {type(value).__name__}.",
                id="parallel_mcp.E001",
            )
        ]
    errors: list = []
    for key in value:
        if key not in DEFAULTS:
            close = difflib.get_close_matches(str(key), DEFAULTS, n=1)
            hint = f"Did you mean {close[0]!r}?" if close else f"Known keys: {', '.join(DEFAULTS)}."
            errors.append(
                Error(
                    f"Unknown key {key!r} in settings.{SETTING_NAME}.",
                    hint=hint,
                    id="parallel_mcp.E002",
                )
            )
    for key in _POSITIVE_INTS:
        if key in value and not _positive_int(value[key]):
            errors.append(
                Error(
                    f"settings.{SETTING_NAME}[{key!r}] must be a positive integer, "
                    f"got {value[key]!r}.",
                    id="parallel_mcp.E003",
                )
            )
    for key in _POSITIVE_INTS_OR_NONE:
        if key in value and value[key] is not None and not _positive_int(value[key]):
            errors.append(
                Error(
                    f"settings.{SETTING_NAME}[{key!r}] must be a positive integer or None, "
                    f"got {value[key]!r}.",
                    id="parallel_mcp.E003",
                )
            )
    if "HANDLERS" in value and not isinstance(value["HANDLERS"], dict):
        errors.append(
            Error(
                f"settings.{SETTING_NAME}['HANDLERS'] must map task kinds to dotted paths.",
                id="parallel_mcp.E003",
            )
        )
    if "DATABASE_ALIAS" in value and value["DATABASE_ALIAS"] not in settings.DATABASES:
        errors.append(
            Error(
                f"settings.{SETTING_NAME}['DATABASE_ALIAS'] names {value['DATABASE_ALIAS']!r}, "
                "which is not in settings.DATABASES.",
                id="parallel_mcp.E003",
            )
        )
    return errors


@register(Tags.database, deploy=False)
def check_sqlite(app_configs: Any = None, **kwargs: Any) -> list:
    return sqlite_warnings(settings.DATABASES)


def sqlite_warnings(databases: dict[str, dict[str, Any]]) -> list:
    """Warnings for SQLite databases not set up for concurrent workers."""
    warnings: list = []
    for alias, config in databases.items():
        if "sqlite" not in str(config.get("ENGINE", "")):
            continue
        options = config.get("OPTIONS") or {}
        if str(options.get("transaction_mode", "")).upper() != "IMMEDIATE":
            warnings.append(
                Warning(
                    f"SQLite database {alias!r} does not use IMMEDIATE transactions: concurrent "
                    "workers can fail with 'database is locked' in the middle of a write.",
                    hint=SQLITE_FIX,
                    id="parallel_mcp.W001",
                )
            )
        name = str(config.get("NAME", ""))
        in_memory = name in ("", ":memory:") or "mode=memory" in name
        init = str(options.get("init_command", "")).lower().replace(" ", "")
        if not in_memory and "journal_mode=wal" not in init:
            warnings.append(
                Warning(
                    f"SQLite database {alias!r} is not configured for WAL journal mode: readers "
                    "block the writer and workers serialise on every read.",
                    hint=SQLITE_FIX,
                    id="parallel_mcp.W002",
                )
            )
    return warnings


@register(Tags.database)
def check_database(app_configs: Any = None, **kwargs: Any) -> list:
    """The database parallel_mcp writes to is one its SQL is written for (services/dialect.py).
    Tagged ``database``: it runs with ``migrate`` and ``check --database``, which may connect."""
    from .services.dialect import UnsupportedDatabase, dialect_for

    value = getattr(settings, SETTING_NAME, None)
    alias = (value if isinstance(value, dict) else DEFAULTS).get("DATABASE_ALIAS", "default")
    if alias not in settings.DATABASES:
        return []  # E003 says so
    try:
        dialect_for(alias)
    except UnsupportedDatabase as exc:
        return [Error(str(exc), obj=f"DATABASES[{alias!r}]", id="parallel_mcp.E004")]
    return []


@register(Tags.models)
def check_relations_to_leases(app_configs: Any = None, **kwargs: Any) -> list:
    from django.apps import apps

    return lease_relations(apps.get_models())


def lease_relations(models: Any) -> list:
    """``pmcp_lease`` is a view of ``pmcp_attempt`` (migration 0013): no foreign key of the
    project's can point at it (SQLite fails the migration with "foreign key mismatch",
    PostgreSQL refuses it)."""
    from .models import Lease

    return [
        Error(
            f"{model._meta.label}.{field.name} relates to parallel_mcp.Lease, which is a "
            "read-only view of parallel_mcp.Attempt: a foreign key cannot point at it.",
            hint="Point it at parallel_mcp.Attempt instead: a lease has its attempt's id, "
            "and deleting the attempt cascades as deleting the lease did.",
            obj=field,
            id="parallel_mcp.E005",
        )
        for model in models
        if model._meta.app_label != "parallel_mcp"
        for field in model._meta.get_fields()
        if field.concrete and field.is_relation and field.related_model is Lease
    ]

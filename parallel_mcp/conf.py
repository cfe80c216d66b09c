"""App settings: one ``settings.PARALLEL_MCP`` dict, read lazily and reloaded on change."""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver

SETTING_NAME = "PARALLEL_MCP"

DEFAULTS: dict[str, Any] = {
    # Lease length for claims and heartbeats when the caller gives none (milliseconds).
    "DEFAULT_LEASE_MS": 30_000,
    # The longest lease a claim or heartbeat may ask for (milliseconds): one hour.
    "MAX_LEASE_MS": 3_600_000,
    # Default and ceiling of `limit` for list methods.
    "DEFAULT_LIST_LIMIT": 100,
    "MAX_LIST_LIMIT": 1_000,
    "DEFAULT_EVENT_PAGE_LIMIT": 200,
    # Runs pruned per prune_runs call when no limit is given.
    "DEFAULT_PRUNE_LIMIT": 500,
    # Largest JSON document accepted for input/output/metadata/payload/context (bytes).
    "MAX_JSON_BYTES": 1_048_576,
    # Database alias the Orchestrator uses when none is given.
    "DATABASE_ALIAS": "default",
    # Optional mapping of task kind -> dotted path of a handler (worker issue).
    "HANDLERS": {},
    # Refused bearer tokens accepted from one client address per window before its tokens
    # are no longer checked until the window ends (HTTP API and MCP HTTP); None: no limit.
    "AUTH_FAILURE_LIMIT": 20,
    "AUTH_FAILURE_WINDOW_SECONDS": 60,
    # How often a worker reports that it runs and which kinds it handles (milliseconds); it
    # counts as gone after three missed reports.
    "WORKER_PRESENCE_INTERVAL_MS": 10_000,
    # How often a local pmcp_worker expires lapsed leases (any worker's), so that the tasks of
    # a worker killed mid-task are retried without a pmcp_expire_leases loop (milliseconds);
    # None: workers leave it to pmcp_expire_leases. Remote (--api) workers never do it.
    "WORKER_LEASE_EXPIRY_INTERVAL_MS": 5_000,
    # MCP tools declared with @tool (docs/mcp-tasks.md): a task's time to live, stated to the
    # client as ttlMs (None: unlimited) ...
    "MCP_TASK_TTL_MS": 86_400_000,
    # ... how often the client should poll tasks/get (pollIntervalMs) ...
    "MCP_TASK_POLL_INTERVAL_MS": 1_000,
    # ... how long a call answered without a task handle waits for the tool's result ...
    "MCP_TOOL_WAIT_TIMEOUT_MS": 300_000,
    # ... and how often a pmcp_mcp process reads the event log for clients that listen to
    # notifications/tasks (one read per process, whatever the number of listeners).
    "MCP_TASK_NOTIFY_POLL_MS": 500,
}


class AppSettings:
    """Attribute access to the merged settings; the user dict is read on first use."""

    def __init__(self) -> None:
        self._cache: dict[str, Any] | None = None

    @property
    def user_settings(self) -> dict[str, Any]:
        value = getattr(django_settings, SETTING_NAME, None)
        return dict(value) if isinstance(value, dict) else {}

    def _merged(self) -> dict[str, Any]:
        if self._cache is None:
            merged = dict(DEFAULTS)
            merged.update({k: v for k, v in self.user_settings.items() if k in DEFAULTS})
            self._cache = merged
        return self._cache

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"Unknown parallel_mcp setting {name!r}")
        return self._merged()[name]

    def reload(self) -> None:
        self._cache = None


app_settings = AppSettings()


@receiver(setting_changed)
def _reload_on_change(*, setting: str, **kwargs: Any) -> None:
    if setting == SETTING_NAME:
        app_settings.reload()

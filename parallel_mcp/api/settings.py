"""Settings of the HTTP API: the optional ``settings.PARALLEL_MCP_API`` dict over the defaults
below, read lazily and reloaded when the setting changes (``override_settings`` in tests).

Throttle rates are DRF's own: ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]`` with the scopes
``pmcp`` and ``pmcp_worker`` (see ``throttling.py``).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils.module_loading import import_string

SETTING_NAME = "PARALLEL_MCP_API"

DEFAULTS: dict[str, Any] = {
    # DRF authentication classes of every API view (dotted paths). The first one decides the
    # WWW-Authenticate header, so a missing or bad credential is a 401, not a 403.
    "AUTHENTICATION_CLASSES": (
        "parallel_mcp.api.authentication.BearerTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ),
    # Largest request body accepted (bytes); bigger ones get 413. None: Django's
    # DATA_UPLOAD_MAX_MEMORY_SIZE, or 8 MiB when that is None too.
    "MAX_BODY_BYTES": None,
    # Default page size of the keyset-paginated lists (the ceiling is PARALLEL_MCP's
    # MAX_LIST_LIMIT).
    "PAGE_SIZE": 50,
    # Attempts shown in a task's detail (the most recent ones).
    "TASK_DETAIL_ATTEMPTS": 100,
    # The Server-Sent Events stream: how often it looks for new events, how often it sends a
    # heartbeat comment when nothing happens, how long a connection lives by default and at
    # most (a client asks for less with ?timeout=), and the reconnect delay it advises.
    "SSE_POLL_SECONDS": 1.0,
    "SSE_HEARTBEAT_SECONDS": 15.0,
    "SSE_DEFAULT_SECONDS": 60.0,
    "SSE_MAX_SECONDS": 300.0,
    "SSE_RETRY_MS": 3_000,
    "SSE_BATCH": 200,
    # Event streams open at once in one server process: per token (per user for session
    # logins), and in all. One more is refused (429 / 503 too_many_streams) until one ends.
    # None: no limit.
    "SSE_MAX_STREAMS_PER_TOKEN": 10,
    "SSE_MAX_STREAMS": 100,
}

DEFAULT_MAX_BODY_BYTES = 8 * 1024 * 1024


class ApiSettings:
    def __init__(self) -> None:
        self._cache: dict[str, Any] | None = None

    def _merged(self) -> dict[str, Any]:
        if self._cache is None:
            user = getattr(django_settings, SETTING_NAME, None)
            merged = dict(DEFAULTS)
            if isinstance(user, dict):
                merged.update({k: v for k, v in user.items() if k in DEFAULTS})
            self._cache = merged
        return self._cache

    def __getattr__(self, name: str) -> Any:
        if name not in DEFAULTS:
            raise AttributeError(f"Unknown {SETTING_NAME} setting {name!r}")
        return self._merged()[name]

    @property
    def max_body_bytes(self) -> int:
        value = self.MAX_BODY_BYTES
        if value is None:
            value = getattr(django_settings, "DATA_UPLOAD_MAX_MEMORY_SIZE", None)
        return int(value) if value is not None else DEFAULT_MAX_BODY_BYTES

    def authentication_classes(self) -> list[type]:
        return [
            import_string(path) if isinstance(path, str) else path
            for path in self.AUTHENTICATION_CLASSES
        ]

    def reload(self) -> None:
        self._cache = None


api_settings = ApiSettings()


@receiver(setting_changed)
def _reload_on_change(*, setting: str, **kwargs: Any) -> None:
    if setting in (SETTING_NAME, "DATA_UPLOAD_MAX_MEMORY_SIZE"):
        api_settings.reload()

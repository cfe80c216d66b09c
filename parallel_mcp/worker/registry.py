"""Handlers by task kind: ``@handler("kind")`` in any installed app's ``pmcp_handlers``
module, plus ``PARALLEL_MCP["HANDLERS"]`` (kind -> dotted path), plus one per queue of a
``settings.TASKS`` backend served by parallel_mcp. A kind registered twice is an error at
start-up."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import autodiscover_modules, import_string

HANDLER_MODULE = "pmcp_handlers"

Handler = Callable[[Any], Any]


class DuplicateHandlerError(ImproperlyConfigured):
    pass


class HandlerRegistry:
    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}
        self._origins: dict[str, str] = {}

    def register(self, kind: str, function: Handler) -> Handler:
        if not isinstance(kind, str) or not kind.strip():
            raise ImproperlyConfigured(f"A handler's kind must be a non-empty string: {kind!r}")
        if not callable(function):
            raise ImproperlyConfigured(f"The handler for {kind!r} is not callable: {function!r}")
        origin = f"{getattr(function, '__module__', '?')}.{getattr(function, '__qualname__', '?')}"
        existing = self._handlers.get(kind)
        if existing is not None and existing is not function:
            raise DuplicateHandlerError(
                f"Task kind {kind!r} has two handlers: {self._origins[kind]} and {origin}. "
                "Each kind must have exactly one."
            )
        self._handlers[kind] = function
        self._origins[kind] = origin
        return function

    def get(self, kind: str) -> Handler | None:
        return self._handlers.get(kind)

    def kinds(self) -> list[str]:
        return sorted(self._handlers)

    def origin(self, kind: str) -> str:
        return self._origins[kind]

    def __contains__(self, kind: object) -> bool:
        return kind in self._handlers

    def __len__(self) -> int:
        return len(self._handlers)

    def clear(self) -> None:
        self._handlers.clear()
        self._origins.clear()


registry = HandlerRegistry()


def handler(kind: str, *, registry: HandlerRegistry = registry) -> Callable[[Handler], Handler]:
    """Register the decorated function as the handler of ``kind``."""

    def decorate(function: Handler) -> Handler:
        return registry.register(kind, function)

    return decorate


def load_settings_handlers(mapping: Any, *, target: HandlerRegistry = registry) -> None:
    if not mapping:
        return
    if not isinstance(mapping, dict):
        raise ImproperlyConfigured("PARALLEL_MCP['HANDLERS'] must map task kinds to dotted paths.")
    for kind, path in mapping.items():
        try:
            function = import_string(path) if isinstance(path, str) else path
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"PARALLEL_MCP['HANDLERS'][{kind!r}] = {path!r} cannot be imported: {exc}"
            ) from exc
        target.register(kind, function)


def load_task_backend_handlers(*, target: HandlerRegistry = registry) -> None:
    """When ``settings.TASKS`` uses parallel_mcp's backend for Django's Tasks framework, a
    handler for each of its queues (docs/django-tasks.md). Nothing is imported otherwise."""
    from django.conf import settings

    configured = getattr(settings, "TASKS", None)
    if not isinstance(configured, dict) or not any(
        isinstance(config, dict) and str(config.get("BACKEND", "")).startswith("parallel_mcp.")
        for config in configured.values()
    ):
        return
    from ..tasks_backend import register_queue_handlers

    register_queue_handlers(target)


def autodiscover() -> None:
    """Import every installed app's ``pmcp_handlers`` module, then the settings mapping, then
    the queues of ``settings.TASKS`` served by parallel_mcp."""
    from ..conf import app_settings

    autodiscover_modules(HANDLER_MODULE)
    load_settings_handlers(app_settings.HANDLERS)
    load_task_backend_handlers()

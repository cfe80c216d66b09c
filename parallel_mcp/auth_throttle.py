"""Failed token authentications, counted per client address, for the HTTP API and the MCP HTTP
transport alike.

After ``AUTH_FAILURE_LIMIT`` refused bearer tokens from one address within a window of
``AUTH_FAILURE_WINDOW_SECONDS`` (fixed windows), every further token from that address is
refused without being checked until the window ends: the API answers ``429`` with code
``auth_throttled``, the MCP transport ``429``; both send ``Retry-After``. A successful
authentication is neither counted nor slowed beyond one cache read. ``AUTH_FAILURE_LIMIT =
None`` turns the limit off.

The counters live in Django's default cache (as DRF's throttles do): with several server
processes, use a cache they share. Requests already being checked when the limit is reached
still finish, so a burst of concurrent requests can overshoot it by their number.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from typing import TypeVar

from django.core.cache import cache

from .conf import app_settings

T = TypeVar("T")

CODE = "auth_throttled"
MESSAGE = "Too many failed authentication attempts from this address."
KEY_PREFIX = "pmcp:auth-failures:"

clock: Callable[[], float] = time.time  # the moment windows are read at (tests stop it)


class AuthThrottled(Exception):
    """An address is over its failed-authentication limit; ``wait`` seconds remain."""

    def __init__(self, wait: int) -> None:
        super().__init__(MESSAGE)
        self.wait = wait


def _window(address: str, now: float) -> tuple[str, int]:
    """The cache key of ``address``'s current window and the whole seconds left in it."""
    seconds = int(app_settings.AUTH_FAILURE_WINDOW_SECONDS)
    index = int(now // seconds)
    digest = hashlib.sha256(address.encode()).hexdigest()[:32]  # any address is a valid key
    left = max(1, math.ceil((index + 1) * seconds - now))
    return f"{KEY_PREFIX}{digest}:{index}", left


def retry_after(address: str, *, now: float | None = None) -> int | None:
    """Seconds ``address`` must wait before its tokens are checked again, or None."""
    limit = app_settings.AUTH_FAILURE_LIMIT
    if limit is None:
        return None
    key, left = _window(address, clock() if now is None else now)
    return left if cache.get(key, 0) >= limit else None


def record_failure(address: str, *, now: float | None = None) -> None:
    if app_settings.AUTH_FAILURE_LIMIT is None:
        return
    key, left = _window(address, clock() if now is None else now)
    # add() then incr(): atomic in every cache backend that is shared between processes.
    if not cache.add(key, 1, timeout=left + 1):
        try:
            cache.incr(key)
        except ValueError:  # the window's entry expired between add() and incr()
            cache.add(key, 1, timeout=left + 1)


def attempt(address: str, check: Callable[[], T | None], *, now: float | None = None) -> T | None:
    """``check()`` (a token lookup that answers None for a refused token), unless ``address``
    is over its limit (``AuthThrottled``); a refusal counts against the address."""
    wait = retry_after(address, now=now)
    if wait is not None:
        raise AuthThrottled(wait)
    result = check()
    if result is None:
        record_failure(address, now=now)
    return result

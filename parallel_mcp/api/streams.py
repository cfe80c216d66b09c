"""How many Server-Sent Events streams are open, per token and in all, in this server process.

The stream view takes a slot before it answers (refused with ``too_many_streams`` when
``SSE_MAX_STREAMS_PER_TOKEN`` or ``SSE_MAX_STREAMS`` is reached) and hands it to the response,
which gives it back however the stream ends: at its timeout, when the server closes the response
after the client went away (WSGI), when the ASGI task is cancelled, or at the latest when the
response is garbage-collected without ever being sent. Counting in memory is exact and cannot
leak slots past a crash; with several server processes the limits apply to each.
"""

from __future__ import annotations

import math
import threading
import weakref
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from typing import Any

from rest_framework import exceptions as drf
from rest_framework import status

from ..models import ApiToken
from .settings import api_settings

CODE = "too_many_streams"


def _retry_after() -> int:
    """Retry in the reconnect delay the stream advises (at least a second)."""
    return max(1, math.ceil(int(api_settings.SSE_RETRY_MS) / 1000))


class TooManyStreams(drf.APIException):
    """The token (or session user) has as many streams open as it may."""

    status_code = status.HTTP_429_TOO_MANY_REQUESTS
    default_code = CODE

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"This token already has {limit} event streams open, the most "
            "SSE_MAX_STREAMS_PER_TOKEN allows; close one or wait until one ends.",
            CODE,
        )
        self.wait = _retry_after()
        self.details = {"limit": limit, "scope": "token", "wait": self.wait}


class StreamsExhausted(drf.APIException):
    """The server process has as many streams open as it may, from all clients."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = CODE

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"The server already has {limit} event streams open, the most SSE_MAX_STREAMS "
            "allows; retry later.",
            CODE,
        )
        self.wait = _retry_after()
        self.details = {"limit": limit, "scope": "server", "wait": self.wait}


def _limit(value: Any) -> int | None:
    return None if value is None else int(value)


class StreamSlots:
    """Counts of open streams by owner (thread-safe: WSGI threads, ASGI's event loop)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_owner: Counter[str] = Counter()

    def open_count(self, owner: str | None = None) -> int:
        with self._lock:
            return self._by_owner[owner] if owner else sum(self._by_owner.values())

    def acquire(self, owner: str) -> Slot:
        """A slot for one more stream of ``owner``, or TooManyStreams / StreamsExhausted."""
        per_owner = _limit(api_settings.SSE_MAX_STREAMS_PER_TOKEN)
        total = _limit(api_settings.SSE_MAX_STREAMS)
        with self._lock:
            if per_owner is not None and self._by_owner[owner] >= per_owner:
                raise TooManyStreams(per_owner)
            if total is not None and sum(self._by_owner.values()) >= total:
                raise StreamsExhausted(total)
            self._by_owner[owner] += 1
        return Slot(self, owner)

    def _release(self, owner: str) -> None:
        with self._lock:
            self._by_owner[owner] -= 1
            if self._by_owner[owner] <= 0:
                del self._by_owner[owner]


class Slot:
    """One open stream; ``release()`` may be called any number of times, it counts once."""

    def __init__(self, slots: StreamSlots, owner: str) -> None:
        self._slots = slots
        self._owner = owner
        self._held = True
        self._lock = threading.Lock()

    @property
    def held(self) -> bool:
        return self._held

    def release(self) -> None:
        with self._lock:
            if not self._held:
                return
            self._held = False
        self._slots._release(self._owner)


open_streams = StreamSlots()


def stream_owner(request: Any) -> str:
    """Whose streams count together: the bearer token's, else the logged-in user's."""
    if isinstance(request.auth, ApiToken):
        return f"token:{request.auth.pk}"
    return f"user:{request.user.pk}"


class HeldStream:
    """A stream's chunks holding ``slot`` until they end or the response is closed (Django
    registers ``close`` as the response's resource closer, and WSGI servers call it when the
    client has gone)."""

    def __init__(self, chunks: Iterator[str], slot: Slot) -> None:
        self._chunks = chunks
        self._slot = slot
        # The last resort: a response dropped without being sent or closed.
        weakref.finalize(self, slot.release)

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        try:
            return next(self._chunks)
        except BaseException:  # the end (StopIteration) or a failure: the stream is over
            self._slot.release()
            raise

    def close(self) -> None:
        try:
            close = getattr(self._chunks, "close", None)
            if close is not None:  # a generator: runs its ``finally``
                close()
        finally:
            self._slot.release()


class AsyncHeldStream:
    """``HeldStream`` for ASGI servers: an async iterator (so Django streams it as it comes)."""

    def __init__(self, chunks: AsyncIterator[str], slot: Slot) -> None:
        self._chunks = chunks
        self._slot = slot
        weakref.finalize(self, slot.release)

    def __aiter__(self) -> AsyncIterator[str]:
        return self

    async def __anext__(self) -> str:
        try:
            return await self._chunks.__anext__()
        except BaseException:  # the end, or the task cancelled when the client went away
            self._slot.release()
            raise

    def close(self) -> None:
        self._slot.release()

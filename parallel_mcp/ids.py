"""Identifier helpers: time-ordered UUIDs and lenient parsing of caller-supplied ids."""

from __future__ import annotations

import os
import threading
import time
import uuid
from typing import Any

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def new_id() -> uuid.UUID:
    """A UUIDv7 (RFC 9562): millisecond time prefix then a per-process counter and randomness.

    Ids created later sort later, which makes "oldest first" a stable order among tasks created
    in the same millisecond, and keeps B-tree inserts at the right edge of the index.
    """
    global _last_ms, _counter
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            _counter += 1
            if _counter > 0xFFF:  # counter exhausted: borrow the next millisecond
                _last_ms += 1
                _counter = 0
            ms = _last_ms
        else:
            _last_ms = ms
            _counter = int.from_bytes(os.urandom(2), "big") & 0x3FF
        counter = _counter
    rand_b = int.from_bytes(os.urandom(8), "big") & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= counter << 64
    value |= 0b10 << 62
    value |= rand_b
    return uuid.UUID(int=value)


def parse_id(value: Any) -> uuid.UUID | None:
    """A UUID from a UUID or its string form; None when the value is not one."""
    if isinstance(value, uuid.UUID):
        return value
    if isinstance(value, str):
        try:
            return uuid.UUID(value)
        except ValueError:
            return None
    return None

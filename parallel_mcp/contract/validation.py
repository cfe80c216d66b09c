"""The argument checks every service runs, whoever calls it: each bad input becomes a
ValidationError with a sentence naming the argument, before anything is written. The limits
come from :mod:`.limits`; the HTTP API and the MCP tools apply these same functions (through
:mod:`.arguments`) so every door refuses the same values with the same words."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Literal, overload
from uuid import UUID

from django.utils import timezone

from ..conf import app_settings
from ..exceptions import ValidationError
from ..ids import parse_id
from . import limits


def resolve_now(now: datetime | None) -> datetime:
    if now is None:
        return timezone.now()
    result = optional_datetime(now, "now")
    assert result is not None
    return result


def optional_datetime(value: Any, name: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise ValidationError(f"{name} must be a datetime, got {type(value).__name__}.", field=name)
    if timezone.is_naive(value):
        raise ValidationError(
            f"{name} must be timezone-aware (naive datetimes are ambiguous).", field=name
        )
    if not limits.MIN_YEAR <= value.year <= limits.MAX_YEAR:
        raise ValidationError(
            f"{name} must have a year from {limits.MIN_YEAR} to {limits.MAX_YEAR}, "
            f"got {value.isoformat()}.",
            field=name,
        )
    return value.astimezone(UTC)  # within Python's range: the year is far from its edges


def require_id(value: Any, name: str) -> UUID:
    parsed = parse_id(value)
    if parsed is None:
        raise ValidationError(f"{name} must be a UUID, got {_short(value)}.", field=name)
    return parsed


def optional_id(value: Any, name: str) -> UUID | None:
    return None if value is None else require_id(value, name)


@overload
def text(
    value: Any, name: str, *, max_length: int = ..., allow_none: Literal[False] = False
) -> str: ...
@overload
def text(value: Any, name: str, *, max_length: int = ..., allow_none: bool) -> str | None: ...
def text(
    value: Any, name: str, *, max_length: int = limits.NAME_LENGTH, allow_none: bool = False
) -> str | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, str):
        raise ValidationError(f"{name} must be a string, got {type(value).__name__}.", field=name)
    if not value.strip():
        raise ValidationError(f"{name} must not be empty.", field=name)
    if len(value) > max_length:
        raise ValidationError(f"{name} is longer than {max_length} characters.", field=name)
    _storable(value, name)
    return value


def reason(value: Any, name: str = "reason") -> str | None:
    """Optional free text from a person (a reason, a progress message)."""
    return text(value, name, max_length=limits.REASON_LENGTH, allow_none=True)


def _storable(text: str, name: str) -> None:
    """Text every supported database stores: no NUL (PostgreSQL refuses it) and valid
    Unicode (no lone surrogates)."""
    if "\x00" in text:
        raise ValidationError(f"{name} contains a NUL character.", field=name)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(f"{name} is not valid Unicode.", field=name) from None


def _short(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= 80 else f"{shown[:77]}..."


@overload
def integer(
    value: Any,
    name: str,
    *,
    minimum: int | None = ...,
    maximum: int | None = ...,
    allow_none: Literal[False] = False,
) -> int: ...
@overload
def integer(
    value: Any, name: str, *, minimum: int | None = ..., maximum: int | None = ..., allow_none: bool
) -> int | None: ...
def integer(
    value: Any,
    name: str,
    *,
    minimum: int | None = None,
    maximum: int | None = None,
    allow_none: bool = False,
) -> int | None:
    if value is None and allow_none:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValidationError(f"{name} must be an integer, got {_short(value)}.", field=name)
    if minimum is not None and value < minimum:
        raise ValidationError(f"{name} must be >= {minimum}, got {_short(value)}.", field=name)
    if maximum is not None and value > maximum:
        raise ValidationError(f"{name} must be <= {maximum}, got {_short(value)}.", field=name)
    return value


def number(value: Any, name: str, *, minimum: float, maximum: float) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValidationError(f"{name} must be a number, got {_short(value)}.", field=name)
    if not minimum <= value <= maximum:  # also refuses NaN
        raise ValidationError(
            f"{name} must be between {minimum} and {maximum}, got {_short(value)}.", field=name
        )
    return float(value)


def flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValidationError(f"{name} must be true or false, got {_short(value)}.", field=name)
    return value


def positive_ms(value: Any, name: str) -> int:
    return integer(value, name, minimum=1, maximum=limits.MAX_MS)


def lease_ms(value: Any, name: str = "lease_ms") -> int:
    """A lease length: 1 ms up to the MAX_LEASE_MS setting (a lease taken for years would let
    a lost worker hold its task that long)."""
    return integer(value, name, minimum=1, maximum=app_settings.MAX_LEASE_MS)


def json_depth_exceeds(value: Any, limit: int) -> bool:
    """Whether ``value`` nests deeper than ``limit`` containers. Iterative, so a document
    nested thousands of levels deep is measured without recursion."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            children: Iterable[Any] = item.values()
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        if depth + 1 > limit:
            return True
        stack.extend((child, depth + 1) for child in children)
    return False


def json_value(value: Any, name: str) -> Any:
    """A JSON-serialisable value within the depth and size limits (returned unchanged)."""
    if value is None:
        return None
    depth = limits.MAX_JSON_DEPTH
    if json_depth_exceeds(value, depth):
        raise ValidationError(
            f"{name} is nested deeper than {depth} levels.", field=name, limit=depth
        )
    try:
        encoded = json.dumps(value, allow_nan=False, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"{name} is not JSON-serialisable: {exc}.", field=name) from None
    if "\\u0000" in encoded:
        raise ValidationError(f"{name} contains a NUL character.", field=name)
    _storable(encoded, name)
    limit = app_settings.MAX_JSON_BYTES
    if len(encoded.encode()) > limit:
        raise ValidationError(
            f"{name} is larger than {limit} bytes of JSON.", field=name, limit=limit
        )
    return value


def limit(value: Any, *, default: int | None = None, name: str = "limit") -> int:
    if value is None:
        value = default if default is not None else app_settings.DEFAULT_LIST_LIMIT
    return integer(value, name, minimum=1, maximum=app_settings.MAX_LIST_LIMIT)


def offset(value: Any) -> int:
    return integer(value, "offset", minimum=0, maximum=limits.MAX_OFFSET)


def is_list_like(value: Any) -> bool:
    """What the Python interfaces take for a list: any iterable (a tuple, a generator) but a
    string, bytes or a mapping, whose items would be characters or keys."""
    return isinstance(value, Iterable) and not isinstance(value, (str, bytes, Mapping))


def _listed(values: Any, name: str, *, max_items: int) -> list[Any]:
    """A list (``is_list_like``) of at most ``max_items``."""
    if not is_list_like(values):
        raise ValidationError(f"{name} must be a list, got {type(values).__name__}.", field=name)
    result = []
    for item in values:
        result.append(item)
        if len(result) > max_items:
            raise ValidationError(f"{name} has more than {max_items} items.", field=name)
    return result


def choice_list(values: Any, name: str, allowed: Iterable[str]) -> list[str] | None:
    if values is None:
        return None
    if isinstance(values, str):
        values = [values]
    allowed = {str(item) for item in allowed}
    result = []
    for value in _listed(values, name, max_items=limits.MAX_KINDS):
        if not isinstance(value, str) or value not in allowed:
            raise ValidationError(
                f"{name} has {_short(value)}; allowed: {', '.join(sorted(allowed))}.", field=name
            )
        result.append(value)
    return result


def kinds(values: Any) -> list[str] | None:
    if values is None:
        return None
    if isinstance(values, str):
        values = [values]
    result = [
        text(value, "kinds") for value in _listed(values, "kinds", max_items=limits.MAX_KINDS)
    ]
    if not result:
        raise ValidationError(
            "kinds must name at least one kind (or be None for all).", field="kinds"
        )
    return result


def event_types(values: Any) -> list[str] | None:
    if values is None:
        return None
    if isinstance(values, str):
        values = [values]
    items = _listed(values, "event_types", max_items=limits.MAX_EVENT_TYPES)
    return [text(item, "event_types", max_length=limits.EVENT_TYPE_LENGTH) for item in items]


def duration_or_datetime(value: Any, name: str, *, now: datetime) -> datetime:
    """A cut-off time from a datetime, or a timedelta counted back from now."""
    if isinstance(value, timedelta):
        if value < timedelta(0):
            raise ValidationError(f"{name} must not be a negative duration.", field=name)
        if value > timedelta(milliseconds=limits.MAX_PRUNE_AGE_MS):
            raise ValidationError(
                f"{name} must be at most {limits.MAX_PRUNE_AGE_MS // 86_400_000} days.",
                field=name,
            )
        value = now - value
    result = optional_datetime(value, name)
    if result is None:
        raise ValidationError(f"{name} is required (a datetime or a timedelta).", field=name)
    return result

"""Argument validation shared by the services: every bad input becomes a ValidationError
with a sentence that names the argument, before anything is written."""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

from django.utils import timezone

from ..conf import app_settings
from ..exceptions import ValidationError
from ..ids import parse_id


def resolve_now(now: datetime | None) -> datetime:
    if now is None:
        return timezone.now()
    if not isinstance(now, datetime):
        raise ValidationError(f"now must be a datetime, got {type(now).__name__}.", field="now")
    if timezone.is_naive(now):
        raise ValidationError(
            "now must be timezone-aware (naive datetimes are ambiguous).", field="now"
        )
    return now.astimezone(UTC)


def optional_datetime(value: Any, name: str) -> datetime | None:
    if value is None:
        return None
    if not isinstance(value, datetime):
        raise ValidationError(f"{name} must be a datetime, got {type(value).__name__}.", field=name)
    if timezone.is_naive(value):
        raise ValidationError(f"{name} must be timezone-aware.", field=name)
    return value.astimezone(UTC)


def require_id(value: Any, name: str) -> UUID:
    parsed = parse_id(value)
    if parsed is None:
        raise ValidationError(f"{name} must be a UUID, got {value!r}.", field=name)
    return parsed


def optional_id(value: Any, name: str) -> UUID | None:
    return None if value is None else require_id(value, name)


def text(value: Any, name: str, *, max_length: int = 200, allow_none: bool = False) -> str | None:
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


def _storable(text: str, name: str) -> None:
    """Text every supported database stores: no NUL (PostgreSQL refuses it) and valid
    Unicode (no lone surrogates)."""
    if "\x00" in text:
        raise ValidationError(f"{name} contains a NUL character.", field=name)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise ValidationError(f"{name} is not valid Unicode.", field=name) from None


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
        raise ValidationError(f"{name} must be an integer, got {value!r}.", field=name)
    if minimum is not None and value < minimum:
        raise ValidationError(f"{name} must be >= {minimum}, got {value}.", field=name)
    if maximum is not None and value > maximum:
        raise ValidationError(f"{name} must be <= {maximum}, got {value}.", field=name)
    return value


def positive_ms(value: Any, name: str) -> int:
    result = integer(value, name, minimum=1, maximum=10 * 365 * 24 * 3600 * 1000)
    assert result is not None
    return result


def json_value(value: Any, name: str) -> Any:
    """A JSON-serialisable value within the size limit (returned unchanged)."""
    if value is None:
        return None
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
    result = integer(value, name, minimum=1, maximum=app_settings.MAX_LIST_LIMIT)
    assert result is not None
    return result


def offset(value: Any) -> int:
    result = integer(value, "offset", minimum=0)
    assert result is not None
    return result


def choice_list(values: Any, name: str, allowed: Iterable[str]) -> list[str] | None:
    if values is None:
        return None
    if isinstance(values, str):
        values = [values]
    allowed = set(allowed)
    result = []
    for value in values:
        if value not in allowed:
            raise ValidationError(
                f"{name} has {value!r}; allowed: {', '.join(sorted(allowed))}.", field=name
            )
        result.append(value)
    return result


def kinds(values: Any) -> list[str] | None:
    if values is None:
        return None
    if isinstance(values, str):
        values = [values]
    result = [text(value, "kinds") for value in values]
    if not result:
        raise ValidationError(
            "kinds must name at least one kind (or be None for all).", field="kinds"
        )
    return [value for value in result if value is not None]


def duration_or_datetime(value: Any, name: str, *, now: datetime) -> datetime:
    """A cut-off time from a datetime, or a timedelta counted back from now."""
    if isinstance(value, timedelta):
        if value < timedelta(0):
            raise ValidationError(f"{name} must not be a negative duration.", field=name)
        return now - value
    result = optional_datetime(value, name)
    if result is None:
        raise ValidationError(f"{name} is required (a datetime or a timedelta).", field=name)
    return result

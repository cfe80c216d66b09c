"""Argument kinds: each carries one rule of the contract to every door.

A kind knows three things about a value:

* ``from_wire(value, name)``: the Python value from its JSON form, refusing wrong JSON types
  (``"id": false`` is not a UUID, ``"start": "yes"`` is not a boolean);
* ``check(value, name)``: the rule itself, run by the services for every caller (the checks of
  :mod:`.validation`, with the limits of :mod:`.limits`);
* ``schema()``: the JSON Schema of a valid value, which the MCP tools publish and the HTTP
  API's OpenAPI schema shows (through ``parallel_mcp.api.serializers.fields.Arg``).

The kinds below are the named arguments of the contract (``REASON``, ``LEASE_MS``, …); the
services, the API serializers and the MCP tool schemas all use these objects, so a limit that
changes here changes everywhere.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from ..exceptions import ValidationError
from . import limits
from . import validation as v
from .shapes import any_json

# A string with at least one non-space character and no NUL (what ``validation.text`` keeps).
NON_BLANK_PATTERN = r"^[^\u0000]*[^\s\u0000][^\u0000]*$"


class Kind:
    """The base of argument kinds (see the module docstring)."""

    description: str = ""

    def from_wire(self, value: Any, name: str) -> Any:
        return self.check(value, name)

    def check(self, value: Any, name: str) -> Any:
        raise NotImplementedError

    def schema(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class Text(Kind):
    max_length: int = limits.NAME_LENGTH

    def check(self, value: Any, name: str) -> str:
        return v.text(value, name, max_length=self.max_length)

    def schema(self) -> dict[str, Any]:
        return {
            "type": "string",
            "minLength": 1,
            "maxLength": self.max_length,
            "pattern": NON_BLANK_PATTERN,
        }


@dataclass(frozen=True)
class Integer(Kind):
    minimum: int | None = None
    maximum: int | None = None

    def check(self, value: Any, name: str) -> int:
        result = v.integer(value, name, minimum=self.minimum, maximum=self.maximum)
        assert result is not None
        return result

    def schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = {"type": "integer"}
        if self.minimum is not None:
            schema["minimum"] = self.minimum
        if self.maximum is not None:
            schema["maximum"] = self.maximum
        return schema


@dataclass(frozen=True)
class Number(Kind):
    minimum: float
    maximum: float

    def check(self, value: Any, name: str) -> float:
        return v.number(value, name, minimum=self.minimum, maximum=self.maximum)

    def schema(self) -> dict[str, Any]:
        return {"type": "number", "minimum": self.minimum, "maximum": self.maximum}


@dataclass(frozen=True)
class Flag(Kind):
    def check(self, value: Any, name: str) -> bool:
        return v.flag(value, name)

    def schema(self) -> dict[str, Any]:
        return {"type": "boolean"}


@dataclass(frozen=True)
class Id(Kind):
    def from_wire(self, value: Any, name: str) -> Any:
        if not isinstance(value, str):
            raise ValidationError(
                f"{name} must be a UUID string, got {type(value).__name__}.", field=name
            )
        return v.require_id(value, name)

    def check(self, value: Any, name: str) -> Any:
        return v.require_id(value, name)

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "format": "uuid"}


# RFC 3339 date-time, with its mandatory offset (what JSON Schema's "date-time" means).
_RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


@dataclass(frozen=True)
class When(Kind):
    def from_wire(self, value: Any, name: str) -> datetime:
        if not isinstance(value, str) or not _RFC3339.match(value):
            raise ValidationError(
                f"{name} must be an ISO 8601 date-time with a time zone "
                f"(e.g. 2026-01-01T12:00:00Z), got {v._short(value)}.",
                field=name,
            )
        try:
            parsed = parse_datetime(value.replace("z", "Z").replace("t", "T"))
        except ValueError:
            parsed = None
        if parsed is None:
            raise ValidationError(f"{name} is not a valid date-time: {value!r}.", field=name)
        return self.check(parsed, name)

    def check(self, value: Any, name: str) -> datetime:
        result = v.optional_datetime(value, name)
        if result is None:
            raise ValidationError(f"{name} is required.", field=name)
        return result

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "format": "date-time"}


@dataclass(frozen=True)
class Json(Kind):
    """Any JSON value within the depth (limits.MAX_JSON_DEPTH) and size (MAX_JSON_BYTES)
    limits, with no NUL characters in its strings. Its schema, like every kind's, leaves
    null to the door (``shapes.nullable``, or the API's ``allow_null``)."""

    def check(self, value: Any, name: str) -> Any:
        return v.json_value(value, name)

    def schema(self) -> dict[str, Any]:
        return any_json()


@dataclass(frozen=True)
class Choice(Kind):
    values: tuple[str, ...]

    def check(self, value: Any, name: str) -> str:
        if not isinstance(value, str) or value not in self.values:
            raise ValidationError(
                f"{name} must be one of {', '.join(self.values)}; got {v._short(value)}.",
                field=name,
            )
        return value

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "enum": list(self.values)}


@dataclass(frozen=True)
class ListOf(Kind):
    item: Kind
    max_items: int
    min_items: int = 0
    unique: bool = field(default=False)

    def _items(self, value: Any, name: str) -> list[Any]:
        if not isinstance(value, list):
            raise ValidationError(f"{name} must be a list, got {type(value).__name__}.", field=name)
        if len(value) > self.max_items:
            raise ValidationError(f"{name} has more than {self.max_items} items.", field=name)
        if len(value) < self.min_items:
            raise ValidationError(f"{name} needs at least {self.min_items} item(s).", field=name)
        return value

    def from_wire(self, value: Any, name: str) -> list[Any]:
        return [self.item.from_wire(item, name) for item in self._items(value, name)]

    def check(self, value: Any, name: str) -> list[Any]:
        # In Python any iterable but a string or a mapping will do (a tuple, a generator).
        if isinstance(value, (str, bytes, dict)) or not isinstance(value, Iterable):
            raise ValidationError(f"{name} must be a list, got {type(value).__name__}.", field=name)
        return [self.item.check(item, name) for item in self._items(list(value), name)]

    def schema(self) -> dict[str, Any]:
        schema: dict[str, Any] = {
            "type": "array",
            "items": self.item.schema(),
            "maxItems": self.max_items,
        }
        if self.min_items:
            schema["minItems"] = self.min_items
        if self.unique:
            schema["uniqueItems"] = True
        return schema


# -- the contract's arguments -------------------------------------------------------------------
NAME = Text(limits.NAME_LENGTH)
REASON = Text(limits.REASON_LENGTH)
ERROR = Text(limits.ERROR_LENGTH)
EVENT_TYPE = Text(limits.EVENT_TYPE_LENGTH)
ID = Id()
WHEN = When()
JSON = Json()
FLAG = Flag()
DURATION_MS = Integer(1, limits.MAX_MS)  # lease_ms, timeout_ms
THRESHOLD_MS = Integer(0, limits.MAX_MS)  # list_stuck_tasks
RETRY_DELAY_MS = Integer(0, limits.MAX_RETRY_DELAY_MS)
PRIORITY = Integer(limits.PRIORITY_MIN, limits.PRIORITY_MAX)
MAX_ATTEMPTS = Integer(1, limits.MAX_ATTEMPTS)
MAX_PARALLEL = Integer(1, limits.MAX_PARALLEL)
OFFSET = Integer(0, limits.MAX_OFFSET)
EVENT_ID = Integer(0, limits.MAX_EVENT_ID)
CLAIM_LIMIT = Integer(1, limits.MAX_CLAIM_BATCH)
PRUNE_AGE_MS = Integer(0, limits.MAX_PRUNE_AGE_MS)
PROGRESS = Number(0.0, 1.0)
BATCH_TOKEN = Text(limits.BATCH_TOKEN_LENGTH)
KINDS = ListOf(NAME, max_items=limits.MAX_KINDS, min_items=1)
EVENT_TYPES = ListOf(EVENT_TYPE, max_items=limits.MAX_EVENT_TYPES)
TASK_IDS = ListOf(ID, max_items=limits.MAX_DEPENDENCIES, min_items=1)
BACKOFF = Choice(("fixed", "exponential"))
HOSTNAME = Text(limits.HOSTNAME_LENGTH)
PID = Integer(0, limits.INT32_MAX)
CONCURRENCY = Integer(1, limits.INT32_MAX)
PAUSE_STATUS = Choice(("blocked", "waiting_input"))


def lease_ms() -> Integer:
    """``lease_ms``: its ceiling is a setting (MAX_LEASE_MS), read when asked."""
    from ..conf import app_settings

    return Integer(1, app_settings.MAX_LEASE_MS)


def list_limit() -> Integer:
    """``limit`` of list calls: its ceiling is a setting (MAX_LIST_LIMIT), read when asked."""
    from ..conf import app_settings

    return Integer(1, app_settings.MAX_LIST_LIMIT)

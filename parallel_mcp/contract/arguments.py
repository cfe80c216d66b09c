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
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.utils.dateparse import parse_datetime

from ..exceptions import ValidationError
from . import limits
from . import validation as v
from .shapes import any_json, nullable

# The characters ``str.strip()`` removes (``str.isspace()``), spelt out: a pattern's ``\s``
# differs between Python (which adds U+001C..U+001F and U+0085) and ECMA-262, the regex dialect
# of JSON Schema (which adds U+FEFF), and the schema must refuse exactly what the services do.
_SPACE = r"\u0009-\u000d\u001c-\u0020\u0085\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
# A string with at least one non-space character and no NUL (what ``validation.text`` keeps).
NON_BLANK_PATTERN = rf"^[^\u0000]*[^\u0000{_SPACE}][^\u0000]*$"
# A string without NUL (strings and keys inside JSON values).
NO_NUL_PATTERN = r"^[^\u0000]*$"


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

    def from_wire(self, value: Any, name: str) -> int:
        # JSON Schema (2020-12: the MCP tools' and OpenAPI 3.1's dialect) counts a number with
        # a zero fractional part as an integer: 30000.0 is the integer 30000.
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return self.check(value, name)

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


# A UUID in its canonical text form (what JSON Schema's "uuid" format means; the pattern makes
# it an assertion for validators that treat formats as annotations).
UUID_PATTERN = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
_UUID = re.compile(UUID_PATTERN)


@dataclass(frozen=True)
class Id(Kind):
    def from_wire(self, value: Any, name: str) -> Any:
        if not isinstance(value, str):
            raise ValidationError(
                f"{name} must be a UUID string, got {type(value).__name__}.", field=name
            )
        if not _UUID.fullmatch(value):  # not the braced, URN or undashed forms Python reads
            raise ValidationError(
                f"{name} must be a UUID (8-4-4-4-12 hex digits), got {v._short(value)}.",
                field=name,
            )
        return v.require_id(value, name)

    def check(self, value: Any, name: str) -> Any:
        return v.require_id(value, name)

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "format": "uuid", "pattern": UUID_PATTERN}


# RFC 3339 date-time (its mandatory offset included) with a year in the contract's range, in
# the syntax both Python's ``re`` and ECMA-262 read alike ([0-9], not \\d). The year range is
# checked by the services on the value as written (validation.optional_datetime), so this
# pattern states it exactly.
WHEN_PATTERN = (
    r"^(19[0-9]{2}|[2-8][0-9]{3})-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})$"
)
_WHEN = re.compile(WHEN_PATTERN)


@dataclass(frozen=True)
class When(Kind):
    def from_wire(self, value: Any, name: str) -> datetime:
        if not isinstance(value, str) or not _WHEN.fullmatch(value):
            raise ValidationError(
                f"{name} must be an RFC 3339 date-time with a time zone and a year from "
                f"{limits.MIN_YEAR} to {limits.MAX_YEAR} (e.g. 2026-01-01T12:00:00Z), "
                f"got {v._short(value)}.",
                field=name,
            )
        try:
            parsed = parse_datetime(value.replace("z", "Z").replace("t", "T"))
        except ValueError:
            parsed = None
        if parsed is None:
            raise ValidationError(f"{name} is not a valid date-time: {value!r}.", field=name)
        self.check(parsed, name)
        # As written: the services check the year in the value's own offset, then convert it.
        return parsed

    def check(self, value: Any, name: str) -> datetime:
        result = v.optional_datetime(value, name)
        if result is None:
            raise ValidationError(f"{name} is required.", field=name)
        return result

    def schema(self) -> dict[str, Any]:
        return {"type": "string", "format": "date-time", "pattern": WHEN_PATTERN}


JSON_DESCRIPTION = (
    f"Any JSON value nested at most {limits.MAX_JSON_DEPTH} levels deep, at most MAX_JSON_BYTES "
    "of JSON (1 MiB by default), with no NUL character in any string or key."
)


@dataclass(frozen=True)
class Json(Kind):
    """Any JSON value within the depth (limits.MAX_JSON_DEPTH) and size (MAX_JSON_BYTES)
    limits, with no NUL characters in its strings; with ``nullable=False``, not null. Its
    schema, like every kind's, leaves null to the door (``shapes.nullable``, or the API's
    ``allow_null``)."""

    nullable: bool = True

    def check(self, value: Any, name: str) -> Any:
        if value is None and not self.nullable:
            raise ValidationError(f"{name} is required (any JSON value but null).", field=name)
        return v.json_value(value, name)

    def schema(self) -> dict[str, Any]:
        return any_json()

    def recursive_schema(self, ref: str) -> dict[str, Any]:
        return json_value_schema(ref, nullable=self.nullable)


def json_value_schema(ref: str, *, nullable: bool = True) -> dict[str, Any]:
    """The exact JSON Schema of a JSON argument as far as JSON Schema can say it: every string
    and key at any depth without NUL, nested values referring back to ``ref`` (an OpenAPI
    component or a ``$defs`` entry holding ``json_value_schema(ref)``). The depth and size
    limits cannot be written in JSON Schema: the description states them."""
    nested = {"$ref": ref}
    branches: list[dict[str, Any]] = [
        {"type": "boolean"},
        {"type": "number"},
        {"type": "string", "pattern": NO_NUL_PATTERN},
        {"type": "array", "items": nested},
        {
            "type": "object",
            "propertyNames": {"pattern": NO_NUL_PATTERN},
            "additionalProperties": nested,
        },
    ]
    if nullable:
        branches.insert(0, {"type": "null"})
    return {"description": JSON_DESCRIPTION, "anyOf": branches}


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
        if not v.is_list_like(value):
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


# The server-to-client requests a task may ask an MCP client for (the io.modelcontextprotocol/tasks
# extension's InputRequest: an elicitation, a sampling request, a roots listing).
INPUT_METHODS = ("elicitation/create", "sampling/createMessage", "roots/list")


@dataclass(frozen=True)
class InputRequests(Kind):
    """What a task pausing ``waiting_input`` asks the MCP client (the extension's
    ``inputRequests``): ``{key: {"method": one of INPUT_METHODS, "params": {...}}}`` with 1 to
    ``limits.MAX_INPUT_KEYS`` keys, each a name; ``params`` (optional) is a JSON object within
    the JSON limits."""

    def check(self, value: Any, name: str) -> dict[str, Any]:
        if not isinstance(value, dict) or not value:
            raise ValidationError(
                f"{name} must be a non-empty object of {{key: request}}.", field=name
            )
        if len(value) > limits.MAX_INPUT_KEYS:
            raise ValidationError(
                f"{name} has more than {limits.MAX_INPUT_KEYS} keys.",
                field=name,
                limit=limits.MAX_INPUT_KEYS,
            )
        for key, request in value.items():
            v.text(key, f"{name} key")
            where = f"{name}[{key!r}]"
            if not isinstance(request, dict) or request.get("method") not in INPUT_METHODS:
                raise ValidationError(
                    f"{where} must be an object whose method is one of {', '.join(INPUT_METHODS)}.",
                    field=name,
                    key=key,
                )
            unknown = sorted(str(item) for item in request if item not in ("method", "params"))
            if unknown:
                raise ValidationError(
                    f"{where} has fields other than method and params: {', '.join(unknown)}.",
                    field=name,
                    key=key,
                )
            if not isinstance(request.get("params", {}), dict):
                raise ValidationError(f"{where}.params must be an object.", field=name, key=key)
        return v.json_value(value, name)

    def _schema(self, params_values: dict[str, Any]) -> dict[str, Any]:
        key = NAME.schema()
        request = {
            "type": "object",
            "properties": {
                "method": {"type": "string", "enum": list(INPUT_METHODS)},
                "params": {
                    "type": "object",
                    "propertyNames": {"pattern": NO_NUL_PATTERN},
                    "additionalProperties": params_values,
                },
            },
            "required": ["method"],
            "additionalProperties": False,
        }
        return {
            "type": "object",
            "description": "Requests to the MCP client by key, at most "
            f"{limits.MAX_INPUT_KEYS}. {JSON_DESCRIPTION}",
            "minProperties": 1,
            "maxProperties": limits.MAX_INPUT_KEYS,
            "propertyNames": {k: key[k] for k in ("minLength", "maxLength", "pattern")},
            "additionalProperties": request,
        }

    def schema(self) -> dict[str, Any]:
        return self._schema(nullable(any_json()))

    def recursive_schema(self, ref: str) -> dict[str, Any]:
        """The exact schema, ``params``' values referring to ``ref`` (see
        :func:`json_value_schema`)."""
        return self._schema({"$ref": ref})


# -- the contract's arguments -------------------------------------------------------------------
NAME = Text(limits.NAME_LENGTH)
REASON = Text(limits.REASON_LENGTH)
ERROR = Text(limits.ERROR_LENGTH)
EVENT_TYPE = Text(limits.EVENT_TYPE_LENGTH)
ID = Id()
WHEN = When()
JSON = Json()
PAYLOAD = Json(nullable=False)  # append_context_snapshot's payload
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
TASK_IDS = ListOf(ID, max_items=limits.MAX_DEPENDENCIES, min_items=1, unique=True)
BACKOFF = Choice(("fixed", "exponential"))
HOSTNAME = Text(limits.HOSTNAME_LENGTH)
PID = Integer(0, limits.INT32_MAX)
CONCURRENCY = Integer(1, limits.INT32_MAX)
PAUSE_STATUS = Choice(("blocked", "waiting_input"))
INPUT_REQUESTS = InputRequests()


@dataclass(frozen=True)
class SettingCeiling(Kind):
    """An integer from ``minimum`` to the value of a setting, read each time the kind is
    used, so a schema made now states the ceiling in force now (``MAX_LIST_LIMIT``,
    ``MAX_LEASE_MS``)."""

    setting: str
    minimum: int = 1

    def current(self) -> Integer:
        from ..conf import app_settings

        return Integer(self.minimum, getattr(app_settings, self.setting))

    def from_wire(self, value: Any, name: str) -> int:
        return self.current().from_wire(value, name)

    def check(self, value: Any, name: str) -> int:
        return self.current().check(value, name)

    def schema(self) -> dict[str, Any]:
        return self.current().schema()


LIST_LIMIT = SettingCeiling("MAX_LIST_LIMIT")
LEASE_MS = SettingCeiling("MAX_LEASE_MS")

"""Field types of the input serializers. Fields with a ``schema()`` method are documented by it
in the OpenAPI schema (api/schema.py), ``Arg`` by its kind's."""

from __future__ import annotations

import re
from typing import Any

from rest_framework import serializers
from rest_framework.utils import html

from ...contract.arguments import ID, NAME, Flag, Integer, Kind, Number, SettingCeiling
from ...contract.limits import MAX_DEPENDENCIES
from ...exceptions import ValidationError as ContractValidationError


class Arg(serializers.Field):
    """A field that applies one of the contract's argument kinds
    (:mod:`parallel_mcp.contract.arguments`): the same JSON types, limits and messages as the
    services and the MCP tools. ``query=True`` reads it from a query string, where numbers and
    booleans arrive as text."""

    def __init__(self, kind: Kind, *, query: bool = False, **kwargs: Any) -> None:
        self.kind = kind
        self.query = query
        super().__init__(**kwargs)

    def get_value(self, dictionary: Any) -> Any:
        # DRF reads an empty query or form value (?run_id=) as absent, the way HTML forms
        # mean it; here it is a value, which the kind refuses, as the schema says.
        if html.is_html_input(dictionary) and self.field_name in dictionary:
            return dictionary[self.field_name]
        return super().get_value(dictionary)

    def to_internal_value(self, data: Any) -> Any:
        if self.query:
            data = _from_query_string(self.kind, data)
        try:
            return self.kind.from_wire(data, self.field_name or "value")
        except ContractValidationError as exc:
            raise serializers.ValidationError(exc.message) from None

    def to_representation(self, value: Any) -> Any:
        return value


# A JSON number's text (no NaN, no Infinity, no "1_000", no spaces).
_NUMBER = re.compile(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


def _from_query_string(kind: Kind, data: Any) -> Any:
    """Query strings carry text: integers, numbers and booleans are parsed strictly, as JSON
    writes them (``1``, ``-3``, ``0.5``, ``true``, ``false``); anything else is passed on for
    the kind to refuse."""
    if not isinstance(data, str):
        return data
    if isinstance(kind, (Integer, SettingCeiling)) and re.fullmatch(r"-?[0-9]{1,20}", data):
        return int(data)
    if isinstance(kind, Number) and len(data) <= 100 and _NUMBER.fullmatch(data):
        return float(data)
    if isinstance(kind, Flag) and data in ("true", "false"):
        return data == "true"
    return data


def _dependency_schema(batch: bool) -> dict[str, Any]:
    target = NAME.schema() if batch else ID.schema()
    what = "A task id, or the key of another task of the batch." if batch else "A task id."
    return {
        "oneOf": [
            {**target, "description": what},
            {
                "type": "object",
                "properties": {
                    "task_id": target,
                    "required": {"type": "boolean", "default": True},
                },
                "required": ["task_id"],
                "additionalProperties": False,
                "description": "required=false: satisfied by any terminal state of the task.",
            },
        ]
    }


class DependencyField(serializers.Field):
    """A ``depends_on`` entry: a task id or ``{"task_id", "required"}``; in a batch
    (``batch=True``) the id may also be the key of a task of the batch."""

    default_error_messages = {
        "invalid": 'Expected a task id, a key of the batch or {{"task_id": …, "required": bool}}.'
    }

    def __init__(self, *, batch: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.batch = batch
        self._ref = Arg(NAME if batch else ID)

    def _target(self, data: Any) -> Any:
        value = self._ref.run_validation(data)
        return value if self.batch else str(value)

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str):
            return self._target(data)
        if isinstance(data, dict):
            if set(data) - {"task_id", "required"} or not isinstance(data.get("task_id"), str):
                self.fail("invalid")
            required = data.get("required", True)
            if not isinstance(required, bool):
                self.fail("invalid")
            return {"task_id": self._target(data["task_id"]), "required": required}
        self.fail("invalid")

    def to_representation(self, value: Any) -> Any:
        return value

    def schema(self) -> dict[str, Any]:
        return _dependency_schema(self.batch)


class DependsOnListField(serializers.ListField):
    """``depends_on``: at most MAX_DEPENDENCIES entries, none twice (the services refuse a
    task named twice with ``invalid_dependency``)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("max_length", MAX_DEPENDENCIES)
        super().__init__(**kwargs)

    def schema(self) -> dict[str, Any]:
        return {
            "type": "array",
            "items": self.child.schema(),  # type: ignore[attr-defined]  # a DependencyField
            "maxItems": self.max_length,
            "uniqueItems": True,
        }


class CommaListField(serializers.ListField):
    """Statuses in the query string, repeated (``?status=a&status=b``) or comma-separated
    (``?status=a,b``); every part must be one of ``choices`` (an empty part is refused)."""

    def __init__(self, *, choices: list[str], **kwargs: Any) -> None:
        self.choices = list(choices)
        super().__init__(child=serializers.ChoiceField(choices=self.choices), **kwargs)

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, (list, tuple)):
            data = [
                part
                for item in data
                for part in (item.split(",") if isinstance(item, str) else [item])
            ]
        return super().to_internal_value(data)

    def schema(self) -> dict[str, Any]:
        one = "|".join(re.escape(choice) for choice in self.choices)
        return {
            "type": "array",
            "items": {
                "type": "string",
                "pattern": f"^({one})(,({one}))*$",
                "description": f"One of {', '.join(self.choices)}, or several separated by commas.",
            },
        }

"""Field types shared by the input and output serializers."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from ...contract.arguments import NAME, Flag, Integer, Kind
from ...exceptions import ValidationError as ContractValidationError


class Arg(serializers.Field):
    """A field that applies one of the contract's argument kinds
    (:mod:`parallel_mcp.contract.arguments`): the same JSON types, limits and messages as the
    services and the MCP tools. ``query=True`` reads it from a query string, where numbers and
    booleans arrive as text. ``kind`` may be a function returning the kind, for limits that are
    settings (read when a request is validated and when the schema is made)."""

    def __init__(
        self, kind: Kind | Callable[[], Kind], *, query: bool = False, **kwargs: Any
    ) -> None:
        self._kind = kind
        self.query = query
        super().__init__(**kwargs)

    @property
    def kind(self) -> Kind:
        return self._kind if isinstance(self._kind, Kind) else self._kind()

    def to_internal_value(self, data: Any) -> Any:
        if self.query:
            data = _from_query_string(self.kind, data)
        try:
            return self.kind.from_wire(data, self.field_name or "value")
        except ContractValidationError as exc:
            raise serializers.ValidationError(exc.message) from None

    def to_representation(self, value: Any) -> Any:
        return value


def _from_query_string(kind: Kind, data: Any) -> Any:
    """Query strings carry text: numbers and booleans are parsed strictly (``1``, ``-3``,
    ``true``, ``false``); anything else is passed on for the kind to refuse."""
    if not isinstance(data, str):
        return data
    if isinstance(kind, Integer) and re.fullmatch(r"-?[0-9]{1,20}", data):
        return int(data)
    if isinstance(kind, Flag) and data in ("true", "false"):
        return data == "true"
    return data


@extend_schema_field(
    {
        "oneOf": [
            {
                "type": "string",
                "description": "A task id, or (in a batch) the key of a task of the batch.",
            },
            {
                "type": "object",
                "properties": {
                    "task_id": {"type": "string"},
                    "required": {"type": "boolean", "default": True},
                },
                "required": ["task_id"],
                "additionalProperties": False,
            },
        ]
    }
)
class DependencyField(serializers.Field):
    """A ``depends_on`` entry: a task id (or batch key) or ``{"task_id", "required"}``."""

    default_error_messages = {
        "invalid": 'Expected a task id, a key of the batch or {{"task_id": …, "required": bool}}.'
    }

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._ref = Arg(NAME)

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, str):
            return self._ref.run_validation(data)
        if isinstance(data, dict):
            if set(data) - {"task_id", "required"} or not isinstance(data.get("task_id"), str):
                self.fail("invalid")
            required = data.get("required", True)
            if not isinstance(required, bool):
                self.fail("invalid")
            return {"task_id": self._ref.run_validation(data["task_id"]), "required": required}
        self.fail("invalid")

    def to_representation(self, value: Any) -> Any:
        return value


class CommaListField(serializers.ListField):
    """A list in the query string, repeated (``?status=a&status=b``) or comma-separated
    (``?status=a,b``)."""

    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, (list, tuple)):
            data = [
                part
                for item in data
                for part in (item.split(",") if isinstance(item, str) else [item])
                if part != ""
            ]
        return super().to_internal_value(data)


@extend_schema_field({"type": "array", "items": {"type": "string", "format": "uuid"}})
class DependsOnField(serializers.Field):
    """``depends_on_task_ids`` of a task: from the serializer context's ``depends_on`` map when
    the view loaded it for a whole page at once, else from the task."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("source", "*")
        kwargs.setdefault("read_only", True)
        super().__init__(**kwargs)

    def to_representation(self, task: Any) -> list[str]:
        mapping = (self.context or {}).get("depends_on")
        if mapping is not None and task.pk in mapping:
            ids = mapping[task.pk]
        else:
            ids = task.depends_on_task_ids
        return [str(value) for value in ids]

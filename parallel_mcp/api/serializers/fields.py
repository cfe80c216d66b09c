"""Field types shared by the input and output serializers."""

from __future__ import annotations

from datetime import UTC
from typing import Any

from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

# Largest duration accepted in milliseconds (ten years), like the orchestrator's own check.
MAX_MS = 10 * 365 * 24 * 3600 * 1000
# Ids of events are 64-bit integers.
MAX_EVENT_ID = 2**63 - 1


class StrictCharField(serializers.CharField):
    """Only JSON strings (DRF's CharField turns numbers into strings)."""

    def to_internal_value(self, data: Any) -> str:
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


def text(*, max_length: int = 200, **kwargs: Any) -> serializers.CharField:
    """A string passed on exactly as sent (no trimming); NUL and lone surrogates refused."""
    return StrictCharField(max_length=max_length, trim_whitespace=False, **kwargs)


def optional_text(*, max_length: int = 200, **kwargs: Any) -> serializers.CharField:
    return text(max_length=max_length, required=False, allow_null=True, **kwargs)


class UtcDateTimeField(serializers.DateTimeField):
    """ISO 8601; naive values are read as UTC; values out of range after conversion to UTC
    are refused."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("default_timezone", UTC)
        super().__init__(**kwargs)


def _bad_strings(value: Any) -> str | None:
    """The first problem of a JSON document's strings (keys included), walked iteratively so
    deep nesting cannot blow the stack: NUL characters (PostgreSQL's jsonb refuses them) and
    lone surrogates (no UTF-8 encoding)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            strings: list[str] = [item]
        elif isinstance(item, dict):
            strings = [key for key in item if isinstance(key, str)]
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
            continue
        else:
            continue
        for string in strings:
            if "\x00" in string:
                return "must not contain NUL (\\u0000) characters"
            try:
                string.encode("utf-8")
            except UnicodeEncodeError:
                return "must not contain lone surrogate characters"
    return None


class JSONValueField(serializers.JSONField):
    """Any JSON value (null included unless ``allow_null=False``)."""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("allow_null", True)
        super().__init__(**kwargs)

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        problem = _bad_strings(value)
        if problem:
            raise serializers.ValidationError(f"Strings in this JSON value {problem}.")
        return value


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
        self._ref = text()

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

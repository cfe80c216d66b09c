"""Keyset (cursor) pagination: no OFFSET, no COUNT.

A page is the rows after the last row of the previous page in a total order ending in the
primary key, so rows added meanwhile never make a page skip or repeat a row. The cursor is
opaque to clients: base64url of ``{"o": <ordering name>, "k": [<key of the last row>]}``.
A cursor is tied to its ordering; used with another ordering it is refused (400).
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from django.db.models import Q, QuerySet
from rest_framework.exceptions import ValidationError
from rest_framework.utils.urls import replace_query_param

from ..contract.arguments import WHEN
from ..exceptions import ValidationError as ContractValidationError

CURSOR_VERSION = 1


@dataclass(frozen=True)
class KeyPart:
    field: str
    descending: bool
    kind: str  # "datetime", "uuid" or "int"


@dataclass(frozen=True)
class Page:
    items: list[Any]
    next_cursor: str | None


def _invalid(reason: str) -> ValidationError:
    return ValidationError({"cursor": [f"Invalid cursor: {reason}."]})


class Keyset:
    """One total order of a list endpoint, e.g. runs by (updated_at desc, id desc)."""

    def __init__(self, name: str, parts: list[KeyPart]) -> None:
        self.name = name
        self.parts = parts

    # -- cursors -------------------------------------------------------------------------
    def encode(self, row: Any) -> str:
        values: list[Any] = []
        for part in self.parts:
            value = getattr(row, part.field)
            if part.kind == "datetime":
                value = value.isoformat()
            elif part.kind == "uuid":
                value = str(value)
            values.append(value)
        raw = json.dumps({"v": CURSOR_VERSION, "o": self.name, "k": values}, separators=(",", ":"))
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    def decode(self, cursor: str) -> list[Any]:
        try:
            padded = cursor + "=" * (-len(cursor) % 4)
            data = json.loads(base64.urlsafe_b64decode(padded.encode("ascii")).decode())
        except (ValueError, UnicodeError, binascii.Error):
            raise _invalid("not a cursor of this API") from None
        if not isinstance(data, dict) or data.get("v") != CURSOR_VERSION:
            raise _invalid("not a cursor of this API")
        if data.get("o") != self.name:
            raise _invalid("it belongs to another list or ordering")
        values = data.get("k")
        if not isinstance(values, list) or len(values) != len(self.parts):
            raise _invalid("malformed key")
        parsed: list[Any] = []
        for part, value in zip(self.parts, values, strict=True):
            try:
                if part.kind == "datetime":
                    if not isinstance(value, str):
                        raise ValueError
                    # The contract's datetime rule: aware, within its range once in UTC.
                    parsed.append(WHEN.check(datetime.fromisoformat(value), "cursor"))
                elif part.kind == "uuid":
                    if not isinstance(value, str):
                        raise ValueError
                    parsed.append(UUID(value))
                else:
                    if not isinstance(value, int) or isinstance(value, bool):
                        raise ValueError
                    if not -(2**63) <= value < 2**63:
                        raise ValueError
                    parsed.append(value)
            except (ValueError, TypeError, OverflowError, ContractValidationError):
                raise _invalid("malformed key") from None
        return parsed

    # -- queries -------------------------------------------------------------------------
    def order(self) -> list[str]:
        return [("-" if part.descending else "") + part.field for part in self.parts]

    def after(self, values: list[Any]) -> Q:
        """Rows strictly after the row with key ``values`` in this order."""
        condition = Q()
        for index, part in enumerate(self.parts):
            equal = {p.field: v for p, v in zip(self.parts[:index], values[:index], strict=True)}
            lookup = "lt" if part.descending else "gt"
            condition |= Q(**equal, **{f"{part.field}__{lookup}": values[index]})
        # A plain range on the leading column too, so the index range scan starts at the cursor.
        first = self.parts[0]
        bound = Q(**{f"{first.field}__{'lte' if first.descending else 'gte'}": values[0]})
        return bound & condition

    def page(self, queryset: QuerySet, *, cursor: str | None, limit: int) -> Page:
        queryset = queryset.order_by(*self.order())
        if cursor:
            queryset = queryset.filter(self.after(self.decode(cursor)))
        rows = list(queryset[: limit + 1])
        more = len(rows) > limit
        rows = rows[:limit]
        return Page(items=rows, next_cursor=self.encode(rows[-1]) if more and rows else None)


def next_link(request: Any, cursor: str | None) -> str | None:
    if cursor is None:
        return None
    return replace_query_param(request.build_absolute_uri(), "cursor", cursor)


RUNS_BY_UPDATED_DESC = Keyset(
    "runs.updated_at.desc",
    [KeyPart("updated_at", True, "datetime"), KeyPart("id", True, "uuid")],
)
RUNS_BY_UPDATED_ASC = Keyset(
    "runs.updated_at.asc",
    [KeyPart("updated_at", False, "datetime"), KeyPart("id", False, "uuid")],
)
RUNS_BY_CREATED_DESC = Keyset(
    "runs.created_at.desc",
    [KeyPart("created_at", True, "datetime"), KeyPart("id", True, "uuid")],
)
RUNS_BY_CREATED_ASC = Keyset(
    "runs.created_at.asc",
    [KeyPart("created_at", False, "datetime"), KeyPart("id", False, "uuid")],
)
RUN_ORDERS = {
    ("updated_at", "desc"): RUNS_BY_UPDATED_DESC,
    ("updated_at", "asc"): RUNS_BY_UPDATED_ASC,
    ("created_at", "desc"): RUNS_BY_CREATED_DESC,
    ("created_at", "asc"): RUNS_BY_CREATED_ASC,
}
# A run's tasks, oldest first.
TASKS_BY_CREATED = Keyset(
    "tasks.created_at", [KeyPart("created_at", False, "datetime"), KeyPart("id", False, "uuid")]
)
# Pending tasks in claim order: highest priority first, then oldest.
TASKS_BY_CLAIM_ORDER = Keyset(
    "tasks.claim_order",
    [
        KeyPart("priority", True, "int"),
        KeyPart("created_at", False, "datetime"),
        KeyPart("id", False, "uuid"),
    ],
)
# Dead-lettered tasks, most recently failed first (the partial index pmcp_task_dead_idx).
TASKS_BY_UPDATED_DESC = Keyset(
    "tasks.updated_at.desc",
    [KeyPart("updated_at", True, "datetime"), KeyPart("id", True, "uuid")],
)

"""What a handler returns. A plain value (or None) means ``Completed(output=value)``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Completed:
    output: Any = None
    metadata: Any = None
    next_context: Any = None
    next_context_label: str | None = None


@dataclass(frozen=True)
class Failed:
    error: str
    retry: bool = False
    metadata: Any = None


@dataclass(frozen=True)
class Paused:
    status: str  # "blocked" or "waiting_input"
    reason: str | None = None
    # With status "blocked": back to the queue by itself once these tasks complete.
    blocked_by: list[Any] | None = None
    # With status "waiting_input", in a run created by an MCP tool call (any of its tasks):
    # what to ask the tool's caller, ``{key: {"method": "elicitation/create", "params": {...}}}``,
    # recorded with the pause; the answers are in ``ctx.input_responses`` when it runs again.
    input_requests: dict[str, Any] | None = None


@dataclass(frozen=True)
class Released:
    reason: str | None = None


Outcome = Completed | Failed | Paused | Released


def as_outcome(value: Any) -> Outcome:
    if isinstance(value, (Completed, Failed, Paused, Released)):
        return value
    return Completed(output=value)

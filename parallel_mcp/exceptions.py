"""Typed errors of the public API.

Every error carries a stable ``code`` (used by the API and MCP layers) and a ``details`` dict
with the ids involved, so callers can react without parsing messages.
"""

from __future__ import annotations

from typing import Any


class ParallelMcpError(Exception):
    code = "parallel_mcp_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = {key: _plain(value) for key, value in details.items()}

    def __str__(self) -> str:
        return self.message


def _plain(value: Any) -> Any:
    """UUIDs and other ids become strings so details are JSON-ready."""
    if isinstance(value, str):
        return str(value)  # plain str, also for str-based enums
    if value is None or isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_plain(item) for item in value]
    return str(value)


class RecordNotFoundError(ParallelMcpError):
    code = "not_found"


class InvalidTransitionError(ParallelMcpError):
    code = "invalid_transition"


class LeaseConflictError(ParallelMcpError):
    code = "lease_conflict"


class LeaseExpiredError(ParallelMcpError):
    code = "lease_expired"


class RunTerminalError(ParallelMcpError):
    code = "run_terminal"


class DuplicateTaskKeyError(ParallelMcpError):
    code = "duplicate_task_key"


class DependencyCycleError(ParallelMcpError):
    code = "dependency_cycle"


class InvalidDependencyError(ParallelMcpError):
    code = "invalid_dependency"


class IdempotencyConflictError(ParallelMcpError):
    code = "idempotency_conflict"


class ValidationError(ParallelMcpError, ValueError):
    code = "validation_error"


class DuplicateIdError(ValidationError):
    """A caller-supplied id (of a run, task or context snapshot) is already taken. Still a
    ``ValidationError`` for Python callers; its own code lets the HTTP API answer 409, since
    the request is well-formed and refused only because of what is stored."""

    code = "duplicate_id"


class PermissionDeniedError(ParallelMcpError):
    """The acting credential may not do this (e.g. a worker id outside its token's prefix)."""

    code = "permission_denied"


def _subclasses(cls: type[ParallelMcpError]) -> list[type[ParallelMcpError]]:
    return [sub for direct in cls.__subclasses__() for sub in (direct, *_subclasses(direct))]


# Every error of the contract by its ``code``: how the remote worker's client maps the API's
# error envelope back to the class the local orchestrator raises.
ERRORS_BY_CODE: dict[str, type[ParallelMcpError]] = {
    cls.code: cls for cls in _subclasses(ParallelMcpError)
}

__all__ = [
    "DependencyCycleError",
    "DuplicateIdError",
    "DuplicateTaskKeyError",
    "IdempotencyConflictError",
    "InvalidDependencyError",
    "InvalidTransitionError",
    "LeaseConflictError",
    "LeaseExpiredError",
    "ParallelMcpError",
    "PermissionDeniedError",
    "RecordNotFoundError",
    "RunTerminalError",
    "ValidationError",
]

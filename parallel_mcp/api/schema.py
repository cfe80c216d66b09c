"""OpenAPI 3 (drf-spectacular): the schema class of every API view, the bearer-token security
scheme, the hook that keeps the schema to this API's endpoints, and the settings the schema
view runs with (they override ``SPECTACULAR_SETTINGS`` for this schema only)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import (
    OpenApiAuthenticationExtension,
    OpenApiSerializerFieldExtension,
)
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import extend_schema

from .. import __version__
from ..results import BLOCKER_KINDS
from ..states import AttemptStatus, LeaseStatus, RunStatus, TaskStatus
from .serializers.outputs import ErrorOut

ERROR_DESCRIPTIONS = {
    400: "Invalid input (validation_error, parse_error, dependency_cycle, invalid_dependency).",
    401: "No credentials, or a bad, expired or revoked token.",
    403: "Authenticated but not allowed (permission or token role; CSRF for sessions).",
    404: "No such run or task (not_found).",
    406: "The Accept header names no type this endpoint produces.",
    409: "The current state refuses the call (lease_conflict, invalid_transition, "
    "duplicate_task_key, idempotency_conflict, run_terminal).",
    410: "The lease expired (lease_expired).",
    413: "The request body is larger than the limit (request_too_large).",
    415: "The body is not application/json.",
    429: "Rate limit exceeded (throttled), too many failed authentications from this address "
    "(auth_throttled), or too many open event streams for this token (too_many_streams); see "
    "Retry-After.",
    503: "The server's limit of open event streams is reached (too_many_streams); see Retry-After.",
}
BASE_ERRORS = (400, 401, 403, 406, 429)
BODY_ERRORS = (413, 415)


class PmcpAutoSchema(AutoSchema):
    """Every operation documents the error envelope for the statuses it can answer: the common
    ones, 413/415 for calls with a body, and the view's own ``error_statuses``."""

    def get_tags(self) -> list[str]:
        tags = getattr(self.view, "tags", None)
        return list(tags) if tags else super().get_tags()

    def _get_format_parameters(self) -> list[Any]:
        return []  # ?format= is not part of this API's contract

    def _error_statuses(self) -> list[int]:
        statuses = set(BASE_ERRORS)
        if self.method in ("POST", "PUT", "PATCH"):
            statuses.update(BODY_ERRORS)
        if "{" in self.path:
            statuses.add(404)
        statuses.update(getattr(self.view, "error_statuses", ()))
        return sorted(statuses)

    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        responses = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        for status_code in self._error_statuses():
            key = str(status_code)
            if key in responses:
                continue
            body = self._get_response_for_code(
                ErrorOut, key, media_types=["application/json"], direction=direction
            )
            body["description"] = ERROR_DESCRIPTIONS.get(status_code, "Error.")
            responses[key] = body
        return responses


def api_schema(**kwargs: Any) -> Any:
    """``extend_schema`` on a view method, over :class:`PmcpAutoSchema` whatever
    ``REST_FRAMEWORK["DEFAULT_SCHEMA_CLASS"]`` the project has (``extend_schema`` alone bases
    a method's schema on that setting, read at import time)."""

    def decorator(function: Any) -> Any:
        function.schema = PmcpAutoSchema
        return extend_schema(**kwargs)(function)

    return decorator


class ArgFieldSchema(OpenApiSerializerFieldExtension):
    """An :class:`~.serializers.fields.Arg` field is documented by its argument kind's JSON
    Schema: the OpenAPI schema states the rules the services apply."""

    target_class = "parallel_mcp.api.serializers.fields.Arg"

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        return dict(self.target.kind.schema())  # the kind's current limits


class BearerTokenScheme(OpenApiAuthenticationExtension):
    target_class = "parallel_mcp.api.authentication.BearerTokenAuthentication"
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, Any]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API token made with `manage.py pmcp_token create`: "
            "`Authorization: Bearer pmcp_<prefix>_<secret>`.",
        }


def only_parallel_mcp(endpoints: list[tuple], **kwargs: Any) -> list[tuple]:
    """Preprocessing hook: keep the endpoints of this API (the schema is served per API, even
    when the project has other DRF views)."""
    from .views.base import ApiView

    kept = []
    for path, path_regex, method, callback in endpoints:
        view_class = getattr(callback, "cls", None)
        if view_class is not None and issubclass(view_class, ApiView):
            kept.append((path, path_regex, method, callback))
    return kept


def _values(enum: Any) -> list[str]:
    return [str(member) for member in enum]


SCHEMA_SETTINGS: dict[str, Any] = {
    "TITLE": "parallel_mcp API",
    "VERSION": __version__,
    "DESCRIPTION": (
        "Runs, task DAGs, leases, retries, the dead-letter queue, context and the event log "
        "of parallel_mcp over HTTP, for operators, dashboards and remote workers. Every error "
        'has the body {"error": {"code", "message", "details"}}. See docs/api.md.'
    ),
    "PREPROCESSING_HOOKS": ["parallel_mcp.api.schema.only_parallel_mcp"],
    "ENUM_NAME_OVERRIDES": {
        "RunStatusEnum": _values(RunStatus),
        "TaskStatusEnum": _values(TaskStatus),
        "AttemptStatusEnum": _values(AttemptStatus),
        "LeaseStatusEnum": _values(LeaseStatus),
        "BlockerKindEnum": list(BLOCKER_KINDS),
        "PauseStatusEnum": ["blocked", "waiting_input"],
        "TerminalRunStatusEnum": ["cancelled", "completed", "failed"],
        "RetryBackoffEnum": ["fixed", "exponential"],
        "SnapshotScopeEnum": ["run", "task"],
        "OrderDirEnum": ["asc", "desc"],
        "RunOrderByEnum": ["updated_at", "created_at"],
    },
}

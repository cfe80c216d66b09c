"""OpenAPI 3.1 (drf-spectacular): the schema class of every API view (every status each
operation answers, the refusals that depend on stored data), the extensions that document
fields and bodies with the contract's own JSON Schemas (argument kinds, shapes, the recursive
JSON value, ``additionalProperties: false``, rules between fields), the bearer-token security
scheme, the hook that keeps the schema to this API's endpoints, and the settings the schema
view runs with (they override ``SPECTACULAR_SETTINGS`` for this schema only)."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import (
    OpenApiAuthenticationExtension,
    OpenApiSerializerExtension,
    OpenApiSerializerFieldExtension,
)
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.plumbing import ResolvedComponent
from drf_spectacular.utils import extend_schema
from rest_framework.serializers import ListSerializer

from .. import __version__
from ..contract import shapes
from ..contract.arguments import InputRequests, Json, json_value_schema
from ..results import BLOCKER_KINDS
from ..states import AttemptStatus, LeaseStatus, RunStatus, TaskStatus
from .serializers.fields import Arg, CommaListField, DependencyField, DependsOnListField
from .serializers.generated import ShapeField
from .serializers.inputs import StrictSerializer
from .serializers.outputs import ErrorOut

# Fields whose schema extension below writes their nullable form.
DOCUMENTED_FIELDS = (Arg, CommaListField, DependencyField, DependsOnListField, ShapeField)

ERROR_DESCRIPTIONS = {
    400: "Invalid input (validation_error, parse_error, dependency_cycle, invalid_dependency).",
    401: "No credentials, or a bad, expired or revoked token.",
    403: "Authenticated but not allowed (permission or token role; CSRF for sessions).",
    404: "No such run or task (not_found).",
    406: "The Accept header names no type this endpoint produces.",
    409: "The current state refuses the call (lease_conflict, invalid_transition, "
    "duplicate_task_key, duplicate_id, idempotency_conflict, run_terminal).",
    410: "The lease expired (lease_expired).",
    413: "The request body is larger than the limit (request_too_large).",
    415: "The body is not application/json.",
    429: "Rate limit exceeded (throttled), too many failed authentications from this address "
    "(auth_throttled), or too many open event streams for this token (too_many_streams); see "
    "Retry-After.",
    503: "The server's limit of open event streams is reached (too_many_streams); see Retry-After.",
}
# Limits of the HTTP server: documented without a body, since the server may answer them in
# its own format before the API sees the request.
SERVER_LIMITS = {
    414: "The query string is longer than the HTTP server accepts (a server setting: 64 KiB "
    "for Django's development server, 4 KiB by default for gunicorn; the server answers in its "
    "own format), or has more parameters than Django's DATA_UPLOAD_MAX_NUMBER_FIELDS (1000 by "
    "default; then uri_too_long in the error envelope). Send fewer or shorter values.",
}
BASE_ERRORS = (400, 401, 403, 406, 429)
BODY_ERRORS = (413, 415)

# Refusals a request can get although the schema calls it valid, because they depend on stored
# data (ids that must exist, a graph without cycles, a cursor this list handed out), which no
# schema can express. They stay 400 (docs/api.md says why); every operation that can answer one
# lists it in its 400 response, in the description and as ``x-pmcp-data-refusals``.
DATA_REFUSALS: dict[str, dict[str, str]] = {
    "cursor": {
        "code": "validation_error",
        "field": "cursor",
        "when": "cursor is not a next_cursor this list handed out (with these filters and "
        "ordering)",
    },
    "dependency": {
        "code": "invalid_dependency",
        "when": "a dependency names an unknown task, a task of another run, or one task twice",
    },
    "cycle": {
        "code": "dependency_cycle",
        "when": "the dependencies form a cycle (a task that depends on itself included)",
    },
    "context_snapshot": {
        "code": "validation_error",
        "field": "context_snapshot_id",
        "when": "context_snapshot_id is not a snapshot of the run",
    },
    "parent_snapshot": {
        "code": "validation_error",
        "field": "parent_snapshot_id",
        "when": "parent_snapshot_id is not a snapshot of the run",
    },
    "input_requests": {
        "code": "validation_error",
        "field": "input_requests",
        "when": "input_requests are given for a task of a run that no MCP tool call created, "
        "or name a key the run already uses for another task, for another request, or that "
        "was answered already",
    },
    "batch_id": {
        "code": "validation_error",
        "field": "id",
        "when": "two tasks of the batch give the same id",
    },
}


class PmcpAutoSchema(AutoSchema):
    """Every operation documents the error envelope for the statuses it can answer: the common
    ones, 413/415 for calls with a body, and the view's own ``error_statuses``; its 400 lists
    the view's ``data_refusals`` (keys of :data:`DATA_REFUSALS`). Both are a tuple, or a dict
    of tuples by HTTP method."""

    def get_tags(self) -> list[str]:
        tags = getattr(self.view, "tags", None)
        return list(tags) if tags else super().get_tags()

    def _get_format_parameters(self) -> list[Any]:
        return []  # ?format= is not part of this API's contract

    def _get_request_for_media_type(self, serializer: Any, direction: Any = "request") -> Any:
        schema, required = super()._get_request_for_media_type(serializer, direction)
        return schema, required or bool(getattr(serializer, "body_required", False))

    def _get_serializer_field_meta(self, field: Any, direction: Any) -> dict[str, Any]:
        meta = super()._get_serializer_field_meta(field, direction)
        if isinstance(field, ListSerializer):  # drf-spectacular leaves a list's bounds out
            # (DRF sets both; its stubs do not declare them)
            for attribute, key in (("min_length", "minItems"), ("max_length", "maxItems")):
                bound = getattr(field, attribute, None)
                if bound is not None:
                    meta[key] = bound
        if isinstance(field, DOCUMENTED_FIELDS):
            meta.pop("nullable", None)  # their extension writes the nullable form itself
        return meta

    def _declared(self, name: str) -> tuple[Any, ...]:
        value = getattr(self.view, name, ())
        return tuple(value.get(self.method, ()) if isinstance(value, dict) else value)

    def _error_statuses(self) -> list[int]:
        statuses = set(BASE_ERRORS)
        if self.method == "GET":
            statuses.add(414)
        if self.method in ("POST", "PUT", "PATCH"):
            statuses.update(BODY_ERRORS)
        if "{" in self.path:
            statuses.add(404)
        statuses.update(self._declared("error_statuses"))
        return sorted(statuses)

    def _data_refusals(self) -> list[dict[str, str]]:
        return [DATA_REFUSALS[name] for name in self._declared("data_refusals")]

    def _get_response_bodies(self, direction: Any = "response") -> dict[str, Any]:
        responses = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        for status_code in self._error_statuses():
            key = str(status_code)
            if key in responses:
                continue
            if status_code in SERVER_LIMITS:  # answered by the HTTP server, in its own format
                responses[key] = {"description": SERVER_LIMITS[status_code]}
                continue
            body = self._get_response_for_code(
                ErrorOut, key, media_types=["application/json"], direction=direction
            )
            body["description"] = ERROR_DESCRIPTIONS.get(status_code, "Error.")
            refusals = self._data_refusals()
            if status_code == 400 and refusals:
                body["description"] += " Also, depending on stored data: " + "; ".join(
                    f"{item['code']} when {item['when']}" for item in refusals
                )
                body["x-pmcp-data-refusals"] = refusals
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


# JSON arguments: a recursive component (every string and key without NUL, at any depth).
JSON_VALUE = "JsonValue"
NON_NULL_JSON_VALUE = "NonNullJsonValue"


def _json_value_ref(auto_schema: Any) -> str:
    """The reference to the JsonValue component, registered on first use."""
    ref = f"#/components/schemas/{JSON_VALUE}"
    auto_schema.registry.register_on_missing(
        ResolvedComponent(
            name=JSON_VALUE,
            type=ResolvedComponent.SCHEMA,
            object=JSON_VALUE,
            schema=json_value_schema(ref),
        )
    )
    return ref


def _json_component(auto_schema: Any, kind: Json, *, nullable: bool) -> dict[str, Any]:
    """The reference to the component of a JSON argument, registered on first use."""
    ref = _json_value_ref(auto_schema)
    components = [(JSON_VALUE, json_value_schema(ref))]
    if not nullable:
        components.append((NON_NULL_JSON_VALUE, kind.recursive_schema(ref)))
    for name, schema in components:
        auto_schema.registry.register_on_missing(
            ResolvedComponent(name=name, type=ResolvedComponent.SCHEMA, object=name, schema=schema)
        )
    return {"$ref": f"#/components/schemas/{components[-1][0]}"}


class ArgFieldSchema(OpenApiSerializerFieldExtension):
    """An :class:`~.serializers.fields.Arg` field is documented by its argument kind's JSON
    Schema: the OpenAPI schema states the rules the services apply. A nullable one in the
    contract's one nullable form (``shapes.nullable``), as in the MCP tool schemas."""

    target_class = "parallel_mcp.api.serializers.fields.Arg"

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        kind = self.target.kind
        if isinstance(kind, Json):
            nullable = kind.nullable or self.target.allow_null  # JsonValue includes null
            return _json_component(auto_schema, kind, nullable=nullable)
        if isinstance(kind, InputRequests):  # JSON inside: its exact, recursive schema
            schema = kind.recursive_schema(_json_value_ref(auto_schema))
        else:
            schema = dict(kind.schema())
        return shapes.nullable(schema) if self.target.allow_null else schema


class _FieldSchema(OpenApiSerializerFieldExtension):
    """Fields with a ``schema()`` method are documented by it."""

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        schema = self.target.schema()
        return shapes.nullable(schema) if self.target.allow_null else schema


class DependencyFieldSchema(_FieldSchema):
    target_class = "parallel_mcp.api.serializers.fields.DependencyField"


class DependsOnListFieldSchema(_FieldSchema):
    target_class = "parallel_mcp.api.serializers.fields.DependsOnListField"


class CommaListFieldSchema(_FieldSchema):
    target_class = "parallel_mcp.api.serializers.fields.CommaListField"


class ShapeFieldSchema(OpenApiSerializerFieldExtension):
    """A field of a generated output serializer: the contract shape's own JSON Schema."""

    target_class = "parallel_mcp.api.serializers.generated.ShapeField"

    def map_serializer_field(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        return shapes.field_schema(self.target.shape_field)


class BodySchema(OpenApiSerializerExtension):
    """A request body: ``additionalProperties: false`` when it refuses unknown fields, and the
    rules between its fields (``schema_rules``)."""

    target_class = "parallel_mcp.api.serializers.inputs.BodySerializer"
    match_subclasses = True

    def map_serializer(self, auto_schema: Any, direction: Any) -> dict[str, Any]:
        schema = auto_schema._map_serializer(self.target, direction, bypass_extensions=True)
        if isinstance(self.target, StrictSerializer):
            schema["additionalProperties"] = False
        schema.update(self.target.schema_rules)
        return schema


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
    # OpenAPI 3.1: its schemas are JSON Schema 2020-12, the dialect of the contract's argument
    # kinds and of the MCP tools' schemas, so every door publishes the same rules verbatim.
    "OAS_VERSION": "3.1.0",
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
        "SnapshotScopeEnum": ["run", "task"],
    },
}

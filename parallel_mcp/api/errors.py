"""One error envelope for everything the API refuses.

Every error response has the body ``{"error": {"code": str, "message": str, "details": {}}}``.
``ParallelMcpError`` subclasses keep their ``code`` and ``details``; DRF's own errors (parse,
validation, authentication, permission, 404, 405, 406, 415, throttling) get a code of their
own. The status of each code is in :data:`STATUS_BY_CODE` (and docs/api.md).
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation, TooManyFieldsSent
from django.db import DataError, IntegrityError, OperationalError
from django.http import Http404, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework import exceptions as drf
from rest_framework import status
from rest_framework.response import Response
from rest_framework.views import set_rollback

from ..contract import shapes
from ..exceptions import ParallelMcpError

logger = logging.getLogger("parallel_mcp.api")

# The status of every ParallelMcpError code.
STATUS_BY_CODE: dict[str, int] = {
    "not_found": status.HTTP_404_NOT_FOUND,
    "validation_error": status.HTTP_400_BAD_REQUEST,
    # The request contradicts itself or names tasks that cannot be dependencies: resending
    # it unchanged can never succeed, so these are client errors, not conflicts.
    "dependency_cycle": status.HTTP_400_BAD_REQUEST,
    "invalid_dependency": status.HTTP_400_BAD_REQUEST,
    # The request is well-formed but the current state of the run or task refuses it.
    "lease_conflict": status.HTTP_409_CONFLICT,
    "invalid_transition": status.HTTP_409_CONFLICT,
    "duplicate_task_key": status.HTTP_409_CONFLICT,
    "duplicate_id": status.HTTP_409_CONFLICT,
    "idempotency_conflict": status.HTTP_409_CONFLICT,
    "run_terminal": status.HTTP_409_CONFLICT,
    # The credential may not act so (a worker id outside its token's prefix).
    "permission_denied": status.HTTP_403_FORBIDDEN,
    # The lease existed and ran out: gone for good.
    "lease_expired": status.HTTP_410_GONE,
}
DEFAULT_ERROR_STATUS = status.HTTP_400_BAD_REQUEST


class RequestTooLarge(drf.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "request_too_large"

    def __init__(self, limit: int) -> None:
        super().__init__(f"The request body is larger than {limit} bytes.")
        self.limit = limit
        self.details = {"limit": limit}


def envelope(code: str, message: str, details: Any = None) -> dict[str, Any]:
    return shapes.error(code, message, details)


def status_for(exc: ParallelMcpError) -> int:
    return STATUS_BY_CODE.get(exc.code, DEFAULT_ERROR_STATUS)


def _first_error(detail: Any, path: str = "") -> tuple[str, str]:
    """The first validation message and where it is (``tasks.0.kind``)."""
    if isinstance(detail, dict):
        for key, value in detail.items():
            prefix = path if key == "non_field_errors" else f"{path}{key}"
            found = _first_error(value, f"{prefix}." if prefix else "")
            if found[1]:
                return found
        return "", ""
    if isinstance(detail, list):
        for index, value in enumerate(detail):
            nested = isinstance(value, (dict, list))
            found = _first_error(value, f"{path}{index}." if nested else path)
            if found[1]:
                return found
        return "", ""
    return path.rstrip("."), str(detail)


def _first_message(detail: Any) -> str:
    """The first validation message, prefixed by where it is: ``tasks.0.kind: …``."""
    where, text = _first_error(detail)
    return f"{where}: {text}" if where and text else text


def _from_api_exception(exc: drf.APIException) -> tuple[int, dict[str, Any], dict[str, str]]:
    headers: dict[str, str] = {}
    if getattr(exc, "auth_header", None):
        headers["WWW-Authenticate"] = exc.auth_header  # type: ignore[attr-defined]
    wait = getattr(exc, "wait", None)
    if wait:
        headers["Retry-After"] = str(int(wait))
    if isinstance(exc, drf.ValidationError):
        fields = exc.detail if isinstance(exc.detail, dict) else {"non_field_errors": exc.detail}
        message = _first_message(fields) or "Invalid input."
        invalid: dict[str, Any] = {"fields": fields}
        where = _first_error(fields)[0]
        if where:
            invalid["field"] = where  # as the services and the MCP tools name it
        return exc.status_code, envelope("validation_error", message, invalid), headers
    detail = exc.detail
    code = getattr(detail, "code", None) or exc.default_code
    if isinstance(exc, drf.ParseError):
        code = "parse_error"
    details: dict[str, Any] = {}
    if isinstance(exc, drf.Throttled) and wait is not None:
        details["wait"] = wait
    # The API's own exceptions (RequestTooLarge, the stream limits) carry their details.
    details.update(getattr(exc, "details", None) or {})
    message = str(detail) if not isinstance(detail, (dict, list)) else _first_message(detail)
    return exc.status_code, envelope(str(code), message, details), headers


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response | None:
    """DRF exception handler of every API view (set per view, not in REST_FRAMEWORK)."""
    if isinstance(exc, ParallelMcpError):
        set_rollback()
        return Response(envelope(exc.code, exc.message, exc.details), status=status_for(exc))
    if isinstance(exc, Http404):
        exc = drf.NotFound(*exc.args)
    elif isinstance(exc, DjangoPermissionDenied):
        exc = drf.PermissionDenied(*exc.args)
    elif isinstance(exc, RequestDataTooBig):
        exc = RequestTooLarge(getattr(settings, "DATA_UPLOAD_MAX_MEMORY_SIZE", 0) or 0)
    if isinstance(exc, drf.APIException):
        code, body, headers = _from_api_exception(exc)
        set_rollback()
        return Response(body, status=code, headers=headers)
    if isinstance(exc, TooManyFieldsSent):  # the query string has too many parameters
        set_rollback()
        limit = settings.DATA_UPLOAD_MAX_NUMBER_FIELDS
        return Response(
            envelope(
                "uri_too_long",
                f"The query string has more than {limit} parameters.",
                {"limit": limit},
            ),
            status=status.HTTP_414_REQUEST_URI_TOO_LONG,
        )
    if isinstance(exc, SuspiciousOperation):
        set_rollback()
        return Response(envelope("bad_request", str(exc)), status=status.HTTP_400_BAD_REQUEST)
    # Safety nets: the views validate input before the database sees it, so these mean a race
    # (two requests inserting the same id) or a database that is down, not a bad request.
    if isinstance(exc, IntegrityError):
        logger.warning("API request hit an integrity error: %s", exc)
        set_rollback()
        return Response(
            envelope("conflict", "The request conflicts with a concurrent change; retry it."),
            status=status.HTTP_409_CONFLICT,
        )
    if isinstance(exc, DataError):
        logger.warning("API request hit a data error: %s", exc)
        set_rollback()
        return Response(
            envelope("validation_error", "A value is out of the range the database accepts."),
            status=status.HTTP_400_BAD_REQUEST,
        )
    if isinstance(exc, OperationalError):
        logger.error("API request hit a database error: %s", exc)
        set_rollback()
        return Response(
            envelope("unavailable", "The database is unavailable; retry later."),
            status=status.HTTP_503_SERVICE_UNAVAILABLE,
            headers={"Retry-After": "1"},
        )
    if settings.DEBUG:
        return None  # Django's debug page
    logger.exception("Unhandled error in the parallel_mcp API", exc_info=exc)
    set_rollback()
    return Response(
        envelope("internal_error", "Internal server error."),
        status=status.HTTP_500_INTERNAL_SERVER_ERROR,
    )


@csrf_exempt  # a POST to an unknown path is a 404, not a CSRF failure page
def not_found_view(request: Any, *args: Any, **kwargs: Any) -> JsonResponse:
    """Any path under the API prefix that names no endpoint."""
    return JsonResponse(
        envelope("not_found", f"No API endpoint at {request.path}."),
        status=status.HTTP_404_NOT_FOUND,
    )

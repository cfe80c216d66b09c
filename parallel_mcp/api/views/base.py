"""What every API view shares: authentication, permissions, throttling, the JSON parser with
its size limit, the error envelope and the schema class."""

from __future__ import annotations

from collections.abc import Sequence
from functools import cached_property
from typing import Any

from rest_framework.metadata import BaseMetadata
from rest_framework.parsers import BaseParser
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.schemas.inspectors import ViewInspector
from rest_framework.views import APIView

from ...actors import acting_as, for_request
from ...actors import set_current as set_actor
from ...conf import app_settings
from ...orchestrator import Orchestrator
from ..errors import exception_handler
from ..parsers import LimitedJSONParser
from ..permissions import PmcpPermission
from ..schema import PmcpAutoSchema
from ..settings import api_settings
from ..throttling import PmcpRateThrottle


class PmcpViewMixin:
    """Policies read at request time, so settings changes apply without a restart."""

    access: str | dict[str, str] | None = None
    view_permissions: tuple[str, ...] = ()
    throttle_scope = "pmcp"
    permission_classes: Sequence[Any] = [PmcpPermission]
    parser_classes: Sequence[type[BaseParser]] = [LimitedJSONParser]
    renderer_classes: Sequence[type[BaseRenderer]] = [JSONRenderer]
    # Documented in the schema (api/schema.py): statuses beyond the common ones, and the
    # data-dependent 400s; each a tuple, or a dict of tuples by HTTP method.
    error_statuses: tuple[int, ...] | dict[str, tuple[int, ...]] = ()
    data_refusals: tuple[str, ...] | dict[str, tuple[str, ...]] = ()
    tags: tuple[str, ...] = ()
    schema: ViewInspector | None = PmcpAutoSchema()
    metadata_class: str | type[BaseMetadata] | None = None  # OPTIONS: 405, the schema says all

    def get_authenticators(self) -> list[Any]:
        return [auth() for auth in api_settings.authentication_classes()]

    def get_throttles(self) -> list[Any]:
        return [PmcpRateThrottle(self.throttle_scope)]

    def get_exception_handler(self) -> Any:
        return exception_handler

    def dispatch(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        with acting_as(None):  # whatever initial() sets is undone when the request ends
            return super().dispatch(request, *args, **kwargs)  # type: ignore[misc]

    def initial(self, request: Any, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # type: ignore[misc]
        # Authenticated and allowed: the services record this credential as the actor.
        set_actor(for_request(request.user, request.auth))


class JsonErrorsMixin:
    """For views whose success is not JSON (schema YAML, HTML, an event stream): errors are
    still the JSON envelope."""

    def handle_exception(self, exc: Exception) -> Any:
        request = getattr(self, "request", None)
        if request is not None:
            request.accepted_renderer = JSONRenderer()
            request.accepted_media_type = JSONRenderer.media_type
        return super().handle_exception(exc)  # type: ignore[misc]


class ApiView(PmcpViewMixin, APIView):
    """Base of the API's endpoints; views stay thin: parse, call the Orchestrator, serialize."""

    @cached_property
    def orchestrator(self) -> Orchestrator:
        return Orchestrator()

    @property
    def using(self) -> str:
        return self.orchestrator.using

    def body(self, serializer_class: type, **kwargs: Any) -> dict[str, Any]:
        serializer = serializer_class(data=self.request.data, **kwargs)
        serializer.is_valid(raise_exception=True)
        return dict(serializer.validated_data)

    def query(self, serializer_class: type) -> dict[str, Any]:
        serializer = serializer_class(data=self.request.query_params)
        serializer.is_valid(raise_exception=True)
        return {key: value for key, value in serializer.validated_data.items() if value != []}

    def page_size(self, params: dict[str, Any]) -> int:
        return min(params.get("limit") or api_settings.PAGE_SIZE, app_settings.MAX_LIST_LIMIT)

"""The OpenAPI schema of this API and its Swagger UI page (assets from
drf-spectacular-sidecar, never a CDN)."""

from __future__ import annotations

from typing import Any

from django.templatetags.static import static
from drf_spectacular.renderers import OpenApiJsonRenderer, OpenApiYamlRenderer
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView
from rest_framework.renderers import JSONRenderer, TemplateHTMLRenderer

from ..permissions import META
from ..schema import SCHEMA_SETTINGS, api_schema
from .base import JsonErrorsMixin, PmcpViewMixin


class SchemaView(JsonErrorsMixin, PmcpViewMixin, SpectacularAPIView):
    """``GET schema/``: OpenAPI 3 as JSON (``?format=yaml`` or ``Accept:
    application/vnd.oai.openapi`` for YAML)."""

    access = META
    renderer_classes = [OpenApiJsonRenderer, OpenApiYamlRenderer, JSONRenderer]
    custom_settings = SCHEMA_SETTINGS
    urlconf = None

    @api_schema(exclude=True)
    def get(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        return super().get(request, *args, **kwargs)


class DocsView(JsonErrorsMixin, PmcpViewMixin, SpectacularSwaggerView):
    """``GET docs/``: Swagger UI over ``schema/``."""

    access = META
    renderer_classes = [TemplateHTMLRenderer, JSONRenderer]
    url = "../schema/"
    title = SCHEMA_SETTINGS["TITLE"]

    @staticmethod
    def _swagger_ui_resource(filename: str) -> str:
        return static(f"drf_spectacular_sidecar/swagger-ui-dist/{filename}")

    @staticmethod
    def _swagger_ui_favicon() -> str:
        return static("drf_spectacular_sidecar/swagger-ui-dist/favicon-32x32.png")

    @api_schema(exclude=True)
    def get(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        return super().get(request, *args, **kwargs)

from django.conf import settings
from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
]

if settings.API:  # the `api` extra is installed
    # The HTTP API: schema at /api/pmcp/schema/, Swagger UI at /api/pmcp/docs/.
    urlpatterns.append(path("api/pmcp/", include("parallel_mcp.api.urls")))

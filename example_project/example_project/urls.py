from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    # The HTTP API: schema at /api/pmcp/schema/, Swagger UI at /api/pmcp/docs/.
    path("api/pmcp/", include("parallel_mcp.api.urls")),
]

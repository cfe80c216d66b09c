from django.contrib import admin
from django.urls import include, path

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/pmcp/", include("parallel_mcp.api.urls")),
]

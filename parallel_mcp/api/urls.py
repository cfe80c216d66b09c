"""URLconf of the HTTP API (filled in by the API issue)."""

app_name = "parallel_mcp_api"
urlpatterns: list = []

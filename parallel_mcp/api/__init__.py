"""The HTTP API (Django REST framework): ``path("api/pmcp/", include("parallel_mcp.api.urls"))``.

Needs the ``api`` extra: ``pip install 'parallel-mcp[api]'``.
"""

"""The bench's app: no-op handlers for parallel_mcp (pmcp_handlers) and django-tasks-db (tasks)."""

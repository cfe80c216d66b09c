from django.apps import AppConfig


class ParallelMcpConfig(AppConfig):
    name = "parallel_mcp"
    label = "parallel_mcp"
    verbose_name = "Parallel MCP"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import (
            checks,  # noqa: F401  (registers system checks)
            conf,  # noqa: F401  (connects the setting_changed receiver)
        )

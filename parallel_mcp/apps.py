from django.apps import AppConfig


class ParallelMcpConfig(AppConfig):
    name = "parallel_mcp"
    label = "parallel_mcp"
    verbose_name = "Parallel MCP"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from . import checks, conf  # noqa: F401  (system checks; setting_changed receiver)
        from .worker.registry import autodiscover

        # Like admin.py: every installed app's pmcp_handlers module registers its handlers;
        # a kind registered twice fails start-up here.
        autodiscover()

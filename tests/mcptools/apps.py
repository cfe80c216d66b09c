from django.apps import AppConfig


class McpToolsConfig(AppConfig):
    name = "tests.mcptools"
    label = "mcptools"

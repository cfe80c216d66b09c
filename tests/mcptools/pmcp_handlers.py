"""The test tools, declared in the project's registries (only under tests.mcp_tasks_settings,
so that the other tests' servers and workers do not see them)."""

from tests.mcptools.definitions import declare

declare()

"""Settings for an MCP server subprocess with a small failed-authentication limit."""

from tests.settings import *  # noqa: F403

AUTH_FAILURE_LIMIT = 5
PARALLEL_MCP = {**PARALLEL_MCP, "AUTH_FAILURE_LIMIT": AUTH_FAILURE_LIMIT}  # noqa: F405

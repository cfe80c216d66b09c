"""A remote worker process (no database) with the MCP tools of the tasks-extension tests."""

from tests.remote_worker_settings import *  # noqa: F403
from tests.remote_worker_settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.mcptools"]

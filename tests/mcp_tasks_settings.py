"""tests/settings.py plus the app declaring the MCP tools of the tasks-extension tests
(tests/mcptools): the servers and workers those tests start run with
``--settings=tests.mcp_tasks_settings``."""

from tests.settings import *  # noqa: F403
from tests.settings import INSTALLED_APPS

INSTALLED_APPS = [*INSTALLED_APPS, "tests.mcptools"]

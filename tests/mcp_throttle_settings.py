"""Settings for an MCP server subprocess with a small failed-authentication limit."""

from tests.settings import *  # noqa: F403

AUTH_FAILURE_LIMIT = 5
# A day-long window: the test's burst of requests must not straddle a window's end (windows
# are fixed, aligned to the clock; the test waits out the last minutes of a day if it must).
AUTH_FAILURE_WINDOW_SECONDS = 86_400
PARALLEL_MCP = {
    **PARALLEL_MCP,  # noqa: F405
    "AUTH_FAILURE_LIMIT": AUTH_FAILURE_LIMIT,
    "AUTH_FAILURE_WINDOW_SECONDS": AUTH_FAILURE_WINDOW_SECONDS,
}

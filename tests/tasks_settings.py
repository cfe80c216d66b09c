"""tests/settings.py plus a ``TASKS`` setting served by parallel_mcp's backend, for the
django.tasks tests: their worker subprocesses run with ``--settings=tests.tasks_settings``, and
the tests apply the same ``TASKS`` with ``override_settings``."""

from tests.settings import *  # noqa: F403

BACKEND = "parallel_mcp.tasks_backend.ParallelMcpBackend"

TASKS = {
    # Retries at once, so that a --burst worker runs every attempt of a failing task.
    "default": {
        "BACKEND": BACKEND,
        "QUEUES": ["default", "emails"],
        "OPTIONS": {"MAX_ATTEMPTS": 3, "RETRY": None},
    },
    # The documented defaults.
    "defaults": {"BACKEND": BACKEND},
    # One attempt only: a failure is dead-lettered at once.
    "once": {"BACKEND": BACKEND, "QUEUES": ["default"], "OPTIONS": {"MAX_ATTEMPTS": 1}},
}

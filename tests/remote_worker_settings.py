"""Settings for a remote worker process in the tests: the test handlers, and a database that
cannot be opened, so any database access by the worker would fail loudly."""

from tests.settings import *  # noqa: F403

DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": "/nonexistent-directory/pmcp-remote-worker-has-no-database.sqlite3",
        "OPTIONS": {"transaction_mode": "IMMEDIATE", "init_command": "PRAGMA journal_mode=WAL;"},
    }
}

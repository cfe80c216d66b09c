"""Settings for the benchmark (``python -m bench.run`` sets the environment for each process).

``PMCP_BENCH_DB`` picks the engine:

- ``sqlite``: the file ``PMCP_BENCH_SQLITE_PATH`` in WAL mode with IMMEDIATE transactions and
  ``PRAGMA synchronous=$PMCP_BENCH_SYNC`` (``FULL``, the durable default, or ``NORMAL``);
- ``postgres``: the server named by ``PMCP_PG_HOST``/``PMCP_PG_PORT``/``PMCP_PG_USER``/
  ``PMCP_PG_DB`` (bench.run starts a throwaway cluster with tests/pg_cluster.py).

django-tasks-db (the ORM backend of Django's tasks framework) is installed as an app, with its
backend as the default ``TASKS`` backend, only when it is importable: it is a peer to compare
with, not a dependency.
"""

from __future__ import annotations

import importlib.util
import os
import tempfile

SECRET_KEY = "parallel-mcp-bench-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

PEER_INSTALLED = importlib.util.find_spec("django_tasks_db") is not None

INSTALLED_APPS = [
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "parallel_mcp",
    "bench.benchapp",
]
if PEER_INSTALLED:
    if importlib.util.find_spec("django.tasks") is None:
        INSTALLED_APPS.append("django_tasks")  # the backport, on Django 5.2
    INSTALLED_APPS.append("django_tasks_db")
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}

ENGINE = os.environ.get("PMCP_BENCH_DB", "sqlite")
SYNC = os.environ.get("PMCP_BENCH_SYNC", "FULL").upper()
if SYNC not in ("FULL", "NORMAL", "OFF", "EXTRA"):
    raise RuntimeError(f"PMCP_BENCH_SYNC must be FULL or NORMAL, not {SYNC!r}")

if ENGINE == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": os.environ.get("PMCP_PG_HOST", "127.0.0.1"),
            "PORT": os.environ.get("PMCP_PG_PORT", "5432"),
            "USER": os.environ.get("PMCP_PG_USER", "postgres"),
            "NAME": os.environ.get("PMCP_PG_DB", "postgres"),
            # No connection pooler here, so psycopg may prepare the statements a process repeats
            # (docs/settings.md; Django leaves it off for poolers in transaction mode). The same
            # DATABASES serve the Django-based peers; oban and procrastinate use psycopg's own
            # default, which is this value.
            "OPTIONS": {"prepare_threshold": 5},
        }
    }
elif ENGINE == "sqlite":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get(
                "PMCP_BENCH_SQLITE_PATH", os.path.join(tempfile.gettempdir(), "pmcp-bench.sqlite3")
            ),
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": (
                    f"PRAGMA journal_mode=WAL; PRAGMA synchronous={SYNC}; "
                    "PRAGMA busy_timeout=30000;"
                ),
            },
        }
    }
else:  # pragma: no cover
    raise RuntimeError(f"PMCP_BENCH_DB must be 'sqlite' or 'postgres', not {ENGINE!r}")

PARALLEL_MCP = {"DEFAULT_LEASE_MS": 30_000}

# Worker start/stop lines (INFO) reach the logs, which bench.driver reads to know a worker is
# up. django-tasks-db's db_worker logs two INFO lines per task through the tasks framework's
# logger; its handler drops them (the bench measures the queue, not log I/O).
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {
        "stderr": {"class": "logging.StreamHandler"},
        "stderr_warnings": {"class": "logging.StreamHandler", "level": "WARNING"},
    },
    "loggers": {
        "parallel_mcp": {"handlers": ["stderr"], "level": "WARNING"},
        "django_tasks_db": {"handlers": ["stderr"], "level": "WARNING"},
        "django_tasks": {"handlers": ["stderr_warnings"], "propagate": False},
        "django.tasks": {"handlers": ["stderr_warnings"], "propagate": False},
    },
}

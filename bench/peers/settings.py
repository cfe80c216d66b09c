"""Django settings of the Django-based peers' processes (seeding and workers).

``PMCP_BENCH_SYSTEM`` picks the peer: ``dtdb`` (django-tasks-db), ``ox`` (django-ox) or
``procrastinate``. The database is the bench's (``bench.settings.DATABASES``: the same
durable SQLite file or PostgreSQL database as parallel_mcp's workers), with persistent
connections as the peers' documentation recommends for workers: ``CONN_MAX_AGE = 600`` and
``CONN_HEALTH_CHECKS = True`` (django-ox 1.9.1's CHANGELOG and its ``worker_connection_hint``;
django-tasks-db's ``db_worker`` calls ``close_old_connections()`` around every task, so with
Django's default ``CONN_MAX_AGE = 0`` it reconnects for each one). procrastinate's worker
does not use Django's connection: its Django integration hands the worker a psycopg pool
(``get_worker_connector``).
"""

from __future__ import annotations

import copy
import importlib.util
import os

from bench.settings import DATABASES as BENCH_DATABASES
from bench.settings import DEFAULT_AUTO_FIELD, SECRET_KEY, TIME_ZONE, USE_TZ  # noqa: F401

SYSTEM = os.environ.get("PMCP_BENCH_SYSTEM", "")
DEBUG = False

DATABASES = copy.deepcopy(BENCH_DATABASES)
DATABASES["default"]["CONN_MAX_AGE"] = 600
DATABASES["default"]["CONN_HEALTH_CHECKS"] = True

INSTALLED_APPS = ["django.contrib.contenttypes"]
HANDLERS = {
    "stderr": {"class": "logging.StreamHandler", "filters": ["per_task"]},
    # A handler's level, not a logger's: db_worker sets its loggers' levels itself.
    "stderr_warnings": {"class": "logging.StreamHandler", "level": "WARNING"},
}
LOGGERS: dict = {}

if SYSTEM == "dtdb":
    if importlib.util.find_spec("django.tasks") is None:
        INSTALLED_APPS.append("django_tasks")  # the backport, on Django 5.2
    INSTALLED_APPS += ["django_tasks_db", "bench.benchapp"]
    TASKS = {"default": {"BACKEND": "django_tasks_db.DatabaseBackend"}}
    # db_worker's start line is INFO on "django_tasks_db"; the tasks framework logs two INFO
    # lines per task on its own logger.
    LOGGERS = {
        "django_tasks_db": {"handlers": ["stderr"], "level": "INFO"},
        "django_tasks": {"handlers": ["stderr_warnings"], "propagate": False},
        "django.tasks": {"handlers": ["stderr_warnings"], "propagate": False},
    }
elif SYSTEM == "ox":
    INSTALLED_APPS += ["django_ox", "bench.benchapp"]
    TASKS = {"default": {"BACKEND": "django_ox.backend.OxBackend"}}
    LOGGERS = {
        "django_ox": {"handlers": ["stderr"], "level": "INFO", "propagate": False},
        "django.tasks": {"handlers": ["stderr_warnings"], "propagate": False},
    }
elif SYSTEM == "procrastinate":
    INSTALLED_APPS += ["procrastinate.contrib.django"]
    PROCRASTINATE_AUTODISCOVER_MODULE_NAME = None
    PROCRASTINATE_IMPORT_PATHS = ["bench.peers.procrastinate_tasks"]
    LOGGERS = {"procrastinate": {"handlers": ["stderr"], "level": "INFO", "propagate": False}}
else:
    raise RuntimeError(f"PMCP_BENCH_SYSTEM must be dtdb, ox or procrastinate, not {SYSTEM!r}")

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {"per_task": {"()": "bench.peers.logfilter.DropPerTask"}},
    "handlers": HANDLERS,
    "loggers": LOGGERS,
}

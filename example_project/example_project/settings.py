"""Settings of the parallel_mcp example project, for a laptop (settings_production.py is the
sample for a server).

SQLite (WAL, IMMEDIATE transactions) by default, in ``db.sqlite3`` beside manage.py or the file
named by ``PMCP_SQLITE_PATH``; set ``DATABASE_URL`` to ``postgres://user:password@host:port/name``
to use PostgreSQL. ``DEBUG`` is off unless ``DJANGO_DEBUG=1``: with it on, an error page shows
the settings and the code to anyone who can reach the server.
"""

from __future__ import annotations

import os
from importlib.util import find_spec
from pathlib import Path
from urllib.parse import unquote, urlparse

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "parallel-mcp-example-not-for-production")
DEBUG = os.environ.get("DJANGO_DEBUG", "") == "1"
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "[::1]"]
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "example_project.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# The HTTP API (/api/pmcp/) needs the `api` extra, which `make serve` installs; `make demo`
# runs without it.
API_APPS = ["rest_framework", "drf_spectacular", "drf_spectacular_sidecar"]
API = all(find_spec(name) for name in API_APPS)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    *(API_APPS if API else []),
    "parallel_mcp",
    "demo",  # the demo's task handlers (demo/pmcp_handlers.py)
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",  # no page may be framed
]

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]

STATIC_URL = "static/"


def _database_from_url(url: str) -> dict:
    parsed = urlparse(url)
    if parsed.scheme not in ("postgres", "postgresql"):
        raise RuntimeError(f"DATABASE_URL must be a postgres:// URL, got {parsed.scheme!r}")
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": parsed.path.lstrip("/") or "postgres",
        "USER": unquote(parsed.username or ""),
        "PASSWORD": unquote(parsed.password or ""),
        "HOST": parsed.hostname or "",
        "PORT": str(parsed.port or ""),
    }


if os.environ.get("DATABASE_URL"):
    DATABASES = {"default": _database_from_url(os.environ["DATABASE_URL"])}
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": os.environ.get("PMCP_SQLITE_PATH", str(BASE_DIR / "db.sqlite3")),
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 20,
                "init_command": (
                    "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=20000;"
                ),
            },
        }
    }

PARALLEL_MCP = {"DEFAULT_LEASE_MS": 30_000}

"""Settings for the test suite.

``PMCP_TEST_DB`` picks the engine: ``sqlite`` (a file database, so worker subprocesses share
it) or ``postgres`` (the throwaway cluster started by ``tests/run_all.py``, found through
``PMCP_PG_HOST``/``PMCP_PG_PORT``/``PMCP_PG_USER``/``PMCP_PG_DB``). Subprocesses started by the
tests reuse this module and get the test database's name through ``PMCP_DB_NAME``.
"""

from __future__ import annotations

import os
import tempfile

SECRET_KEY = "parallel-mcp-tests-only"
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = "tests.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "parallel_mcp",
    "tests.testapp",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
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
ALLOWED_HOSTS = ["127.0.0.1", "localhost", "testserver"]
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]  # fast tests only

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "parallel_mcp API",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
}

ENGINE = os.environ.get("PMCP_TEST_DB", "sqlite")
DB_NAME_OVERRIDE = os.environ.get("PMCP_DB_NAME")  # set for subprocesses: use the test DB as is

if ENGINE == "postgres":
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "HOST": os.environ.get("PMCP_PG_HOST", "127.0.0.1"),
            "PORT": os.environ.get("PMCP_PG_PORT", "5432"),
            "USER": os.environ.get("PMCP_PG_USER", "postgres"),
            "NAME": DB_NAME_OVERRIDE or os.environ.get("PMCP_PG_DB", "postgres"),
            "TEST": {"NAME": "test_parallel_mcp"},
        }
    }
elif ENGINE == "sqlite":
    _test_path = os.path.join(tempfile.gettempdir(), f"pmcp-test-{os.getpid()}.sqlite3")
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": DB_NAME_OVERRIDE or os.path.join(tempfile.gettempdir(), "pmcp-unused.sqlite3"),
            "TEST": {"NAME": _test_path},
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "timeout": 30,
                "init_command": (
                    "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA busy_timeout=30000;"
                ),
            },
        }
    }
else:  # pragma: no cover
    raise RuntimeError(f"PMCP_TEST_DB must be 'sqlite' or 'postgres', not {ENGINE!r}")

PARALLEL_MCP = {"DEFAULT_LEASE_MS": 30_000}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"stderr": {"class": "logging.StreamHandler"}},
    "loggers": {"parallel_mcp": {"handlers": ["stderr"], "level": "WARNING"}},
}

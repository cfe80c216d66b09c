"""A sample of production settings for the example project: start yours from it.

It is settings.py with what ``manage.py check --deploy`` asks for. It assumes HTTPS, terminated
by a reverse proxy (nginx, a load balancer) that sets ``X-Forwarded-Proto`` and serves
``STATIC_ROOT`` (fill it with ``manage.py collectstatic``). It reads from the environment:

- ``DJANGO_SECRET_KEY`` (required): a long random string, e.g. from
  ``python -c "import secrets; print(secrets.token_urlsafe(50))"``;
- ``DJANGO_ALLOWED_HOSTS`` (required): the host names it serves, comma-separated;
- ``DATABASE_URL``: ``postgres://user:password@host:port/name`` (otherwise SQLite, as in
  settings.py).

    DJANGO_SETTINGS_MODULE=example_project.settings_production python manage.py check --deploy
"""

from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

from .settings import *  # noqa: F403
from .settings import BASE_DIR


def _required(name: str, what: str) -> str:
    value = os.environ.get(name, "").strip()
    if not value:
        raise ImproperlyConfigured(f"Set the environment variable {name}: {what}.")
    return value


SECRET_KEY = _required("DJANGO_SECRET_KEY", "a long random string, kept secret")
ALLOWED_HOSTS = [
    host.strip()
    for host in _required("DJANGO_ALLOWED_HOSTS", "the host names served, comma-separated").split(
        ","
    )
    if host.strip()
]
DEBUG = False

# HTTPS only. The proxy must set X-Forwarded-Proto (and drop a client's own).
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SECURE_SSL_REDIRECT = True
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
# HSTS for a year. INCLUDE_SUBDOMAINS and PRELOAD commit every subdomain to HTTPS too: turn them
# off (and silence security.W005 and W021) if that is not true of your domain.
SECURE_HSTS_SECONDS = 31_536_000
SECURE_HSTS_INCLUDE_SUBDOMAINS = True
SECURE_HSTS_PRELOAD = True

STATIC_ROOT = BASE_DIR / "staticfiles"

# drf-spectacular's deploy check builds a schema of every DRF view with SPECTACULAR_SETTINGS,
# not with the settings parallel_mcp serves its schema with (its enum names), and so warns
# about names the schema at /api/pmcp/schema/ does not have. This project has no other DRF
# views; a project with its own should keep the check and give it its own settings.
SPECTACULAR_SETTINGS = {"ENABLE_DJANGO_DEPLOY_CHECK": False}

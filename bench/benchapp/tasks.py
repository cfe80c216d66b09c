"""The same no-op for django-tasks-db's ``db_worker`` (imported only when it is installed)."""

from __future__ import annotations

try:
    from django.tasks import task  # Django 6
except ImportError:  # Django 5.2: the django-tasks backport
    from django_tasks import task


@task()
def noop() -> None:
    return None

"""App wiring: import safety, settings, system checks, migrations."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys

import pytest
from django.core.management import call_command
from django.test import override_settings
from django.test.utils import isolate_apps

from parallel_mcp import checks
from parallel_mcp.conf import app_settings
from tests.subprocesses import REPO


def test_package_imports_before_django_is_configured():
    env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "import parallel_mcp, parallel_mcp.exceptions, parallel_mcp.states;"
            "print(parallel_mcp.__version__)",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == parallel_mcp_version()


def parallel_mcp_version() -> str:
    import parallel_mcp

    return parallel_mcp.__version__


@pytest.mark.django_db
def test_migrations_match_the_models():
    out = io.StringIO()
    call_command("makemigrations", "parallel_mcp", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def test_settings_are_read_lazily_and_reloaded():
    assert app_settings.DEFAULT_LEASE_MS == 30_000
    with override_settings(PARALLEL_MCP={"DEFAULT_LEASE_MS": 1234}):
        assert app_settings.DEFAULT_LEASE_MS == 1234
    assert app_settings.DEFAULT_LEASE_MS == 30_000
    with pytest.raises(AttributeError):
        app_settings.NOT_A_SETTING  # noqa: B018


def _ids(messages) -> list[str]:
    return [message.id for message in messages]


def test_unknown_setting_key_is_a_check_error_with_a_suggestion():
    with override_settings(PARALLEL_MCP={"DEFAULT_LEASE": 1}):
        messages = checks.check_settings()
    assert _ids(messages) == ["parallel_mcp.E002"]
    assert "DEFAULT_LEASE_MS" in messages[0].hint


@pytest.mark.parametrize(
    "key", ["DEFAULT_LEASE_MS", "WORKER_PRESENCE_INTERVAL_MS", "WORKER_LEASE_EXPIRY_INTERVAL_MS"]
)
@pytest.mark.parametrize("value", [0, -5, "30s", True])
def test_bad_setting_values_are_check_errors(key, value):
    with override_settings(PARALLEL_MCP={key: value}):
        assert _ids(checks.check_settings()) == ["parallel_mcp.E003"]


def test_settings_must_be_a_dict():
    with override_settings(PARALLEL_MCP=["nope"]):
        assert _ids(checks.check_settings()) == ["parallel_mcp.E001"]


def test_valid_settings_pass():
    with override_settings(PARALLEL_MCP={"DEFAULT_LEASE_MS": 10_000, "MAX_LIST_LIMIT": 50}):
        assert checks.check_settings() == []


def test_sqlite_without_wal_and_immediate_is_warned_with_the_fix():
    databases = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "/tmp/x.sqlite3"},
    }
    messages = checks.sqlite_warnings(databases)
    assert _ids(messages) == ["parallel_mcp.W001", "parallel_mcp.W002"]
    assert "transaction_mode" in messages[0].hint and "journal_mode=WAL" in messages[1].hint


def test_sqlite_configured_as_documented_passes():
    databases = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": "/tmp/x.sqlite3",
            "OPTIONS": {
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL;",
            },
        },
        "pg": {"ENGINE": "django.db.backends.postgresql", "NAME": "x"},
    }
    assert checks.sqlite_warnings(databases) == []


@isolate_apps("tests.testapp")
def test_a_foreign_key_to_the_lease_view_is_a_check_error_with_the_fix():
    from django.db import models

    from parallel_mcp.models import Attempt, Lease

    class LeaseNote(models.Model):  # noqa: DJ008
        lease = models.ForeignKey(Lease, on_delete=models.CASCADE)
        attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE)

        class Meta:
            app_label = "testapp"

    class LeaseTag(models.Model):  # noqa: DJ008
        lease = models.OneToOneField(Lease, on_delete=models.CASCADE)

        class Meta:
            app_label = "testapp"

    messages = checks.lease_relations([LeaseNote, LeaseTag, Lease, Attempt])
    assert _ids(messages) == ["parallel_mcp.E005", "parallel_mcp.E005"]
    assert "testapp.LeaseNote.lease relates to parallel_mcp.Lease" in messages[0].msg
    assert "parallel_mcp.Attempt" in messages[0].hint


def test_a_database_parallel_mcp_cannot_write_to_is_a_check_error(monkeypatch):
    from parallel_mcp.services import dialect

    with pytest.raises(dialect.UnsupportedDatabase, match="SQLite and PostgreSQL, not mysql"):
        dialect._dialect.__wrapped__("mysql", "default")

    def unsupported(using: str) -> None:
        raise dialect.UnsupportedDatabase(f"parallel_mcp supports ..., not {using}.")

    monkeypatch.setattr(dialect, "dialect_for", unsupported)
    messages = checks.check_database()
    assert _ids(messages) == ["parallel_mcp.E004"]
    assert messages[0].msg == "parallel_mcp supports ..., not default."


def test_the_test_database_itself_passes_every_check():
    from django.core.checks import run_checks

    problems = [m for m in run_checks() if m.id and m.id.startswith("parallel_mcp.")]
    assert problems == []


def test_check_messages_stand_on_their_own_without_the_repository():
    """A pip install has no docs/ folder: no message or hint may send the reader to a file of
    the repository; the fix is in the hint itself."""
    messages = checks.sqlite_warnings(
        {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "/tmp/x.sqlite3"}}
    )
    for value in ("x", {"DEFAULT_LEASE_MS": 0, "DEFAULT_LEASE": 1, "HANDLERS": [], "XYZ": 1}):
        with override_settings(PARALLEL_MCP=value):
            messages += checks.check_settings()
    assert {message.id for message in messages} >= {
        "parallel_mcp.E001",
        "parallel_mcp.E002",
        "parallel_mcp.E003",
        "parallel_mcp.W001",
        "parallel_mcp.W002",
    }
    for message in messages:
        text = f"{message.msg} {message.hint or ''}"
        assert not re.search(r"[\w./-]+\.(md|rst|txt)\b|\bdocs/", text), text
    sqlite_hint = messages[0].hint
    assert '"transaction_mode": "IMMEDIATE"' in sqlite_hint and "journal_mode=WAL" in sqlite_hint
    assert "write lock" in sqlite_hint and "readers" in sqlite_hint  # why, not only what

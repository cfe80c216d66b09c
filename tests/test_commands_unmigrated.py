"""Commands against a database nobody ran ``migrate`` on: one line saying so, exit status 1,
no traceback, no retry loop. Real processes against a fresh, empty database (a new SQLite
file; on the PostgreSQL leg a new PostgreSQL database)."""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from django.db import connection

from tests.workers import (
    DEFAULT_TIMEOUT,
    kill_leftover_processes,  # noqa: F401 - autouse fixture
    run_command,
    start_command,
)

pytestmark = [pytest.mark.slow, pytest.mark.django_entry]

NO_TABLES = (
    "CommandError: parallel_mcp: the database 'default' has no parallel_mcp tables — "
    "run `python manage.py migrate`"
)

COMMANDS = [
    ("pmcp_worker",),
    ("pmcp_worker", "--burst"),
    ("pmcp_status",),
    ("pmcp_status", "--stuck"),
    ("pmcp_expire_leases",),
    ("pmcp_expire_leases", "--once"),
    ("pmcp_prune", "--older-than", "1d"),
    ("pmcp_prune", "--older-than", "1d", "--dry-run"),
    ("pmcp_mcp",),
    ("pmcp_mcp", "--transport", "http", "--port", "1"),
]


@pytest.fixture
def empty_database() -> Iterator[dict[str, str]]:
    """Environment overrides that point a child process at a new, empty database."""
    if connection.vendor == "sqlite":
        with tempfile.TemporaryDirectory(prefix="pmcp-unmigrated-") as scratch:
            yield {"PMCP_DB_NAME": str(Path(scratch) / "fresh.sqlite3")}
        return
    import psycopg

    settings = connection.settings_dict
    name = f"pmcp_unmigrated_{uuid.uuid4().hex[:12]}"
    server = {"host": settings["HOST"], "port": settings["PORT"], "user": settings["USER"]}
    with psycopg.connect(dbname=settings["NAME"], autocommit=True, **server) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield {"PMCP_DB_NAME": name}
    finally:
        with psycopg.connect(dbname=settings["NAME"], autocommit=True, **server) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.mark.django_db
def test_every_command_says_run_migrate_in_one_line_and_exits_1(empty_database):
    """All commands in one test, a few processes at a time. Before the check, the worker
    retried "database hiccups" forever (so it would be killed at the timeout here)."""
    processes = []
    for args in COMMANDS:
        if len(processes) >= 3:
            processes[-3][-1].wait(DEFAULT_TIMEOUT)
        processes.append((args, start_command(*args, env=empty_database)))
    problems = []
    for args, process in processes:
        code = process.finish()
        err = process.err.strip()
        label = " ".join(args)
        if code != 1:
            problems.append(f"{label}: exit {code}")
        if err != NO_TABLES:
            problems.append(f"{label}: stderr is not the one line: {err!r}")
        if process.out:
            problems.append(f"{label}: wrote to stdout: {process.out!r}")
    assert not problems, "\n".join(problems)


@pytest.mark.django_db
def test_a_database_behind_the_code_names_the_missing_migrations(empty_database):
    code, _, err = run_command("migrate", "parallel_mcp", "0002", "-v", "0", env=empty_database)
    assert code == 0, err
    code, out, err = run_command("pmcp_status", env=empty_database)
    assert code == 1
    line = err.strip()
    assert "\n" not in line and "Traceback" not in line, err
    assert line.startswith(
        "CommandError: parallel_mcp: the database 'default' lacks the parallel_mcp migration(s) "
        "0003_api_tokens"
    )
    assert line.endswith("— run `python manage.py migrate`")
    assert out == ""


@pytest.mark.django_db
def test_after_migrate_the_commands_work(empty_database):
    code, _, err = run_command("migrate", "-v", "0", env=empty_database)
    assert code == 0, err
    code, out, err = run_command("pmcp_status", env=empty_database)
    assert (code, out.strip()) == (0, "no runs"), err
    code, out, err = run_command("pmcp_expire_leases", "--once", env=empty_database)
    assert (code, out.strip()) == (0, "expired 0 lease(s)"), err


def test_an_unreachable_database_is_one_line_too(tmp_path):
    """A SQLite path in a directory that does not exist cannot even be opened."""
    missing = tmp_path / "no-such-dir" / "db.sqlite3"
    env = {"PMCP_DB_NAME": str(missing), "PMCP_TEST_DB": "sqlite"}
    code, out, err = run_command("pmcp_status", env=env)
    assert code == 1
    assert err.strip().startswith(
        "CommandError: parallel_mcp: cannot reach the database 'default': "
    ), err
    assert "\n" not in err.strip() and out == ""
    assert not os.path.exists(missing)

"""The bench's databases: configurations, a PostgreSQL cluster with durable settings, and
cheap resets of the work database from named templates (a file copy on SQLite, ``CREATE
DATABASE … TEMPLATE`` on PostgreSQL), so every measured run starts from the same rows."""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

PG_WORK_DB = "pmcp_bench"
PG_MAINTENANCE_DB = "postgres"
# The throwaway test cluster runs with fsync off; the bench measures durable commits.
PG_DURABLE_SETTINGS = {"fsync": "on", "synchronous_commit": "on", "full_page_writes": "on"}


@dataclass(frozen=True)
class DbConfig:
    name: str  # sqlite-full, sqlite-normal, postgres
    engine: str  # sqlite | postgres
    sync: str = "FULL"  # SQLite's PRAGMA synchronous

    @property
    def label(self) -> str:
        if self.engine == "sqlite":
            return f"SQLite WAL synchronous={self.sync}"
        return "PostgreSQL (fsync=on, synchronous_commit=on)"


CONFIGS = {
    "sqlite-full": DbConfig("sqlite-full", "sqlite", "FULL"),
    "sqlite-normal": DbConfig("sqlite-normal", "sqlite", "NORMAL"),
    "postgres": DbConfig("postgres", "postgres"),
}


def process_env(config: DbConfig, workdir: Path, pg_env: dict[str, str] | None) -> dict[str, str]:
    """Environment of every bench process (driver and workers) for ``config``."""
    repo = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ)
    env["PYTHONPATH"] = repo + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["DJANGO_SETTINGS_MODULE"] = "bench.settings"
    env["PMCP_BENCH_DB"] = config.engine
    env["PMCP_BENCH_SYNC"] = config.sync
    env["PMCP_BENCH_SQLITE_PATH"] = str(workdir / f"{config.name}.sqlite3")
    env["PMCP_BENCH_WORKDIR"] = str(workdir)
    if config.engine == "postgres":
        if not pg_env:
            raise RuntimeError("PostgreSQL configuration without a cluster")
        env.update(pg_env)
        env["PMCP_PG_DB"] = PG_WORK_DB
    return env


@contextlib.contextmanager
def durable_cluster() -> Iterator[dict[str, str]]:
    """A throwaway PostgreSQL cluster (tests/pg_cluster.py) switched to durable commits.

    Yields the PMCP_PG_* environment plus ``PMCP_BENCH_PG_SETTINGS`` (what SHOW reported)."""
    import psycopg

    from tests.pg_cluster import ensure_postgres_binaries, throwaway_cluster

    # As for the tests: Debian's server binaries are installed when missing (root + apt-get,
    # unless PMCP_NO_APT is set); without them the bench reports SQLite alone.
    with throwaway_cluster(ensure_postgres_binaries()) as cluster:
        with psycopg.connect(cluster.dsn, autocommit=True) as conn:
            for name, value in PG_DURABLE_SETTINGS.items():
                conn.execute(f"ALTER SYSTEM SET {name} = {value}")
            conn.execute("SELECT pg_reload_conf()")
            conn.execute(f"CREATE DATABASE {PG_WORK_DB}")
        # The reload is asynchronous: check from new sessions until it has taken effect.
        names = (*PG_DURABLE_SETTINGS, "wal_sync_method", "shared_buffers", "server_version")
        deadline = time.monotonic() + 30
        while True:
            with psycopg.connect(cluster.dsn, autocommit=True) as conn:
                shown = {name: conn.execute(f"SHOW {name}").fetchone()[0] for name in names}
            if all(shown[name] == value for name, value in PG_DURABLE_SETTINGS.items()):
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL did not take the durable settings: {shown}")
            time.sleep(0.1)
        env = cluster.env()
        env["PMCP_BENCH_PG_SETTINGS"] = ",".join(f"{k}={v}" for k, v in shown.items())
        yield env


class Workspace:
    """The work database of the current process's configuration (Django must be set up)."""

    def __init__(self) -> None:
        from django.db import connections

        self.connection = connections["default"]
        self.vendor = self.connection.vendor
        if self.vendor == "sqlite":
            self.path = Path(self.connection.settings_dict["NAME"])

    def _close(self) -> None:
        from django.db import connections

        connections.close_all()

    # -- SQLite ------------------------------------------------------------------------------
    def _template_path(self, name: str) -> Path:
        return self.path.with_name(f"{self.path.stem}.tpl-{name}.sqlite3")

    def _remove_work_files(self) -> None:
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.remove(f"{self.path}{suffix}")

    # -- PostgreSQL ---------------------------------------------------------------------------
    def _maintenance(self):
        import psycopg

        params = self.connection.get_connection_params()
        params = {k: params[k] for k in ("host", "port", "user", "password") if params.get(k)}
        return psycopg.connect(dbname=PG_MAINTENANCE_DB, autocommit=True, **params)

    @staticmethod
    def _pg_template(name: str) -> str:
        return f"{PG_WORK_DB}_tpl_{name.replace('-', '_')}"

    # -- public --------------------------------------------------------------------------------
    def snapshot(self, name: str) -> None:
        """Keep the work database as it is now under ``name``."""
        self._close()
        if self.vendor == "sqlite":
            with contextlib.closing(sqlite3.connect(self.path)) as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            shutil.copyfile(self.path, self._template_path(name))
            return
        template = self._pg_template(name)
        with self._maintenance() as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {template} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {template} TEMPLATE {PG_WORK_DB}")

    def restore(self, name: str) -> None:
        """Replace the work database with the snapshot ``name``."""
        self._close()
        if self.vendor == "sqlite":
            self._remove_work_files()
            shutil.copyfile(self._template_path(name), self.path)
            return
        with self._maintenance() as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {PG_WORK_DB} WITH (FORCE)")
            conn.execute(f"CREATE DATABASE {PG_WORK_DB} TEMPLATE {self._pg_template(name)}")

    def make_blank(self) -> None:
        """Empties the work database (a new SQLite file in WAL mode; on PostgreSQL the work
        database is new) and keeps it as the snapshot ``blank``."""
        if self.vendor == "sqlite":
            self._close()
            self._remove_work_files()
            with contextlib.closing(sqlite3.connect(self.path)) as conn:
                conn.execute("PRAGMA journal_mode=WAL")
        self.snapshot("blank")

    def has(self, name: str) -> bool:
        if self.vendor == "sqlite":
            return self._template_path(name).exists()
        with self._maintenance() as conn:
            row = conn.execute(
                "SELECT 1 FROM pg_database WHERE datname = %s", [self._pg_template(name)]
            ).fetchone()
        return row is not None

    def analyze(self) -> None:
        """Statistics for what was just seeded. On PostgreSQL only the tables that hold rows:
        statistics saying a table is empty make PostgreSQL plan the foreign-key checks against
        it (cached per connection) as sequential scans, which then read the whole growing table
        for every row inserted until the next ANALYZE. A live database is not in that state
        for long (autovacuum analyzes a table once about 50 rows changed), but a run here is
        shorter than that: parallel_mcp's checks against pmcp_attempt took 73 us instead of 2,
        a third of the server's CPU per task. The same rule holds for every system."""
        with self.connection.cursor() as cursor:
            if self.vendor != "postgresql":
                cursor.execute("ANALYZE")
                return
            cursor.execute(
                "SELECT format('%I.%I', n.nspname, c.relname) FROM pg_class c "
                "JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p') "
                "AND n.nspname NOT IN ('pg_catalog', 'information_schema') "
                "AND n.nspname NOT LIKE 'pg_toast%%'"
            )
            filled = []
            for (table,) in cursor.fetchall():
                cursor.execute(f"SELECT EXISTS (SELECT 1 FROM {table})")
                if cursor.fetchone()[0]:
                    filled.append(table)
            if filled:
                cursor.execute(f"ANALYZE {', '.join(filled)}")

"""Run the whole test suite on SQLite and on a throwaway PostgreSQL cluster.

    python -m tests.run_all [extra pytest args]     (from the repository root)

Legs (select with PMCP_TEST_DBS, a comma list, default "sqlite,postgres"):

* sqlite:   ``python -m pytest ARGS`` with PMCP_TEST_DB=sqlite
* postgres: start a throwaway cluster (tests/pg_cluster.py), then ``python -m pytest ARGS``
            with PMCP_TEST_DB=postgres and PMCP_PG_HOST/PORT/USER/DB; stop the cluster.

If PostgreSQL server binaries cannot be had, the postgres leg fails when CI=true or
PMCP_REQUIRE_POSTGRES=1, and is skipped with a loud warning otherwise.  Both legs run even
if the first fails; pytest's exit code 5 (no tests collected) counts as a failure.  The exit
status is non-zero if any leg failed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tests.pg_cluster import PostgresUnavailable, ensure_postgres_binaries, throwaway_cluster

REPO_ROOT = Path(__file__).resolve().parent.parent
KNOWN_LEGS = ("sqlite", "postgres")
PYTEST_NO_TESTS = 5


def _banner(text: str) -> None:
    line = "=" * 78
    print(f"\n{line}\n{text}\n{line}", flush=True)


def _warn(text: str) -> None:
    stars = "*" * 78
    print(f"\n{stars}\n* WARNING: {text}\n{stars}\n", file=sys.stderr, flush=True)


def _postgres_required() -> bool:
    return (
        os.environ.get("CI", "").strip().lower() == "true"
        or os.environ.get("PMCP_REQUIRE_POSTGRES", "").strip() == "1"
    )


def _run_pytest(args: list[str], extra_env: dict[str, str]) -> tuple[str, str]:
    """Run pytest in a subprocess; return (status, detail)."""
    env = dict(os.environ, **extra_env)
    cmd = [sys.executable, "-m", "pytest", *args]
    shown = " ".join(f"{k}={v}" for k, v in extra_env.items())
    print(f"$ {shown} {' '.join(cmd)}", flush=True)
    sys.stderr.flush()
    rc = subprocess.run(cmd, cwd=REPO_ROOT, env=env).returncode
    if rc == 0:
        return "passed", ""
    if rc == PYTEST_NO_TESTS:
        return "failed", "no tests collected (pytest exit 5)"
    return "failed", f"pytest exit {rc}"


def _sqlite_leg(args: list[str]) -> tuple[str, str]:
    _banner("run_all: leg 'sqlite'")
    return _run_pytest(args, {"PMCP_TEST_DB": "sqlite"})


def _postgres_leg(args: list[str]) -> tuple[str, str]:
    _banner("run_all: leg 'postgres'")
    try:
        bindir = ensure_postgres_binaries()
    except PostgresUnavailable as exc:
        if _postgres_required():
            msg = f"PostgreSQL is required here (CI=true or PMCP_REQUIRE_POSTGRES=1): {exc}"
            print(f"run_all: ERROR: {msg}", file=sys.stderr, flush=True)
            return "failed", "no PostgreSQL server binaries"
        _warn(
            f"{exc}\n* The PostgreSQL leg is SKIPPED: this run does NOT cover PostgreSQL.\n"
            "* Install PostgreSQL (Debian: apt-get install postgresql) to run it."
        )
        return "skipped", "no PostgreSQL server binaries"
    print(f"run_all: using PostgreSQL binaries in {bindir}", flush=True)
    try:
        with throwaway_cluster(bindir) as pg:
            print(f"run_all: throwaway cluster {pg.dsn} in {pg.tmpdir}", flush=True)
            return _run_pytest(args, {"PMCP_TEST_DB": "postgres", **pg.env()})
    except PostgresUnavailable as exc:
        print(f"run_all: ERROR: could not start PostgreSQL: {exc}", file=sys.stderr, flush=True)
        return "failed", "throwaway cluster did not start"


def _on_sigterm(signum: int, frame: object) -> None:
    # Turn SIGTERM into an exception so that the cluster is stopped and deleted.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    raw = os.environ.get("PMCP_TEST_DBS", "sqlite,postgres")
    legs = [leg.strip().lower() for leg in raw.split(",") if leg.strip()]
    unknown = [leg for leg in legs if leg not in KNOWN_LEGS]
    if unknown or not legs:
        print(
            f"run_all: bad PMCP_TEST_DBS={raw!r}; use a comma list of {', '.join(KNOWN_LEGS)}",
            file=sys.stderr,
        )
        return 2

    signal.signal(signal.SIGTERM, _on_sigterm)
    results: dict[str, tuple[str, str]] = {}
    interrupted = False
    try:
        for leg in dict.fromkeys(legs):  # de-duplicate, keep order
            runner = _sqlite_leg if leg == "sqlite" else _postgres_leg
            results[leg] = runner(args)
    except KeyboardInterrupt:
        interrupted = True

    _banner("run_all: summary")
    for leg in dict.fromkeys(legs):
        status, detail = results.get(leg, ("not run", "interrupted" if interrupted else ""))
        print(f"{leg}: {status}" + (f" ({detail})" if detail else ""))
    sys.stdout.flush()
    if interrupted:
        print("run_all: interrupted", file=sys.stderr)
        return 130
    failed = any(status == "failed" for status, _ in results.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

"""Run the test suite on SQLite and on a throwaway PostgreSQL cluster, then again on Django 6.

    python -m tests.run_all [extra pytest args]     (from the repository root)

The main legs run under this interpreter (the project's ``.venv``: Python 3.11, Django 5.2).
Which databases: PMCP_TEST_DBS, a comma list, default "sqlite,postgres".

* sqlite:   ``python -m pytest ARGS`` with PMCP_TEST_DB=sqlite
* postgres: start a throwaway cluster (tests/pg_cluster.py), then ``python -m pytest ARGS``
            with PMCP_TEST_DB=postgres and PMCP_PG_HOST/PORT/USER/DB; stop the cluster.

Then the Django 6 legs, django6-sqlite and django6-postgres (for the same databases), run
the same way under the interpreter of a second virtualenv with the newest Django 6.x on
Python 3.13: PMCP_DJANGO6_PYTHON, default ``.venv-django6/bin/python`` (``make test``
creates it).  Without ARGS naming tests they run DJANGO6_TESTS; with ARGS that name a test
file or directory, those.
PMCP_TEST_DJANGO6 chooses: "1" (default) runs them after the main legs, "0" skips them,
"only" runs them alone.

If PostgreSQL server binaries cannot be had, the postgres legs fail when CI=true or
PMCP_REQUIRE_POSTGRES=1, and are skipped with a loud warning otherwise.  Likewise a missing
Django 6 interpreter fails its legs when CI=true or PMCP_REQUIRE_DJANGO6=1.  Every leg runs
even if an earlier one failed; pytest's exit code 5 (no tests collected) counts as a failure.
The summary gives each leg's result and wall time; the exit status is non-zero if any leg
failed.

With more than one database the databases run as lanes side by side (PMCP_TEST_LANES, "1" by
default; "0" runs the legs one by one): each lane is this runner in a child process for one
database, its main leg then its Django 6 leg. The first lane's output streams; the others'
is printed when they are done, each with its own summary, then the lanes' results.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.pg_cluster import PostgresUnavailable, ensure_postgres_binaries, throwaway_cluster

REPO_ROOT = Path(__file__).resolve().parent.parent
KNOWN_DBS = ("sqlite", "postgres")
DJANGO6_CHOICES = ("0", "1", "only")
DEFAULT_DJANGO6_PYTHON = REPO_ROOT / ".venv-django6" / "bin" / "python"
PYTEST_NO_TESTS = 5

# What the Django 6 legs run when ARGS name no tests (CI's budget: well under 20 minutes in
# all). Both databases: the suite without the tests marked ``slow`` (worker processes, large
# volumes, the schemathesis run: 60 % of the time), which exercise the engine and the worker
# loop, not Django; but with the slow tests marked ``django_entry`` (commands and projects
# started as processes, the django.tasks backend), which Django's version does change.
DJANGO6_TESTS = [
    "tests",
    "--ignore=tests/test_admin_browser.py",
    "-m",
    "not slow or django_entry",
]


Outcome = tuple[str, str]  # (status, detail)


def _banner(text: str) -> None:
    line = "=" * 78
    print(f"\n{line}\n{text}\n{line}", flush=True)


def _warn(text: str) -> None:
    stars = "*" * 78
    print(f"\n{stars}\n* WARNING: {text}\n{stars}\n", file=sys.stderr, flush=True)


def _required(variable: str) -> bool:
    return (
        os.environ.get("CI", "").strip().lower() == "true"
        or os.environ.get(variable, "").strip() == "1"
    )


def _run_pytest(python: str, args: list[str], extra_env: dict[str, str]) -> Outcome:
    """Run pytest in a subprocess; return (status, detail)."""
    env = dict(os.environ, **extra_env)
    cmd = [python, "-m", "pytest", *args]
    shown = " ".join(f"{k}={v}" for k, v in extra_env.items())
    print(f"$ {shown} {' '.join(cmd)}", flush=True)
    sys.stderr.flush()
    rc = subprocess.run(cmd, cwd=REPO_ROOT, env=env).returncode
    if rc == 0:
        return "passed", ""
    if rc == PYTEST_NO_TESTS:
        return "failed", "no tests collected (pytest exit 5)"
    return "failed", f"pytest exit {rc}"


def _sqlite(python: str, args: list[str]) -> Outcome:
    return _run_pytest(python, args, {"PMCP_TEST_DB": "sqlite"})


def _postgres(python: str, args: list[str]) -> Outcome:
    try:
        bindir = ensure_postgres_binaries()
    except PostgresUnavailable as exc:
        if _required("PMCP_REQUIRE_POSTGRES"):
            msg = f"PostgreSQL is required here (CI=true or PMCP_REQUIRE_POSTGRES=1): {exc}"
            print(f"run_all: ERROR: {msg}", file=sys.stderr, flush=True)
            return "failed", "no PostgreSQL server binaries"
        _warn(
            f"{exc}\n* This PostgreSQL leg is SKIPPED: this run does NOT cover PostgreSQL.\n"
            "* Install PostgreSQL (Debian: apt-get install postgresql) to run it."
        )
        return "skipped", "no PostgreSQL server binaries"
    print(f"run_all: using PostgreSQL binaries in {bindir}", flush=True)
    try:
        with throwaway_cluster(bindir) as pg:
            print(f"run_all: throwaway cluster {pg.dsn} in {pg.tmpdir}", flush=True)
            return _run_pytest(python, args, {"PMCP_TEST_DB": "postgres", **pg.env()})
    except PostgresUnavailable as exc:
        print(f"run_all: ERROR: could not start PostgreSQL: {exc}", file=sys.stderr, flush=True)
        return "failed", "throwaway cluster did not start"


def _django6_python() -> tuple[str | None, str]:
    """The Django 6 interpreter and its versions, or (None, why it cannot be used)."""
    python = os.path.abspath(
        os.environ.get("PMCP_DJANGO6_PYTHON", "").strip() or DEFAULT_DJANGO6_PYTHON
    )
    if not Path(python).is_file():
        return None, f"no Django 6 interpreter at {python}"
    probe = subprocess.run(
        [python, "-c", "import sys, django; print(sys.version.split()[0], django.get_version())"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return None, f"{python} cannot import Django: {probe.stderr.strip()[-300:]}"
    python_version, django_version = probe.stdout.split()
    if not django_version.startswith("6."):
        return None, f"{python} has Django {django_version}, not 6.x"
    return python, f"Python {python_version}, Django {django_version}"


def _names_tests(args: list[str]) -> bool:
    """Whether pytest arguments name a test file or directory (``path`` or ``path::test``)."""
    return any(
        not arg.startswith("-") and (REPO_ROOT / arg.split("::")[0]).exists() for arg in args
    )


def _django6_leg(db: str, args: list[str]) -> Outcome:
    python, about = _django6_python()
    if python is None:
        if _required("PMCP_REQUIRE_DJANGO6"):
            msg = (
                f"the Django 6 legs are required here (CI=true or PMCP_REQUIRE_DJANGO6=1): {about}"
            )
            print(f"run_all: ERROR: {msg}", file=sys.stderr, flush=True)
            return "failed", about
        _warn(
            f"{about}.\n* This Django 6 leg is SKIPPED: this run does NOT cover Django 6.\n"
            "* `make test` creates .venv-django6 from Python 3.13 (pyenv's 3.13.0 or\n"
            "* python3.13 on PATH); PMCP_TEST_DJANGO6=0 silences this."
        )
        return "skipped", about
    print(f"run_all: {python}: {about}", flush=True)
    pytest_args = args if _names_tests(args) else [*DJANGO6_TESTS, *args]
    return (_sqlite if db == "sqlite" else _postgres)(python, pytest_args)


def _legs(dbs: list[str], django6: str) -> dict[str, Callable[[list[str]], Outcome]]:
    legs: dict[str, Callable[[list[str]], Outcome]] = {}
    if django6 != "only":
        for db in dbs:
            runner = _sqlite if db == "sqlite" else _postgres
            legs[db] = lambda args, runner=runner: runner(sys.executable, args)
    if django6 != "0":
        for db in dbs:
            legs[f"django6-{db}"] = lambda args, db=db: _django6_leg(db, args)
    return legs


def _run_lanes(dbs: list[str], args: list[str]) -> int:
    """One lane per database, side by side: each is this runner in a child process for that
    database alone (its main leg, then its Django 6 leg). Legs mostly wait (worker processes,
    servers, sleeps), so two lanes on two cores take little more than the longer one. The
    first lane's output streams as it comes; the others' follow when they are done."""
    _banner(f"run_all: lanes {', '.join(dbs)} side by side (PMCP_TEST_LANES=0: one by one)")
    started = time.monotonic()
    lanes: list[tuple[str, subprocess.Popen[bytes], Any]] = []
    try:
        for index, db in enumerate(dbs):
            env = dict(os.environ, PMCP_TEST_DBS=db, PMCP_TEST_LANES="0")
            log = None if index == 0 else tempfile.TemporaryFile()
            command = [sys.executable, "-m", "tests.run_all", *args]
            child = subprocess.Popen(
                command,
                cwd=REPO_ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT if log else None,
            )
            lanes.append((db, child, log))
        codes = {db: child.wait() for db, child, _ in lanes}
    except KeyboardInterrupt:
        for _, child, _ in lanes:
            child.terminate()  # each child stops its cluster on SIGTERM
        for _, child, _ in lanes:
            child.wait()
        _print_buffered(lanes)
        print("run_all: interrupted", file=sys.stderr)
        return 130
    _print_buffered(lanes)
    _banner("run_all: lanes")
    for db, code in codes.items():
        print(f"{db} lane: {'passed' if code == 0 else f'failed (exit {code})'}")
    print(f"all lanes in {_minutes(time.monotonic() - started)}")
    sys.stdout.flush()
    return 0 if all(code == 0 for code in codes.values()) else 1


def _print_buffered(lanes: list[tuple[str, subprocess.Popen[bytes], Any]]) -> None:
    for db, _, log in lanes[1:]:
        _banner(f"run_all: the {db} lane's output")
        sys.stdout.flush()
        log.seek(0)
        sys.stdout.buffer.write(log.read())
        sys.stdout.flush()
        log.close()


def _minutes(seconds: float) -> str:
    return f"{int(seconds // 60)}m{seconds % 60:04.1f}s"


def _on_sigterm(signum: int, frame: object) -> None:
    # Turn SIGTERM into an exception so that the cluster is stopped and deleted.
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    raw = os.environ.get("PMCP_TEST_DBS", "sqlite,postgres")
    dbs = list(dict.fromkeys(db.strip().lower() for db in raw.split(",") if db.strip()))
    unknown = [db for db in dbs if db not in KNOWN_DBS]
    if unknown or not dbs:
        print(
            f"run_all: bad PMCP_TEST_DBS={raw!r}; use a comma list of {', '.join(KNOWN_DBS)}",
            file=sys.stderr,
        )
        return 2
    django6 = os.environ.get("PMCP_TEST_DJANGO6", "1").strip().lower() or "1"
    if django6 not in DJANGO6_CHOICES:
        print(
            f"run_all: bad PMCP_TEST_DJANGO6={django6!r}; use one of {', '.join(DJANGO6_CHOICES)}",
            file=sys.stderr,
        )
        return 2

    signal.signal(signal.SIGTERM, _on_sigterm)
    lanes = os.environ.get("PMCP_TEST_LANES", "1").strip() or "1"
    if lanes not in ("0", "1"):
        print(f"run_all: bad PMCP_TEST_LANES={lanes!r}; use 0 or 1", file=sys.stderr)
        return 2
    if lanes == "1" and len(dbs) > 1:
        return _run_lanes(dbs, args)
    legs = _legs(dbs, django6)
    results: dict[str, tuple[str, str, float]] = {}
    interrupted = False
    try:
        for name, leg in legs.items():
            _banner(f"run_all: leg '{name}'")
            started = time.monotonic()
            status, detail = leg(args)
            results[name] = (status, detail, time.monotonic() - started)
    except KeyboardInterrupt:
        interrupted = True

    _banner("run_all: summary")
    for name in legs:
        status, detail, seconds = results.get(
            name, ("not run", "interrupted" if interrupted else "", 0.0)
        )
        took = f" in {_minutes(seconds)}" if name in results else ""
        print(f"{name}: {status}{took}" + (f" ({detail})" if detail else ""))
    sys.stdout.flush()
    if interrupted:
        print("run_all: interrupted", file=sys.stderr)
        return 130
    failed = any(status == "failed" for status, _, _ in results.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

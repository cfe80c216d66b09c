"""Running ``python -m django pmcp_worker`` (and the other commands) as real OS processes.

The child uses the current test database (``subprocess_env()`` sets ``PMCP_DB_NAME``), so the
tests that start one need ``@pytest.mark.django_db(transaction=True)``: what the test writes
must be committed for the child to see it, and what the child writes is read back through
ordinary queries. A child's stdout and stderr go to files (a pipe nobody reads could fill up
and block it); ``proc.out`` / ``proc.err`` read them at any time.

Every process started here is killed by the ``kill_leftover_processes`` fixture (autouse in
the modules that import it) before the test database is flushed.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from tests.subprocesses import REPO, subprocess_env

DEFAULT_TIMEOUT = 30.0

_started: list[CommandProcess] = []
_scratch: list[Path] = []


class CommandProcess(subprocess.Popen):
    """A ``python -m django COMMAND ...`` child whose output goes to two files."""

    out_path: Path
    err_path: Path
    n_args: int  # the command and its arguments: the end of ``args``

    @property
    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    @property
    def err(self) -> str:
        return self.err_path.read_text(errors="replace")

    def describe(self) -> str:
        return (
            f"{' '.join(self.args[-self.n_args :])} (pid {self.pid}, exit {self.poll()})\n"
            f"--- stdout ---\n{self.out[-4000:]}\n--- stderr ---\n{self.err[-8000:]}"
        )

    def finish(self, timeout: float = DEFAULT_TIMEOUT) -> int:
        """Wait for the process to exit; fail the test (showing its output) if it does not."""
        try:
            return self.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.wait()
            raise AssertionError(
                f"still running after {timeout}s, killed:\n{self.describe()}"
            ) from None


# ``python -c`` entry that sets attributes of tests.settings (JSON in argv[1]) before Django
# reads them, then runs the command in argv[2:].
_WITH_SETTINGS = (
    "import json, sys\n"
    "import tests.settings as settings\n"
    "for name, value in json.loads(sys.argv[1]).items():\n"
    "    setattr(settings, name, value)\n"
    "from django.core.management import execute_from_command_line\n"
    "execute_from_command_line(['django', *sys.argv[2:]])\n"
)


def start_command(
    command: str,
    *args: str,
    env: dict[str, str] | None = None,
    settings: dict[str, Any] | None = None,
) -> CommandProcess:
    """Start ``python -m django COMMAND ARGS`` against the test database (``env`` adds to or
    overrides the child's environment; ``settings`` overrides values of tests/settings.py)."""
    scratch = Path(tempfile.mkdtemp(prefix="pmcp-proc-"))
    _scratch.append(scratch)
    out_path, err_path = scratch / "stdout", scratch / "stderr"
    env = {**subprocess_env(), "PYTHONUNBUFFERED": "1", **(env or {})}
    if settings is None:
        entry = ["-m", "django"]
    else:
        entry = ["-c", _WITH_SETTINGS, json.dumps(settings)]
    with out_path.open("ab") as out, err_path.open("ab") as err:
        process = CommandProcess(
            [sys.executable, *entry, command, *args],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
        )
    process.out_path, process.err_path = out_path, err_path
    process.n_args = 1 + len(args)
    _started.append(process)
    return process


def start_worker(*args: str, **options: Any) -> CommandProcess:
    """Start ``python -m django pmcp_worker ARGS`` (options as for ``start_command``)."""
    return start_command("pmcp_worker", *args, **options)


def run_command(
    command: str, *args: str, timeout: float = DEFAULT_TIMEOUT, **options: Any
) -> tuple[int, str, str]:
    """Run a command to completion: (exit code, stdout, stderr)."""
    process = start_command(command, *args, **options)
    code = process.finish(timeout)
    return code, process.out, process.err


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = DEFAULT_TIMEOUT,
    *,
    interval: float = 0.02,
    alive: Iterable[CommandProcess] = (),
    message: str | Callable[[], str] = "",
) -> Any:
    """Poll ``predicate`` until it returns something truthy (and return that).

    Fails the test after ``timeout`` seconds, or at once if one of the ``alive`` processes
    exits meanwhile (with its output in the message)."""
    watched = list(alive)
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        for process in watched:
            if process.poll() is not None:
                raise AssertionError(
                    f"process exited while waiting ({_text(message)}):\n{process.describe()}"
                )
        if time.monotonic() >= deadline:
            details = "".join(f"\n{process.describe()}" for process in watched)
            raise AssertionError(f"timed out after {timeout}s: {_text(message)}{details}")
        time.sleep(interval)


def _text(message: str | Callable[[], str]) -> str:
    return message() if callable(message) else message


def marker_lines(path: Path, what: str | None = None) -> list[str]:
    """Lines a test handler appended to its marker file (those starting with ``what``)."""
    if not path.exists():
        return []
    lines = path.read_text().splitlines()
    return [line for line in lines if what is None or line.startswith(f"{what} ")]


def event_counts(run_id: Any, event_type: str) -> Counter:
    """How many events of one type each task of the run has."""
    from parallel_mcp.models import Event

    return Counter(
        Event.objects.filter(run_id=run_id, event_type=event_type).values_list("task_id", flat=True)
    )


def stop_all() -> None:
    """Kill what is still running (SIGKILL: nothing may outlive its test) and clean up."""
    while _started:
        process = _started.pop()
        if process.poll() is None:
            process.send_signal(signal.SIGKILL)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:  # pragma: no cover - a zombie we cannot reap
            pass
    while _scratch:
        shutil.rmtree(_scratch.pop(), ignore_errors=True)


@pytest.fixture(autouse=True)
def kill_leftover_processes():
    """Autouse where imported: processes die before the test database is flushed."""
    yield
    stop_all()

#!/usr/bin/env python
"""The parallel_mcp demo (``make demo``).

From a fresh SQLite database it migrates, creates the superuser ``admin``, seeds the demo run
(example_project/demo/seed.py), starts two ``pmcp_worker --concurrency 3`` processes and one
``pmcp_expire_leases`` loop (their logs go to example_project/logs/), shows the run's progress
live, answers the task that waits for input, waits for the run to finish, stops the processes
(SIGTERM, then SIGKILL if they hang) and prints a summary.

Exit status: 0 when the run completed; 1 when it did not (failed, timed out, a process died);
130 when interrupted.

Environment: ``PMCP_SQLITE_PATH`` (the SQLite file; default example_project/db.sqlite3, deleted
and recreated on every run) or ``DATABASE_URL`` (PostgreSQL: nothing is deleted, a new run is
added). Without a terminal (or with ``CI`` set) progress is printed as plain lines.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter, deque
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
MANAGE = HERE / "manage.py"
SETTINGS = "example_project.settings"

WORKERS = 2
CONCURRENCY = 3
LEASE_MS = 6_000  # heartbeats every 2 s: short, so the expiry loop has something to watch
REFRESH_SECONDS = 0.5
ANSI_CODE = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
NOTABLE_EVENTS = [
    "context.snapshot.created",
    "run.status.changed",
    "task.dead_lettered",
    "task.failed",
    "task.lease_expired",
    "task.resumed",
    "task.retry_scheduled",
    "task.waiting_input",
]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="Give up after this many seconds (120)."
    )
    parser.add_argument("--fetches", type=int, default=8, help="demo.fetch tasks (8).")
    parser.add_argument(
        "--approve-after",
        type=float,
        default=3.0,
        help="Seconds demo.approve waits for input before the demo answers it (3).",
    )
    parser.add_argument(
        "--log-dir", type=Path, default=HERE / "logs", help="Process logs (example_project/logs)."
    )
    args = parser.parse_args(argv)
    if args.fetches < 1 or args.timeout <= 0 or args.approve_after < 0:
        parser.error("--fetches and --timeout must be positive, --approve-after >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    for path in (str(REPO), str(HERE)):  # this checkout's parallel_mcp, then the demo app
        if path not in sys.path:
            sys.path.insert(0, path)
    os.environ["DJANGO_SETTINGS_MODULE"] = SETTINGS
    signal.signal(signal.SIGTERM, _interrupt)

    from django.conf import settings

    database = settings.DATABASES["default"]
    sqlite = database["ENGINE"].endswith("sqlite3")
    if sqlite:
        _delete_sqlite(Path(database["NAME"]))

    import django

    django.setup()
    from django.core.management import call_command

    say = Output()
    say.line(f"database: {database['NAME'] if sqlite else 'PostgreSQL ' + database['NAME']}")
    call_command("migrate", interactive=False, verbosity=0)
    password = _create_superuser()

    from demo.seed import seed_demo_run

    from parallel_mcp import Orchestrator

    orchestrator = Orchestrator()
    run = seed_demo_run(orchestrator, fetches=args.fetches)
    say.line(f"seeded run {run.id}: {run.tasks_total} tasks")

    processes = Processes(args.log_dir)
    started = time.monotonic()
    outcome = "interrupted"
    try:
        for number in range(1, WORKERS + 1):
            processes.start(
                f"worker-{number}",
                "pmcp_worker",
                f"--concurrency={CONCURRENCY}",
                f"--worker-id=demo-worker-{number}",
                f"--lease-ms={LEASE_MS}",
                "--drain-timeout-ms=5000",
            )
        processes.start("expire-leases", "pmcp_expire_leases", "--interval-ms=1000")
        say.line(
            f"started {WORKERS} workers (--concurrency {CONCURRENCY}) and the lease-expiry "
            f"loop; logs in {_shown(args.log_dir)}/"
        )
        outcome = watch(orchestrator, run.id, processes, args, say, started)
    except KeyboardInterrupt:
        say.end_live()
        say.line("interrupted")
    finally:
        say.end_live()
        codes = processes.stop()
    run = orchestrator.get_run(run_id=run.id)
    summary(orchestrator, run, codes, time.monotonic() - started, say)
    look_around(run, password, sqlite, database, args.log_dir, say)
    if outcome == "interrupted":
        return 130
    if outcome != "terminal" or run.status != "completed":
        say.line(f"demo FAILED: {outcome if outcome != 'terminal' else 'run ' + run.status}")
        return 1
    if any(code != 0 for code in codes.values()):
        say.line("demo FAILED: a process did not exit cleanly (see its log)")
        return 1
    return 0


def _interrupt(signum, frame):  # SIGTERM behaves like Ctrl-C: stop the processes, then exit
    raise KeyboardInterrupt


def _delete_sqlite(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)


def _create_superuser() -> str | None:
    """Create ``admin`` with a fresh password (returned); None when it already exists."""
    from django.contrib.auth import get_user_model

    users = get_user_model().objects
    if users.filter(username="admin").exists():
        return None
    password = secrets.token_urlsafe(12)
    users.create_superuser("admin", "admin@example.com", password)
    return password


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


# -- the processes ------------------------------------------------------------------------------
class Processes:
    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.running: dict[str, subprocess.Popen] = {}
        self.env = {**os.environ, "DJANGO_SETTINGS_MODULE": SETTINGS, "PYTHONUNBUFFERED": "1"}

    def start(self, name: str, *command: str) -> None:
        with (self.log_dir / f"{name}.log").open("w") as log:
            self.running[name] = subprocess.Popen(
                [sys.executable, str(MANAGE), *command],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=self.env,
                cwd=REPO,
                start_new_session=True,  # Ctrl-C in the terminal reaches the demo only
            )

    def dead(self) -> list[str]:
        return [name for name, process in self.running.items() if process.poll() is not None]

    def stop(self, grace: float = 15.0) -> dict[str, int]:
        """SIGTERM all (workers drain), wait up to ``grace`` seconds, then SIGKILL."""
        for process in self.running.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        codes = {}
        for name, process in self.running.items():
            try:
                codes[name] = process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                codes[name] = process.wait()
        return codes

    def log_tail(self, name: str, lines: int = 15) -> list[str]:
        path = self.log_dir / f"{name}.log"
        return path.read_text(errors="replace").splitlines()[-lines:] if path.exists() else []


# -- the terminal -------------------------------------------------------------------------------
class Output:
    """Live mode (a terminal): a block redrawn in place. Otherwise: plain lines."""

    def __init__(self) -> None:
        self.live = (
            sys.stdout.isatty() and os.environ.get("TERM") != "dumb" and not os.environ.get("CI")
        )
        self.drawn = 0
        self.last_plain: str | None = None

    def line(self, text: str = "") -> None:
        print(text, flush=True)

    def draw(self, lines: list[str]) -> None:
        size = shutil.get_terminal_size((100, 40))
        lines = [_clip_visible(line, size.columns - 1) for line in lines][: max(1, size.lines - 2)]
        up = f"\x1b[{self.drawn}F\x1b[J" if self.drawn else "\x1b[?25l"  # up; or hide cursor
        sys.stdout.write(up + "\n".join(lines) + "\n")
        sys.stdout.flush()
        self.drawn = len(lines)

    def plain(self, text: str) -> None:
        """Print ``text`` unless it is what was printed last (non-terminal mode)."""
        if text != self.last_plain:
            self.line(text)
            self.last_plain = text

    def end_live(self) -> None:
        if self.live and self.drawn:
            sys.stdout.write("\x1b[?25h")  # show the cursor again
            sys.stdout.flush()
            self.drawn = 0


def _clip_visible(line: str, width: int) -> str:
    """``line`` cut to ``width`` visible characters; colour codes do not count."""
    out, visible, position = [], 0, 0
    for match in ANSI_CODE.finditer(line + "\x1b[m"):
        text = line[position : match.start()]
        if visible + len(text) > width:
            out.append(text[: width - visible])
            return "".join(out) + "\x1b[0m"
        out.append(text + line[match.start() : match.end()])
        visible += len(text)
        position = match.end()
    return line


def watch(orchestrator, run_id, processes: Processes, args, say: Output, started: float) -> str:
    """Refresh about twice a second until the run is terminal; answer demo.approve."""
    from django.utils import timezone

    from parallel_mcp.exceptions import ParallelMcpError
    from parallel_mcp.management import tables

    cursor = None
    news: deque[str] = deque(maxlen=6)
    waiting_since = None
    while True:
        run = orchestrator.get_run(run_id=run_id)
        tasks = orchestrator.list_run_tasks(run_id=run_id)
        keys = {task.id: task.key for task in tasks}
        page = orchestrator.list_events_since(
            after_id=cursor, run_id=run_id, event_types=NOTABLE_EVENTS, limit=100
        )
        cursor = page.next_cursor
        for event in page.events:
            news.append(_describe(event, keys))
            if not say.live:
                say.line(f"  event: {news[-1]}")

        approve = next((task for task in tasks if task.kind == "demo.approve"), None)
        if approve is not None and approve.status == "waiting_input":
            waiting_since = waiting_since or time.monotonic()
            if time.monotonic() - waiting_since >= args.approve_after:
                answer = {**(approve.input or {}), "answer": "yes"}
                try:
                    orchestrator.resume_task(task_id=approve.id, input=answer)
                    news.append('demo: answered demo.approve: "yes" (resume_task(input=...))')
                except ParallelMcpError as exc:
                    news.append(f"demo: could not resume demo.approve: {exc}")
                if not say.live:
                    say.line(f"  {news[-1]}")
                waiting_since = None

        elapsed = time.monotonic() - started
        if say.live:
            colour = shutil.get_terminal_size((100, 40)).columns > tables.WIDTH
            say.draw(
                [
                    f"parallel_mcp demo  {elapsed:5.1f}s   (Ctrl-C stops it)",
                    *tables.run_header(run, now=timezone.now(), colour=colour)[1:3],
                    "",
                    *tables.tasks_table(tasks, notes=False, colour=colour),
                    "",
                    "recent events:",
                    *(f"  {item}" for item in news),
                ]
            )
        else:
            say.plain(
                f"run {run.status}  {tables.progress_bar(run.progress)}  "
                f"tasks {tables.run_counts(run)}"
            )

        if run.status in ("completed", "failed", "cancelled"):
            return "terminal"
        dead = processes.dead()
        if dead:
            say.end_live()
            for name in dead:
                say.line(f"{name} exited early; the end of its log:")
                for text in processes.log_tail(name):
                    say.line(f"  {text}")
            return f"{', '.join(dead)} exited early"
        if elapsed > args.timeout:
            say.end_live()
            return f"timed out after {args.timeout:g}s with the run {run.status}"
        time.sleep(REFRESH_SECONDS)


def _describe(event, keys: dict) -> str:
    payload = event.payload or {}
    what = keys.get(event.task_id) or ("run" if event.task_id is None else str(event.task_id))
    detail = {
        "run.status.changed": lambda: f"{payload.get('from')} -> {payload.get('to')}",
        "context.snapshot.created": lambda: f"label {payload.get('label')}",
        "task.retry_scheduled": lambda: (
            f"attempt {payload.get('attempt')}/{payload.get('max_attempts')} failed "
            f"({payload.get('error')}); retry in {payload.get('delay_ms')} ms"
        ),
        "task.waiting_input": lambda: str(payload.get("reason")),
        "task.resumed": lambda: "with a new input" if payload.get("input_replaced") else "",
        "task.failed": lambda: str(payload.get("error")),
        "task.lease_expired": lambda: f"worker {payload.get('worker_id')}",
    }.get(event.event_type, lambda: "")()
    return f"{event.event_type:<24} {what}" + (f": {detail}" if detail else "")


# -- the end ------------------------------------------------------------------------------------
def summary(orchestrator, run, codes: dict[str, int], elapsed: float, say: Output) -> None:
    from parallel_mcp.management import tables

    tasks = orchestrator.list_run_tasks(run_id=run.id)
    events = orchestrator.list_run_events(run_id=run.id)
    snapshot = orchestrator.get_current_context_snapshot(run_id=run.id)
    say.line()
    say.line(f"== run {run.id}: {run.status} after {elapsed:.1f}s ==")
    for text in tables.tasks_table(tasks, notes=True):
        say.line(text)
    statuses = Counter(task.status for task in tasks)
    say.line()
    say.line(
        "tasks: " + ", ".join(f"{count} {status}" for status, count in sorted(statuses.items()))
    )
    again = [f"{task.key} {task.attempt_count}" for task in tasks if task.attempt_count > 1]
    if again:
        say.line("claimed more than once (retried or resumed): " + ", ".join(again))
    types = Counter(event.event_type for event in events).most_common()
    shown = ", ".join(f"{name} {count}" for name, count in types[:6])
    text = f"events: {len(events)} ({shown}{', ...' if len(types) > 6 else ''})"
    for part in textwrap.wrap(text, 100, subsequent_indent="  "):
        say.line(part)
    say.line("processes: " + ", ".join(f"{name} exit {code}" for name, code in codes.items()))
    if snapshot is not None:
        say.line(f"final context (snapshot {snapshot.label}):")
        payload = snapshot.payload
        items = payload.items() if isinstance(payload, dict) else [("payload", payload)]
        for key, value in items:
            text = f"{key}: {json.dumps(value, sort_keys=True)}"
            for part in textwrap.wrap(text, 98, initial_indent="  ", subsequent_indent="    "):
                say.line(part)


def look_around(run, password, sqlite: bool, database, log_dir: Path, say: Output) -> None:
    env = ""
    if sqlite and os.environ.get("PMCP_SQLITE_PATH"):
        env = f"PMCP_SQLITE_PATH={database['NAME']} "
    say.line()
    say.line("look around" + ("" if sqlite else " (with the same DATABASE_URL)") + ":")
    say.line(f"  {env}make serve     then open http://127.0.0.1:8000/admin/")
    if password:
        say.line(f"                 user admin, password {password}")
    else:
        say.line("                 user admin (it existed already: password unchanged)")
    say.line(f"  {env}.venv/bin/python example_project/manage.py pmcp_status {run.id}")
    say.line(f"  process logs: {_shown(log_dir)}/")


if __name__ == "__main__":
    sys.exit(main())

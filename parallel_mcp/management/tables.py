"""Plain-text tables of runs and tasks for the command line (``pmcp_status``, the demo).

Everything here is pure formatting: callers pass model instances and ``now``. Lines fit in
100 columns; colour (ANSI) only when the caller asks for it, applied after padding so that it
never changes the layout.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

WIDTH = 100
SHORT_ID_LENGTH = 12
BAR_WIDTH = 10
MAX_BLOCKERS = 5  # per task; a fan-in task can wait for thousands of dependencies

_ANSI = {
    "green": "32",
    "red": "31",
    "yellow": "33",
    "cyan": "36",
    "magenta": "35",
    "dim": "2",
}
STATUS_COLOURS = {
    # runs
    "pending": "dim",
    "active": "cyan",
    "waiting": "magenta",
    # tasks
    "queued": "dim",
    "leased": "cyan",
    "running": "cyan",
    "blocked": "magenta",
    "waiting_input": "magenta",
    # both
    "completed": "green",
    "failed": "red",
    "cancelled": "yellow",
}


def paint(text: str, status: str, *, colour: bool) -> str:
    code = _ANSI.get(STATUS_COLOURS.get(status, ""), "")
    if not colour or not code:
        return text
    return f"\x1b[{code}m{text}\x1b[0m"


def short_id(value: Any) -> str:
    """The last 12 hex digits of a UUID (its random part, also for time-ordered UUIDv7 ids,
    whose leading digits are a timestamp shared by everything created in the same minute)."""
    return str(value).replace("-", "")[-SHORT_ID_LENGTH:]


def clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(0, width - 1)] + "~"


def progress_bar(fraction: float, width: int = BAR_WIDTH) -> str:
    """``[####------]  40%``: ASCII, a fixed width of ``width + 7`` characters."""
    fraction = min(max(float(fraction or 0.0), 0.0), 1.0)
    filled = int(fraction * width + 1e-9)
    return f"[{'#' * filled}{'-' * (width - filled)}] {int(fraction * 100 + 1e-9):3d}%"


def age(then: datetime | None, now: datetime) -> str:
    """How long ago: ``12s ago``, ``5m ago``, ``3h ago``, ``4d ago``."""
    if then is None:
        return "-"
    seconds = max(0, int((now - then).total_seconds()))
    for size, unit in ((86_400, "d"), (3_600, "h"), (60, "m")):
        if seconds >= size:
            return f"{seconds // size}{unit} ago"
    return f"{seconds}s ago"


@dataclass(frozen=True)
class Column:
    header: str
    right: bool = False  # right-aligned (numbers)
    max_width: int | None = None
    status: bool = False  # coloured by its value


def render(
    columns: Sequence[Column], rows: Iterable[Sequence[str]], *, colour: bool = False
) -> list[str]:
    """A header line and one line per row; cells are clipped to their column's max width."""
    cells = [
        [
            clip(str(value), column.max_width or WIDTH)
            for column, value in zip(columns, row, strict=True)
        ]
        for row in rows
    ]
    widths = [
        max([len(column.header), *(len(row[index]) for row in cells)])
        for index, column in enumerate(columns)
    ]

    def line(values: Sequence[str], *, header: bool = False) -> str:
        parts = []
        for column, width, value in zip(columns, widths, values, strict=True):
            padded = value.rjust(width) if column.right else value.ljust(width)
            if column.status and not header:
                padded = paint(padded, value, colour=colour)
            parts.append(padded)
        return " ".join(parts).rstrip()

    return [line([column.header for column in columns], header=True)] + [line(r) for r in cells]


# -- runs ---------------------------------------------------------------------------------------
RUN_COLUMNS = (
    Column("RUN"),
    Column("NAMESPACE", max_width=12),
    Column("STATUS", status=True),
    Column("TASKS", right=True),
    Column("ACT", right=True),
    Column("WAIT", right=True),
    Column("STUCK", right=True),
    Column("DONE", right=True),
    Column("FAIL", right=True),
    Column("CANC", right=True),
    Column("PROGRESS"),
    Column("UPDATED", right=True),
)

RUN_LEGEND = (
    "TASKS total; ACT queued, leased or running; WAIT blocked or waiting_input; "
    "STUCK behind a failed dependency; DONE completed; FAIL failed; CANC cancelled"
)


def run_row(run: Any, now: datetime) -> list[str]:
    return [
        short_id(run.id),
        run.namespace,
        run.status,
        str(run.tasks_total),
        str(run.tasks_active),
        str(run.tasks_waiting),
        str(run.tasks_stuck),
        str(run.tasks_completed),
        str(run.tasks_failed),
        str(run.tasks_cancelled),
        progress_bar(run.progress),
        age(run.updated_at, now),
    ]


def runs_table(runs: Iterable[Any], *, now: datetime, colour: bool = False) -> list[str]:
    return render(RUN_COLUMNS, [run_row(run, now) for run in runs], colour=colour)


def run_counts(run: Any) -> str:
    return (
        f"{run.tasks_total} total: {run.tasks_active} active, {run.tasks_waiting} waiting, "
        f"{run.tasks_stuck} stuck, {run.tasks_completed} completed, {run.tasks_failed} failed, "
        f"{run.tasks_cancelled} cancelled"
    )


def run_header(run: Any, *, now: datetime, colour: bool = False) -> list[str]:
    """A few lines about one run: id, namespace, status and progress, counts, times."""
    finished = run.tasks_completed + run.tasks_failed + run.tasks_cancelled
    lines = [
        f"Run {run.id}  namespace {clip(run.namespace, 30)}"
        + (f"  external id {clip(run.external_id, 20)}" if run.external_id else ""),
        f"  status  {paint(run.status, run.status, colour=colour)}  "
        f"{progress_bar(run.progress)}  {finished} of {run.tasks_total} task(s) finished",
        f"  tasks   {run_counts(run)}",
        f"  times   created {age(run.created_at, now)}, updated {age(run.updated_at, now)}",
    ]
    if run.status == "cancelled" and getattr(run, "cancel_reason", None):
        lines.append(f"  reason  {clip(run.cancel_reason.splitlines()[0], WIDTH - 10)}")
    return lines


def labelled(label: str, texts: Iterable[str]) -> list[str]:
    """Header lines such as ``  workers No running worker handles kind 'x': …``, wrapped."""
    lines: list[str] = []
    for text in texts:
        lines += textwrap.wrap(
            text, width=WIDTH, initial_indent=f"  {label:<8}", subsequent_indent=" " * 10
        )
    return lines


# -- workers -------------------------------------------------------------------------------------
WORKER_COLUMNS = (
    Column("WORKER", max_width=24),
    Column("HOST", max_width=16),
    Column("PID", right=True),
    Column("SLOTS", right=True),
    Column("VIA"),
    Column("KINDS", max_width=30),
    Column("STARTED", right=True),
    Column("SEEN", right=True),
)


def workers_table(processes: Iterable[Any], *, now: datetime) -> list[str]:
    """Running worker processes, one line each (``pmcp_status --workers``)."""
    rows = [
        [
            process.worker_id,
            process.hostname,
            "-" if process.pid is None else str(process.pid),
            str(process.concurrency),
            "api" if process.remote else "db",
            ",".join(kind.kind for kind in process.kinds.all()),
            age(process.started_at, now),
            age(process.last_seen_at, now),
        ]
        for process in processes
    ]
    return render(WORKER_COLUMNS, rows)


# -- tasks --------------------------------------------------------------------------------------
TASK_COLUMNS = (
    Column("TASK", max_width=20),
    Column("KIND", max_width=16),
    Column("STATUS", status=True),
    Column("TRIES", right=True),
    Column("LEASE HOLDER", max_width=16),
    Column("PROGRESS"),
)


def attempts(task: Any) -> str:
    return f"{task.attempt_count}/{task.max_attempts if task.max_attempts else '-'}"


def task_row(task: Any) -> list[str]:
    return [
        task.key or short_id(task.id),
        task.kind,
        task.status,
        attempts(task),
        task.leased_by or "-",
        progress_bar(task.progress),
    ]


def task_notes(task: Any, blockers: Sequence[Any] = ()) -> list[str]:
    """Indented lines under a task: why it waits (``explain_task``), its progress message
    while it is not finished, and its error when it failed."""
    notes = [f"waits: {blocker.message}" for blocker in blockers[:MAX_BLOCKERS]]
    if len(blockers) > MAX_BLOCKERS:
        notes.append(f"waits: ... and {len(blockers) - MAX_BLOCKERS} more (see explain_task)")
    if task.status not in ("completed", "failed", "cancelled") and task.progress_message:
        notes.append(f"progress: {task.progress_message}")
    if task.error:
        notes.append(f"error: {task.error.strip().splitlines()[0] if task.error.strip() else ''}")
    lines = []
    for note in notes:
        wrapped = textwrap.wrap(
            note, width=WIDTH, initial_indent="    ", subsequent_indent="      "
        )
        lines.extend(wrapped[:3])
    return lines


def tasks_table(
    tasks: Iterable[Any],
    *,
    blockers: Mapping[Any, Sequence[Any]] | None = None,
    notes: bool = True,
    colour: bool = False,
) -> list[str]:
    """One line per task; with ``notes``, each followed by its blockers, progress message and
    error (see :func:`task_notes`)."""
    tasks = list(tasks)
    lines = render(TASK_COLUMNS, [task_row(task) for task in tasks], colour=colour)
    if not notes:
        return lines
    out = lines[:1]
    for task, line in zip(tasks, lines[1:], strict=True):
        out.append(line)
        out.extend(task_notes(task, (blockers or {}).get(task.id, ())))
    return out

"""Runs and their progress as a table: ``manage.py pmcp_status [RUN_ID]``."""

from __future__ import annotations

import re
import textwrap

from django.core.management.base import CommandError
from django.core.management.color import supports_color
from django.utils import timezone

from ...exceptions import ValidationError
from ...ids import parse_id
from ...models import Run, Task
from ...orchestrator import Orchestrator
from ...selectors import LEASE_LAPSED, list_lapsed_leases, list_live_workers
from ...states import TERMINAL_TASK_STATUSES, RunStatus
from .. import tables
from ..arguments import configure_logging, duration, name_list, positive_int
from ..database import DatabaseCommand, require_migrated

DEFAULT_RUN_LIMIT = 20
DEFAULT_TASK_LIMIT = 100
# Lapsed leases --stuck lists at most.
LAPSED_SHOWN = 100
_SHORT_ID = re.compile(r"^[0-9a-f]{8,32}$")
RUN_STATUSES = [status.value for status in RunStatus]


class Command(DatabaseCommand):
    help = (
        "Without RUN_ID: the most recently updated runs with their task counts and progress. "
        "With RUN_ID (a full id, or the short id the list shows): that run and its tasks, "
        "each with what it is waiting for."
    )

    def add_arguments(self, parser):
        parser.add_argument("run_id", nargs="?", metavar="RUN_ID", help="Show one run's tasks.")
        parser.add_argument(
            "--limit",
            metavar="N",
            help=f"Runs to list (default {DEFAULT_RUN_LIMIT}); with RUN_ID, tasks to show "
            f"(default {DEFAULT_TASK_LIMIT}).",
        )
        parser.add_argument(
            "--stuck",
            action="store_true",
            help="List leased/running tasks that still heartbeat but have run longer than "
            "their timeout_ms or --longer-than (a worker wedged inside a handler), and those "
            "whose lease lapsed with nothing expiring it yet (a dead worker, no expiry).",
        )
        parser.add_argument(
            "--longer-than",
            metavar="DURATION",
            help="With --stuck: also list tasks running longer than this (e.g. 10m, 2h).",
        )
        parser.add_argument(
            "--workers",
            action="store_true",
            help="List the running worker processes (pmcp_worker, local or --api) and the "
            "task kinds each handles.",
        )
        parser.add_argument("--namespace", metavar="NS", help="Only runs of this namespace.")
        parser.add_argument(
            "--status",
            metavar="S1,S2",
            help=f"Only runs in these statuses ({', '.join(RUN_STATUSES)}).",
        )

    def handle(self, *args, **options):
        configure_logging(options["verbosity"])
        colour = options["force_color"] or (
            not options["no_color"] and self.stdout.isatty() and supports_color()
        )
        orchestrator = Orchestrator()
        require_migrated(orchestrator.using)
        if options["workers"]:
            if options["run_id"] is not None or options["stuck"]:
                raise CommandError("--workers lists worker processes; drop RUN_ID and --stuck")
            self.stdout.write("\n".join(self._workers(orchestrator)))
            return
        if options["stuck"]:
            if options["run_id"] is not None:
                raise CommandError("--stuck lists tasks of every run; drop RUN_ID")
            self.stdout.write("\n".join(self._stuck(orchestrator, options, colour)))
            return
        if options["longer_than"] is not None:
            raise CommandError("--longer-than goes with --stuck")
        if options["run_id"] is not None:
            if options["namespace"] is not None or options["status"] is not None:
                raise CommandError("--namespace and --status filter the run list, not one run")
            limit = _limit(options["limit"], DEFAULT_TASK_LIMIT)
            lines = self._one_run(orchestrator, options["run_id"], limit, colour)
        else:
            limit = _limit(options["limit"], DEFAULT_RUN_LIMIT)
            lines = self._runs(orchestrator, options, limit, colour)
        self.stdout.write("\n".join(lines))

    def _runs(self, orchestrator, options, limit, colour) -> list[str]:
        statuses = name_list(options["status"], "--status")
        for status in statuses or ():
            if status not in RUN_STATUSES:
                raise CommandError(
                    f"--status has {status!r}; run statuses are {', '.join(RUN_STATUSES)}"
                )
        namespace = options["namespace"]
        if namespace is not None and not namespace.strip():
            raise CommandError("--namespace must not be empty")
        try:
            runs = orchestrator.list_runs(namespace=namespace, statuses=statuses, limit=limit)
        except ValidationError as exc:
            raise CommandError(str(exc)) from None
        if not runs:
            return ["no runs" + (" match" if namespace or statuses else "")]
        lines = tables.runs_table(runs, now=timezone.now(), colour=colour)
        if options["verbosity"] >= 1:
            lines += ["", *textwrap.wrap(tables.RUN_LEGEND, tables.WIDTH)]
            lines.append("pmcp_status RUN_ID (or the short id above) shows a run's tasks.")
            lines.append(_workers_summary(orchestrator))
        return lines

    def _workers(self, orchestrator) -> list[str]:
        processes = list_live_workers(using=orchestrator.using)
        if not processes:
            return ["no running workers"]
        return tables.workers_table(processes, now=timezone.now())

    def _stuck(self, orchestrator, options, colour) -> list[str]:
        threshold = None
        if options["longer_than"] is not None:
            threshold = int(
                duration(options["longer_than"], "--longer-than").total_seconds() * 1000
            )
        now = timezone.now()
        tasks = orchestrator.list_stuck_tasks(running_longer_than_ms=threshold, now=now)
        lapsed = list_lapsed_leases(using=orchestrator.using, now=now, limit=LAPSED_SHOWN)
        if not tasks and not lapsed:
            return ["no stuck tasks"]
        out = []
        if tasks:
            lines = tables.tasks_table(tasks, notes=False, colour=colour)
            out.append(lines[0])
            for task, line in zip(tasks, lines[1:], strict=True):
                out.append(line)
                limit = f", timeout_ms {task.timeout_ms}" if task.timeout_ms else ""
                out.append(f"    running for {task.running_for_ms} ms{limit}")
                out.append(
                    f"    run {task.run_id}, lease until {task.lease_expires_at.isoformat()}"
                )
        if lapsed:
            if out:
                out.append("")
            out += textwrap.wrap(
                f"Lapsed leases not expired yet ({len(lapsed)}"
                + ("+" if len(lapsed) == LAPSED_SHOWN else "")
                + "): "
                + LEASE_LAPSED,
                tables.WIDTH,
            )
            lines = tables.tasks_table(lapsed, notes=False, colour=colour)
            out.append(lines[0])
            for task, line in zip(lapsed, lines[1:], strict=True):
                assert task.lease_expires_at is not None  # set while leased
                out.append(line)
                out.append(
                    f"    run {task.run_id}, worker {task.leased_by!r}, lease lapsed at "
                    f"{task.lease_expires_at.isoformat()}"
                )
        return out

    def _one_run(self, orchestrator, value, limit, colour) -> list[str]:
        run = _find_run(orchestrator, value)
        now = timezone.now()
        tasks = list(
            Task.objects.using(orchestrator.using)
            .filter(run_id=run.pk)
            .order_by("created_at", "id")[:limit]  # list_run_tasks' order, bounded
        )
        blockers = {
            task.id: orchestrator.explain_task(task_id=task.id, now=now)
            for task in tasks
            if task.status not in TERMINAL_TASK_STATUSES
        }
        # "No running worker handles kind X" once for the run, not under each of its tasks.
        unserved = sorted(
            {b.message for found in blockers.values() for b in found if b.kind == "no_worker"}
        )
        blockers = {
            task_id: [b for b in found if b.kind != "no_worker"]
            for task_id, found in blockers.items()
        }
        lines = [
            *tables.run_header(run, now=now, colour=colour),
            *tables.labelled("workers", unserved),
            "",
        ]
        if not tasks:
            return [*lines, "no tasks"]
        lines += tables.tasks_table(tasks, blockers=blockers, colour=colour)
        if run.tasks_total > len(tasks):
            lines.append(f"... and {run.tasks_total - len(tasks)} more task(s) (see --limit)")
        return lines


def _workers_summary(orchestrator: Orchestrator) -> str:
    count = len(list_live_workers(using=orchestrator.using))
    if not count:
        return (
            "No worker is running: queued tasks wait until a pmcp_worker starts "
            "(pmcp_status --workers)."
        )
    return f"{count} worker process(es) running: pmcp_status --workers lists them."


def _limit(value, default: int) -> int:
    from ...conf import app_settings

    if value is None:
        return default
    number = positive_int(value, "--limit")
    if number > app_settings.MAX_LIST_LIMIT:
        raise CommandError(f"--limit must be <= {app_settings.MAX_LIST_LIMIT}, got {number}")
    return number


def _find_run(orchestrator: Orchestrator, value: str) -> Run:
    """A run by its full id, or by the short id (the id's last hex digits) the list shows."""
    text = value.strip().lower()
    parsed = parse_id(text)
    if parsed is not None:
        run = orchestrator.get_run(run_id=parsed)
        if run is None:
            raise CommandError(f"no run with id {parsed}")
        return run
    if not _SHORT_ID.match(text):
        raise CommandError(
            f"RUN_ID must be a run id or the short id pmcp_status lists, got {value!r}"
        )
    matches = list(
        Run.objects.using(orchestrator.using).filter(id__endswith=text).order_by("id")[:2]
    )
    if not matches:
        raise CommandError(f"no run whose id ends in {text}")
    if len(matches) > 1:
        raise CommandError(f"more than one run's id ends in {text}; give the full id")
    return matches[0]

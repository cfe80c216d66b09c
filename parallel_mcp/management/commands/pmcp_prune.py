"""Delete old finished runs: ``manage.py pmcp_prune --older-than 7d``."""

from __future__ import annotations

import logging

from django.core.management.base import CommandError
from django.utils import timezone

from ...conf import app_settings
from ...exceptions import ValidationError
from ...models import Run
from ...orchestrator import Orchestrator
from ...states import TERMINAL_RUN_STATUSES, RunStatus
from ..arguments import configure_logging, duration, name_list, positive_int
from ..database import DatabaseCommand, require_migrated

logger = logging.getLogger("parallel_mcp.prune")

TERMINAL = [status.value for status in RunStatus if status in TERMINAL_RUN_STATUSES]


class Command(DatabaseCommand):
    help = (
        "Delete terminal runs (completed, failed, cancelled) last updated longer ago than "
        "--older-than, with their tasks, attempts, leases, snapshots and events. Deletes in "
        "batches of --limit runs, one transaction each, until none are left."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--older-than",
            required=True,
            metavar="AGE",
            help="Runs last updated longer ago than this: a number and a unit "
            "(ms, s, m, h, d, w), e.g. 7d.",
        )
        parser.add_argument(
            "--status",
            metavar="S1,S2",
            help=f"Only runs in these terminal statuses (default {','.join(TERMINAL)}).",
        )
        parser.add_argument(
            "--dry-run",
            action="store_true",
            help="List the runs that would be deleted; delete nothing.",
        )
        parser.add_argument(
            "--limit",
            metavar="N",
            help="Runs deleted per transaction (default "
            "PARALLEL_MCP['DEFAULT_PRUNE_LIMIT']); batches repeat until none are left.",
        )

    def handle(self, *args, **options):
        configure_logging(options["verbosity"])
        cutoff = timezone.now() - duration(options["older_than"], "--older-than")
        statuses = _terminal_statuses(options["status"])
        limit = _batch_size(options["limit"])
        orchestrator = Orchestrator()
        require_migrated(orchestrator.using)
        if options["dry_run"]:
            run_ids = list(
                Run.objects.using(orchestrator.using)
                .filter(status__in=statuses, updated_at__lt=cutoff)
                .order_by("updated_at", "id")  # the order prune_runs deletes in
                .values_list("id", flat=True)
            )
            self._report("would prune", run_ids, options["verbosity"])
            return
        run_ids = []
        while True:
            try:
                result = orchestrator.prune_runs(older_than=cutoff, statuses=statuses, limit=limit)
            except ValidationError as exc:
                raise CommandError(str(exc)) from None
            run_ids += result.pruned_run_ids
            if result.count:
                logger.info("pruned a batch of %d run(s)", result.count)
            if result.count < limit:
                break
        self._report("pruned", run_ids, options["verbosity"])

    def _report(self, verb: str, run_ids: list, verbosity: int) -> None:
        self.stdout.write(f"{verb} {len(run_ids)} run(s)")
        if verbosity >= 1:
            for run_id in run_ids:
                self.stdout.write(f"  {run_id}")


def _terminal_statuses(value: str | None) -> list[str]:
    statuses = name_list(value, "--status")
    if statuses is None:
        return TERMINAL
    for status in statuses:
        if status not in TERMINAL:
            raise CommandError(
                f"--status {status!r} is not a terminal run status; pmcp_prune deletes only "
                f"{', '.join(TERMINAL)} runs"
            )
    return list(dict.fromkeys(statuses))


def _batch_size(value: str | None) -> int:
    if value is None:
        return app_settings.DEFAULT_PRUNE_LIMIT
    limit = positive_int(value, "--limit")
    if limit > app_settings.MAX_LIST_LIMIT:
        raise CommandError(f"--limit must be <= {app_settings.MAX_LIST_LIMIT}, got {limit}")
    return limit

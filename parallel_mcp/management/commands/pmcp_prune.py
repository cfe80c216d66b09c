"""Delete old finished runs: ``manage.py pmcp_prune --older-than 7d``, and the runs of MCP
tool calls whose task has expired: ``manage.py pmcp_prune --expired``."""

from __future__ import annotations

import logging
from collections.abc import Callable

from django.core.management.base import CommandError
from django.utils import timezone

from ...conf import app_settings
from ...exceptions import ValidationError
from ...models import Run, ToolCall
from ...models.tool_calls import expired_calls
from ...orchestrator import Orchestrator
from ...results import PruneResult
from ...services import prune_expired_tool_calls
from ...states import TERMINAL_RUN_STATUSES, RunStatus
from ..arguments import configure_logging, duration, name_list, positive_int
from ..database import DatabaseCommand, require_migrated

logger = logging.getLogger("parallel_mcp.prune")

TERMINAL = [status.value for status in RunStatus if status in TERMINAL_RUN_STATUSES]


class Command(DatabaseCommand):
    help = (
        "Delete terminal runs (completed, failed, cancelled) last updated longer ago than "
        "--older-than, and/or (--expired) the runs of MCP tool calls whose task has expired, "
        "with their tasks, attempts, leases, snapshots and events. Deletes in batches of "
        "--limit runs, one transaction each, until none are left."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--older-than",
            metavar="AGE",
            help="Runs last updated longer ago than this: a number and a unit "
            "(ms, s, m, h, d, w), e.g. 7d.",
        )
        parser.add_argument(
            "--expired",
            action="store_true",
            help="The runs of MCP tool calls whose ttlMs has passed since the call and that "
            "have ended (what tasks/get answers 'Task has expired' for).",
        )
        parser.add_argument(
            "--status",
            metavar="S1,S2",
            help=f"With --older-than: only runs in these terminal statuses (default "
            f"{','.join(TERMINAL)}).",
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
        if options["older_than"] is None and not options["expired"]:
            raise CommandError("Give --older-than AGE, --expired, or both.")
        if options["status"] is not None and options["older_than"] is None:
            raise CommandError("--status goes with --older-than.")
        now = timezone.now()
        cutoff = None
        if options["older_than"] is not None:
            cutoff = now - duration(options["older_than"], "--older-than")
        statuses = _terminal_statuses(options["status"])
        limit = _batch_size(options["limit"])
        orchestrator = Orchestrator()
        using = orchestrator.using
        require_migrated(using)
        if options["dry_run"]:
            runs = Run.objects.using(using).none()
            if cutoff is not None:
                runs |= Run.objects.using(using).filter(status__in=statuses, updated_at__lt=cutoff)
            if options["expired"]:
                expired = ToolCall.objects.using(using).filter(expired_calls(now)).values("pk")
                runs |= Run.objects.using(using).filter(pk__in=expired)
            run_ids = list(
                runs.order_by("updated_at", "id").values_list("id", flat=True)  # as pruned
            )
            self._report("would prune", run_ids, options["verbosity"])
            return
        run_ids = []
        if cutoff is not None:
            run_ids += self._batches(
                lambda: orchestrator.prune_runs(older_than=cutoff, statuses=statuses, limit=limit),
                limit,
            )
        if options["expired"]:
            run_ids += self._batches(
                lambda: prune_expired_tool_calls(using=using, limit=limit, now=now), limit
            )
        self._report("pruned", run_ids, options["verbosity"])

    def _batches(self, prune: Callable[[], PruneResult], limit: int) -> list:
        """``prune()`` until a batch comes back short; every run id deleted."""
        run_ids: list = []
        while True:
            try:
                result = prune()
            except ValidationError as exc:
                raise CommandError(str(exc)) from None
            run_ids += result.pruned_run_ids
            if result.count:
                logger.info("pruned a batch of %d run(s)", result.count)
            if result.count < limit:
                return run_ids

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

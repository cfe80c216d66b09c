"""Run task handlers: ``manage.py pmcp_worker``."""

from __future__ import annotations

import os

from django.core.management.base import CommandError

from ...conf import app_settings
from ...exceptions import ValidationError
from ...orchestrator import Orchestrator
from ...worker.loop import DEFAULT_CLAIM_BATCH, DEFAULT_CONCURRENCY, Worker
from ..arguments import configure_logging, name_list, positive_int
from ..database import DatabaseCommand, require_migrated


class Command(DatabaseCommand):
    help = (
        "Run the registered task handlers, one task per slot (--concurrency); one claimer "
        "claims for the free slots. Claims only kinds it has handlers for; "
        "SIGTERM/SIGINT drain (stop claiming, wait for running tasks, release the rest, "
        "exit 0); a second signal exits at once."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--concurrency",
            default=str(DEFAULT_CONCURRENCY),
            metavar="N",
            help="Slots: tasks run at once, each in its own thread (default %(default)s).",
        )
        parser.add_argument(
            "--claim-batch",
            default=str(DEFAULT_CLAIM_BATCH),
            metavar="N",
            help="Claim up to N tasks in one transaction for the free slots "
            "(default %(default)s, never more than the free slots; 1 claims one at a time).",
        )
        parser.add_argument(
            "--kinds", metavar="A,B", help="Only these task kinds (each must have a handler)."
        )
        parser.add_argument(
            "--worker-id", metavar="ID", help="Name recorded on leases (default HOSTNAME:PID)."
        )
        parser.add_argument(
            "--lease-ms",
            metavar="MS",
            help="Lease length; heartbeats every third of it "
            "(default PARALLEL_MCP['DEFAULT_LEASE_MS']).",
        )
        parser.add_argument(
            "--drain-timeout-ms",
            default="30000",
            metavar="MS",
            help="On stop, how long to wait for running tasks before "
            "releasing them (default 30000).",
        )
        parser.add_argument(
            "--burst",
            action="store_true",
            help="Exit 0 once nothing is claimable (for scripts and tests).",
        )
        parser.add_argument(
            "--lease-expiry-interval-ms",
            metavar="MS",
            help="How often this worker expires lapsed leases, any worker's, so that the "
            "tasks of a killed worker are retried (default "
            "PARALLEL_MCP['WORKER_LEASE_EXPIRY_INTERVAL_MS'], 5000). Not with --api.",
        )
        parser.add_argument(
            "--no-expire-leases",
            action="store_true",
            help="Do not expire lapsed leases (leave it to pmcp_expire_leases).",
        )
        parser.add_argument(
            "--api",
            metavar="URL",
            help="Work through the HTTP API at URL (e.g. https://host/api/pmcp/) instead of "
            "the database: for machines without database access.",
        )
        parser.add_argument(
            "--token",
            metavar="TOKEN",
            help="Bearer token for --api (default: the PMCP_API_TOKEN environment variable, "
            "which keeps it out of process listings). Create one with pmcp_token create "
            "--role worker.",
        )

    def handle(self, *args, **options):
        configure_logging(options["verbosity"])
        kwargs = {
            "concurrency": positive_int(options["concurrency"], "--concurrency"),
            "kinds": name_list(options["kinds"], "--kinds"),
            "worker_id": options["worker_id"],
            "drain_timeout_ms": positive_int(
                options["drain_timeout_ms"], "--drain-timeout-ms", allow_zero=True
            ),
            "burst": options["burst"],
            "claim_batch": positive_int(options["claim_batch"], "--claim-batch"),
        }
        if options["lease_ms"] is not None:
            kwargs["lease_ms"] = positive_int(options["lease_ms"], "--lease-ms")
        interval = options["lease_expiry_interval_ms"]
        if interval is not None:
            if options["no_expire_leases"]:
                raise CommandError(
                    "--lease-expiry-interval-ms and --no-expire-leases exclude each other"
                )
            if options["api"] is not None:
                raise CommandError(
                    "--lease-expiry-interval-ms is for local workers: a --api worker does not "
                    "expire leases (run pmcp_expire_leases next to the database)"
                )
            kwargs["lease_expiry_interval_ms"] = positive_int(
                interval, "--lease-expiry-interval-ms"
            )
        kwargs["expire_leases"] = not options["no_expire_leases"]
        if kwargs["worker_id"] is not None and not kwargs["worker_id"].strip():
            raise CommandError("--worker-id must not be empty")
        try:
            worker = Worker(orchestrator=self._orchestrator(options, kwargs), **kwargs)
        except ValidationError as exc:
            raise CommandError(str(exc)) from None
        worker.install_signal_handlers()
        return_code = worker.run()
        if return_code:
            raise SystemExit(return_code)

    def _orchestrator(self, options, kwargs):
        if options["api"] is None:
            if options["token"] is not None:
                raise CommandError("--token goes with --api")
            orchestrator = Orchestrator()
            require_migrated(orchestrator.using)
            return orchestrator
        token = options["token"] or os.environ.get("PMCP_API_TOKEN", "")
        if not token:
            raise CommandError("--api needs a token: --token or PMCP_API_TOKEN")
        try:
            from ...worker.remote import RemoteOrchestrator
        except ModuleNotFoundError as exc:
            if exc.name != "httpx2":
                raise
            raise CommandError(
                "--api needs the HTTP client httpx2: install parallel-mcp with its remote extra "
                "(pip install -e '.[remote]' in a checkout, or the wheel with [remote])"
            ) from None
        return RemoteOrchestrator(
            base_url=options["api"], token=token, default_lease_ms=app_settings.DEFAULT_LEASE_MS
        )

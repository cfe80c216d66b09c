"""Requeue or dead-letter tasks whose lease expired: ``manage.py pmcp_expire_leases``."""

from __future__ import annotations

import signal
import threading

from ...orchestrator import Orchestrator
from ...worker.expiry import expire_once, run_expiry_loop
from ..arguments import configure_logging, positive_int
from ..database import DatabaseCommand, require_migrated


class Command(DatabaseCommand):
    help = (
        "Expire leases that ran out: tasks with attempts left go back to the queue after "
        "their backoff, the others are dead-lettered. Loops until SIGTERM/SIGINT."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--interval-ms",
            default="1000",
            metavar="MS",
            help="Time between passes (default 1000).",
        )
        parser.add_argument(
            "--once", action="store_true", help="One pass, print how many leases expired, exit."
        )

    def handle(self, *args, **options):
        configure_logging(options["verbosity"])
        interval = positive_int(options["interval_ms"], "--interval-ms")
        orchestrator = Orchestrator()
        require_migrated(orchestrator.using)
        if options["once"]:
            expired = expire_once(orchestrator)
            self.stdout.write(f"expired {len(expired)} lease(s)")
            for task_id in expired:
                self.stdout.write(f"  {task_id}")
            return
        stop = threading.Event()
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        total = run_expiry_loop(orchestrator, interval_ms=interval, stop=stop)
        self.stdout.write(f"expired {total} lease(s)")

"""The worker's presence: it reports that it runs, and which kinds it handles, when it starts
and then every ``PARALLEL_MCP["WORKER_PRESENCE_INTERVAL_MS"]``, and takes it back when it stops
cleanly. ``explain_task``, ``pmcp_status`` and the admin read it to say "no running worker
handles kind X". Best effort: a failed report is logged and tried again at the next interval;
it never stops the worker."""

from __future__ import annotations

import logging
import threading
from typing import Any

from ..exceptions import RecordNotFoundError

logger = logging.getLogger("parallel_mcp.worker")
trace = logging.getLogger("parallel_mcp.worker.trace")


class PresenceReporter:
    def __init__(self, *, env: Any, fields: dict[str, Any], interval_ms: int) -> None:
        self.env = env
        self.fields = fields  # record_worker_presence's arguments (process_id, kinds, …)
        self.interval = interval_ms / 1000
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._unsupported = False

    def start(self) -> None:
        """Report now (so the process counts from its first second), then in a thread."""
        self._report()
        if self._unsupported:
            return
        self._thread = threading.Thread(target=self._loop, name="pmcp-presence", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """A clean stop: no more reports, and the process no longer counts as running."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self._unsupported:
            return
        try:
            self.env.remove_presence(self.fields["process_id"])
        except Exception as exc:  # noqa: BLE001 - it expires by itself after a few intervals
            logger.warning("could not remove this worker's presence record: %s", exc)
        finally:
            self.env.close_thread()

    def _loop(self) -> None:
        try:
            while not self._stop.wait(self.interval):
                self._report()
        finally:
            self.env.close_thread()

    def _report(self) -> None:
        try:
            self.env.report_presence(self.fields)
            trace.debug("presence reported (next in %.1fs)", self.interval)
        except RecordNotFoundError as exc:
            # Only an API server older than the presence endpoint answers this.
            self._unsupported = True
            self._stop.set()
            logger.warning("the API does not record worker presence (%s); not reporting it", exc)
        except Exception as exc:  # noqa: BLE001 - presence is best effort; retried next interval
            logger.warning("could not report this worker's presence: %s", exc)

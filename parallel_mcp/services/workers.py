"""Worker presence: which worker processes run now, and which task kinds they handle
(docs/workers.md, "Which workers run"). Bookkeeping, not a run's history: no events."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import transaction

from ..contract import arguments as a
from ..contract import validation as v
from ..models import WorkerProcess, WorkerProcessKind

# A process is gone once it missed this many reports in a row.
PRESENCE_MISSED_REPORTS = 3
# Rows of processes gone for longer than this are deleted when another process starts.
GONE_ROWS_KEPT = timedelta(hours=1)


def record_worker_presence(
    *,
    using: str,
    process_id: Any,
    worker_id: str,
    hostname: str,
    kinds: Any,
    interval_ms: int,
    pid: int | None = None,
    concurrency: int = 1,
    remote: bool = False,
    now: datetime | None = None,
) -> WorkerProcess:
    """Create the process's row on its first report, refresh it on the next ones (the kinds,
    host and the rest are fixed by the first). One transaction."""
    now = v.resolve_now(now)
    process_uuid = v.require_id(process_id, "process_id")
    worker_id = a.NAME.check(worker_id, "worker_id")
    hostname = a.HOSTNAME.check(hostname, "hostname")
    kind_list = a.KINDS.check(kinds, "kinds")
    interval = a.DURATION_MS.check(interval_ms, "interval_ms")
    if pid is not None:
        a.PID.check(pid, "pid")
    a.CONCURRENCY.check(concurrency, "concurrency")
    expires_at = now + PRESENCE_MISSED_REPORTS * timedelta(milliseconds=interval)
    rows = WorkerProcess.objects.using(using)
    with transaction.atomic(using=using):
        if not rows.filter(pk=process_uuid).update(last_seen_at=now, expires_at=expires_at):
            _delete(using, rows.filter(expires_at__lt=now - GONE_ROWS_KEPT))
            # ON CONFLICT DO NOTHING: a retried first report racing the original (its reply
            # was lost) finds the row recorded instead of failing.
            process = WorkerProcess(
                id=process_uuid,
                worker_id=worker_id,
                hostname=hostname,
                pid=pid,
                concurrency=concurrency,
                remote=bool(remote),
                started_at=now,
                last_seen_at=now,
                expires_at=expires_at,
            )
            rows.bulk_create([process], ignore_conflicts=True)
            WorkerProcessKind.objects.using(using).bulk_create(
                [
                    WorkerProcessKind(worker_process_id=process_uuid, kind=kind)
                    for kind in sorted(set(kind_list))
                ],
                ignore_conflicts=True,
            )
        return rows.get(pk=process_uuid)


def remove_worker_presence(*, using: str, process_id: Any) -> bool:
    """The process stopped cleanly: forget it at once. False when it was not recorded."""
    process_uuid = v.require_id(process_id, "process_id")
    with transaction.atomic(using=using):
        return _delete(using, WorkerProcess.objects.using(using).filter(pk=process_uuid)) > 0


def _delete(using: str, processes: Any) -> int:
    ids = list(processes.values_list("pk", flat=True))
    if not ids:
        return 0
    WorkerProcessKind.objects.using(using).filter(worker_process_id__in=ids).delete()
    deleted, _ = WorkerProcess.objects.using(using).filter(pk__in=ids).delete()
    return deleted

"""Subprocess entry for multi-process tests: ``python -m tests.workload MODE ...``.

Runs against the test database named by ``PMCP_DB_NAME`` (see tests/settings.py).
Modes:
- ``drain WORKER_ID RUN_ID [BARRIER_DIR PARTIES]``: claim, run and complete tasks until the
  run is terminal; with a barrier, first wait until PARTIES processes are ready (so that a
  process that started early cannot drain the run alone).
- ``hold WORKER_ID INTERVAL_MS``: claim one task, heartbeat until the lease check refuses.
- ``snapshots RUN_ID COUNT``: append COUNT context snapshots (one event-writing
  transaction each, held open for a random instant before commit).
- ``die_before_fold WORKER_ID``: claim one task and complete it, and die (SIGKILL, by
  itself) right after the completion's commit, before it folds the run's counters.
- ``context_cycles WORKER_ID BARRIER_DIR PARTIES``: worker cycles (``complete_and_claim``,
  4 tasks at a time) until none is left to claim, about half the completions (by task id)
  moving their run's context; a completion refused because its task was cancelled meanwhile
  is counted apart.
  Prints ``{"completed": N, "refused": M}`` as JSON.
- ``maxpar WORKER_ID RUN_ID SLEEP_MS``: claim tasks of the run until it is terminal; right
  after each claim record how many of the run's tasks are leased or running, hold the task
  about SLEEP_MS, complete it. Prints ``{"done": N, "seen": [...]}`` as JSON.
"""

from __future__ import annotations

import os
import random
import sys
import time

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")


def barrier(directory: str, parties: int, name: str, timeout: float = 60) -> None:
    """Wait until ``parties`` processes have arrived in ``directory`` (one file each)."""
    from pathlib import Path

    Path(directory, name).touch()
    deadline = time.monotonic() + timeout
    while len(list(Path(directory).iterdir())) < parties:
        if time.monotonic() > deadline:
            raise SystemExit(f"barrier: only {len(list(Path(directory).iterdir()))} arrived")
        time.sleep(0.01)


def drain(worker_id: str, run_id: str, barrier_dir: str = "", parties: int = 0) -> int:
    from parallel_mcp import Orchestrator

    orch = Orchestrator(default_lease_ms=60_000)
    orch.get_run(run_id=run_id)  # connected and warm before the barrier
    if barrier_dir:
        barrier(barrier_dir, parties, worker_id)
    done = 0
    while True:
        claim = orch.claim_next_task(worker_id=worker_id)
        if claim is None:
            run = orch.get_run(run_id=run_id)
            if run.status in ("completed", "failed", "cancelled"):
                break
            time.sleep(0.005)
            continue
        ids = {"task_id": claim.task.id, "lease_id": claim.lease.id, "worker_id": worker_id}
        orch.mark_task_running(**ids)
        orch.complete_task(**ids, output={"by": worker_id})
        done += 1
    print(done)
    return 0


def context_cycles(worker_id: str) -> dict[str, int]:
    """The body of ``context_cycles`` (threads run it too: tests/test_run_counters.py)."""
    from parallel_mcp.exceptions import ParallelMcpError
    from parallel_mcp.services.cycle import complete_and_claim

    held: list = []
    completed = refused = 0
    while True:
        items = [
            {
                "task_id": claim.task.id,
                "lease_id": claim.lease.id,
                **({"next_context": {"by": worker_id}} if claim.task.id.int % 2 else {}),
            }
            for claim in held
        ]
        results, held = complete_and_claim(
            using="default", worker_id=worker_id, items=items, limit=4, lease_ms=60_000
        )
        for result in results:
            if isinstance(result, ParallelMcpError):
                assert result.code in ("lease_conflict", "invalid_transition"), result
                refused += 1
            else:
                completed += 1
        if not held and not items:
            return {"completed": completed, "refused": refused}


def maxpar(worker_id: str, run_id: str, sleep_ms: int) -> int:
    import json

    from parallel_mcp import Orchestrator
    from parallel_mcp.models import Task

    orch = Orchestrator(default_lease_ms=60_000)
    seen: list[int] = []
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        claim = orch.claim_next_task(worker_id=worker_id, kinds=["mp"])
        if claim is None:
            run = orch.get_run(run_id=run_id)
            if run.status in ("completed", "failed", "cancelled"):
                break
            time.sleep(0.002)
            continue
        seen.append(Task.objects.filter(run_id=run_id, status__in=["leased", "running"]).count())
        ids = {"task_id": claim.task.id, "lease_id": claim.lease.id, "worker_id": worker_id}
        orch.mark_task_running(**ids)
        time.sleep(sleep_ms / 1000 * (0.5 + random.random()))
        orch.complete_task(**ids, output={"by": worker_id})
    print(json.dumps({"done": len(seen), "seen": seen}))
    return 0


def die_before_fold(worker_id: str) -> int:
    import signal
    from unittest import mock

    from parallel_mcp import Orchestrator

    orch = Orchestrator(default_lease_ms=60_000)
    claim = orch.claim_next_task(worker_id=worker_id)
    if claim is None:
        return 4
    ids = {"task_id": claim.task.id, "lease_id": claim.lease.id, "worker_id": worker_id}

    def killed(**_: object) -> None:
        os.kill(os.getpid(), signal.SIGKILL)

    with mock.patch("parallel_mcp.services.write.fold_runs", killed):
        orch.complete_task(**ids)
    return 3  # not reached: the fold kills this process


def snapshots(run_id: str, count: int) -> int:
    from parallel_mcp import Orchestrator

    orch = Orchestrator()
    for index in range(count):
        with orch.transaction():
            orch.append_context_snapshot(run_id=run_id, payload={"i": index})
            time.sleep(random.random() * 0.003)
    return 0


def hold(worker_id: str, interval_ms: int) -> int:
    """Claim one task and heartbeat it until the lease check refuses (exit 0) or 20 s pass."""
    from parallel_mcp import Orchestrator
    from parallel_mcp.exceptions import LeaseConflictError

    orch = Orchestrator(default_lease_ms=5_000)
    claim = None
    deadline = time.monotonic() + 20
    while claim is None and time.monotonic() < deadline:
        claim = orch.claim_next_task(worker_id=worker_id)
        time.sleep(0.01)
    if claim is None:
        return 4
    print("claimed", flush=True)
    ids = {"task_id": claim.task.id, "lease_id": claim.lease.id, "worker_id": worker_id}
    try:
        orch.mark_task_running(**ids)
        while time.monotonic() < deadline:
            orch.heartbeat_lease(**ids, lease_ms=5_000)
            time.sleep(interval_ms / 1000)
    except LeaseConflictError as exc:
        print(f"refused {exc.code}", flush=True)
        return 0
    return 3


def main(argv: list[str]) -> int:
    import django

    django.setup()
    mode, *args = argv
    if mode == "drain":
        return drain(args[0], args[1], *args[2:3], *map(int, args[3:4]))
    if mode == "hold":
        return hold(args[0], int(args[1]))
    if mode == "snapshots":
        return snapshots(args[0], int(args[1]))
    if mode == "die_before_fold":
        return die_before_fold(args[0])
    if mode == "context_cycles":
        import json

        from django.db import connection

        connection.ensure_connection()  # connected before the barrier
        barrier(args[1], int(args[2]), args[0])
        print(json.dumps(context_cycles(args[0])))
        return 0
    if mode == "maxpar":
        return maxpar(args[0], args[1], int(args[2]))
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

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
- ``seed``: ``seed_every_kind_of_row`` (a database to dump and load elsewhere).
- ``maxpar WORKER_ID RUN_ID SLEEP_MS``: claim tasks of the run until it is terminal; right
  after each claim record how many of the run's tasks are leased or running, hold the task
  about SLEEP_MS, complete it. Prints ``{"done": N, "seen": [...]}`` as JSON.
"""

from __future__ import annotations

import os
import random
import sys
import time
from typing import Any

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


def seed_every_kind_of_row() -> str:
    """A row in each of parallel_mcp's tables and a task in most states, at the current time
    (microseconds and all): what a dump of a live database holds. Returns the secret of the
    API token it makes (for a user of its own)."""
    from django.contrib.auth import get_user_model

    from parallel_mcp import Orchestrator
    from parallel_mcp.services.tokens import create_token
    from parallel_mcp.services.tool_calls import start_tool_call

    orch = Orchestrator()
    user = get_user_model().objects.create_user("seed-user", password="not-used")
    issued = create_token(using="default", user=user, name="seed", worker_prefix="w")
    run = orch.create_run(namespace="seed", metadata={"b": 1, "a": [1, 2]}, context={"n": 0})
    capped = orch.create_run(namespace="seed", external_id="capped", max_parallel=1)
    first = orch.enqueue_task(run_id=run.id, kind="k", key="first", input={"n": 1}, priority=2)
    orch.enqueue_task(run_id=run.id, kind="k", key="then", depends_on=[first.id])
    for key in ("fails", "dies", "waits", "blocks", "queued"):
        orch.enqueue_task(run_id=run.id, kind="k", key=key, max_attempts=1)
    orch.enqueue_task(run_id=capped.id, kind="k", key="capped")

    def claim(worker: str, **kwargs: Any) -> dict[str, Any]:
        claim = orch.claim_next_task(worker_id=worker, **{"kinds": ["k"], **kwargs})
        assert claim is not None
        return {"task_id": claim.task.id, "lease_id": claim.lease.id, "worker_id": worker}

    done = claim("w1", client_token="claim-1")
    orch.heartbeat_lease(**done, lease_ms=60_000)
    orch.complete_task(
        **done, output={"ok": True}, metadata={"m": 1}, next_context={"n": 1},
        client_token="done-1",
    )  # fmt: skip
    orch.fail_task(**claim("w1"), error="boom", client_token="fail-1")
    orch.fail_task(**claim("w2"), error="dead", retry=True)
    orch.pause_task(**claim("w2"), status="waiting_input", reason="asks")
    orch.pause_task(**claim("w2"), status="blocked", reason="later")
    claim("w3")  # left leased
    start_tool_call(
        using="default", tool="greet", kind="mcp.tool.greet", input={}, principal="token:ab",
        ttl_ms=60_000,
    )  # fmt: skip
    asks = claim("w4", kinds=["mcp.tool.greet"])
    orch.pause_task(**asks, status="waiting_input", input_requests={"q": {"method": "roots/list"}})
    return issued.secret


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
    if mode == "seed":
        print(seed_every_kind_of_row())
        return 0
    if mode == "maxpar":
        return maxpar(args[0], args[1], int(args[2]))
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""A claimer that times each of its claims (the "bigbatch" scenario): while the driver
enqueues a big batch, how long does a worker's claim wait for it?

``python -m bench.claim_probe OUT``: claims one task of the kind ``bench.probe`` at a time
(``claim_next_task``, then completes it, as a one-slot worker would) until SIGTERM, then
writes to OUT the JSON list of ``[started (time.time()), seconds]`` of every such write, the
claims' and the completions' alike (whichever comes when the batch holds the write lock
waits for it).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def main(out: str) -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "bench.settings")
    import django

    django.setup()
    from parallel_mcp import Orchestrator

    stop = False

    def on_term(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, on_term)
    orch = Orchestrator()
    timings = []
    print("probe started", flush=True)
    while not stop:
        started, clock = time.time(), time.perf_counter()
        claim = orch.claim_next_task(worker_id="probe", kinds=["bench.probe"])
        timings.append((started, time.perf_counter() - clock))
        if claim is None:
            time.sleep(0.002)
            continue
        started, clock = time.time(), time.perf_counter()
        orch.complete_task(task_id=claim.task.id, lease_id=claim.lease.id, worker_id="probe")
        timings.append((started, time.perf_counter() - clock))
    with open(out, "w") as handle:
        json.dump(timings, handle)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

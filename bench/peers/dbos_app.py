"""DBOS's side of the bench: the no-op workflow, a worker process, and the seeding.

    python -m bench.peers.dbos_app work --executor-id ID --slots N
    python -m bench.peers.dbos_app seed --tasks N

The system database is the bench's work database (``PMCP_BENCH_DB``: the SQLite file, or the
PostgreSQL database, where DBOS keeps its tables in the schema ``dbos``). Every process
runs one application version (``bench``), so workers dequeue what the seeding enqueued, and
an executor id of its own (DBOS uses it to apply ``worker_concurrency`` per process, and its
docs require a unique one per process when Conductor is not used).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading

from dbos import DBOS

QUEUE = "bench"
APP_NAME = "pmcp-bench"
APP_VERSION = "bench"
# The queue's polling interval. DBOS's default (1 s) caps a worker at one dequeue per
# second: a 1-slot worker would run about one task per second. 10 ms is the shortest the
# bench found worth having (the measurements used it too).
POLLING_INTERVAL_SEC = 0.01


def system_database_url() -> str:
    if os.environ.get("PMCP_BENCH_DB") == "postgres":
        return (
            f"postgresql://{os.environ['PMCP_PG_USER']}@{os.environ['PMCP_PG_HOST']}:"
            f"{os.environ['PMCP_PG_PORT']}/{os.environ['PMCP_PG_DB']}"
        )
    return f"sqlite:///{os.environ['PMCP_BENCH_SQLITE_PATH']}"


def configure(executor_id: str) -> None:
    DBOS(
        config={
            "name": APP_NAME,
            "system_database_url": system_database_url(),
            "executor_id": executor_id,
            "application_version": APP_VERSION,
            "log_level": "WARNING",
        }
    )


@DBOS.workflow()
def noop() -> None:
    return None


def register(slots: int):
    return DBOS.register_queue(
        QUEUE,
        worker_concurrency=slots,
        polling_interval_sec=POLLING_INTERVAL_SEC,
        on_conflict="always_update",
    )


def work(executor_id: str, slots: int) -> int:
    configure(executor_id)
    DBOS.launch()
    register(slots)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"dbos worker {executor_id} started: {slots} slot(s)", flush=True)
    stop.wait()
    DBOS.destroy(workflow_completion_timeout_sec=10)
    return 0


def seed(tasks: int) -> int:
    configure("bench-seed")
    DBOS.listen_queues([])  # this process only enqueues
    DBOS.launch()
    queue = register(1)
    for _ in range(tasks):
        queue.enqueue(noop)
    DBOS.destroy()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    worker = sub.add_parser("work")
    worker.add_argument("--executor-id", required=True)
    worker.add_argument("--slots", type=int, default=1)
    seeder = sub.add_parser("seed")
    seeder.add_argument("--tasks", type=int, required=True)
    args = parser.parse_args(argv)
    if args.command == "work":
        return work(args.executor_id, args.slots)
    return seed(args.tasks)


if __name__ == "__main__":
    sys.exit(main())

"""How big and how long each scenario is, in full and in ``--quick`` mode.

Worker-process figures are taken over a steady-state window: from the moment every worker
has claimed its first task until the window closes (the workers are then told to stop) or the
backlog runs out, whichever comes first. At the issue's targets (>= 1,500 tasks/s) a 20k
burn-down finishes inside the window; at lower rates the window keeps the whole bench within
its time budget, and the result says how many of the seeded tasks were done ("capped").
"""

from __future__ import annotations

from dataclasses import dataclass

# Reference figures of the original @razroo/parallel-mcp's claim bench on this machine kind
# (issue 9): claim+complete cycles per second with N tasks in one run, SQLite NORMAL, one process.
ORIGINAL_REFERENCE = {500: 799.0, 2_000: 372.0, 5_000: 180.0}

SCENARIOS = (
    "throughput",  # ours: pmcp_worker processes at 1, 2, 4, 8
    "slots",  # ours: pmcp_worker --concurrency 8, batched claims vs one claim at a time
    "floor",  # raw sqlite3/psycopg loop, and ours in-process, one process
    "peers",  # ours beside django-tasks-db, django-ox, oban, procrastinate, dbos and the floor
    "variants",  # capped runs, metadata, next_context, dependencies vs plain tasks
    "runsize",  # 1 run vs 4 runs vs 40 runs, same number of tasks
    "reference",  # in-process claim+complete with 500 / 2,000 / 5,000 tasks in one run
    "backlog",  # claim latency with 100k queued + 100k blocked vs an empty backlog
    "latency",  # enqueue -> claim/start at a steady arrival rate; idle worker CPU
    "enqueue",  # enqueue throughput: single vs batch (and the peer's single enqueue)
    "bigbatch",  # one enqueue_tasks of 10,000 tasks, and how long a claim waits meanwhile
)

# Which scenarios run on which database configuration by default.
DEFAULT_MATRIX = {
    "sqlite-full": (
        "throughput", "slots", "floor", "peers", "variants", "runsize", "backlog", "latency",
        "enqueue", "bigbatch",
    ),
    "sqlite-normal": ("throughput", "floor", "reference"),
    "postgres": (
        "throughput", "slots", "floor", "peers", "variants", "runsize", "backlog", "latency",
        "enqueue", "bigbatch",
    ),
}  # fmt: skip

# The "slots" scenario's two worker set-ups: pmcp_worker's --claim-batch (16 is its default).
SLOTS_MODES = {"batched": 16, "single": 1}


@dataclass(frozen=True)
class Plan:
    name: str
    reps: int
    tasks: int
    workers: tuple[int, ...]
    window: float
    start_timeout: float
    peers_tasks: int  # the "peers" scenario: pre-seeded tasks per run
    peers_processes: tuple[int, ...]  # worker processes
    peers_slots: tuple[int, ...]  # tasks at a time per process: 1, and each system's best
    peers_window: float
    variants_tasks: int  # the "variants" scenario: tasks per variant
    variants_processes: tuple[int, ...]  # pmcp_worker processes (default --concurrency)
    slots_processes: tuple[int, ...]
    slots_concurrency: int
    inproc_seconds: float
    runsize_shapes: tuple[tuple[int, int], ...]
    runsize_workers: int
    reference_sizes: tuple[int, ...]
    reference_seconds: float
    backlog_queued: int
    backlog_blocked: int
    backlog_claims: int
    latency_rate: float
    latency_seconds: float
    idle_seconds: float
    enqueue_seconds: float
    enqueue_batch_total: int
    enqueue_batch_size: int
    bigbatch_tasks: int  # the "bigbatch" scenario: tasks in the one enqueue_tasks call


FULL = Plan(
    name="full",
    reps=3,
    tasks=20_000,
    workers=(1, 2, 4, 8),
    window=3.5,
    start_timeout=30.0,
    peers_tasks=5_000,
    peers_processes=(1, 4),
    peers_slots=(1, 8),
    peers_window=3.5,
    variants_tasks=5_000,
    variants_processes=(1, 2),
    slots_processes=(1, 2),
    slots_concurrency=8,
    inproc_seconds=2.0,
    runsize_shapes=((1, 20_000), (4, 5_000), (40, 500)),
    runsize_workers=2,
    reference_sizes=(500, 2_000, 5_000),
    reference_seconds=3.0,
    backlog_queued=100_000,
    backlog_blocked=100_000,
    backlog_claims=300,
    latency_rate=20.0,
    latency_seconds=8.0,
    idle_seconds=3.0,
    enqueue_seconds=2.0,
    enqueue_batch_total=20_000,
    enqueue_batch_size=500,
    bigbatch_tasks=10_000,
)

QUICK = Plan(
    name="quick",
    reps=1,
    tasks=4_000,
    workers=(1, 2, 4, 8),
    window=1.5,
    start_timeout=30.0,
    peers_tasks=1_500,
    peers_processes=(1,),
    peers_slots=(1, 8),
    peers_window=1.5,
    variants_tasks=1_500,
    variants_processes=(1,),
    slots_processes=(1,),
    slots_concurrency=8,
    inproc_seconds=1.5,
    runsize_shapes=((1, 4_000), (8, 500)),
    runsize_workers=2,
    reference_sizes=(500, 2_000, 5_000),
    reference_seconds=1.5,
    backlog_queued=20_000,
    backlog_blocked=20_000,
    backlog_claims=200,
    latency_rate=20.0,
    latency_seconds=3.0,
    idle_seconds=1.5,
    enqueue_seconds=1.0,
    enqueue_batch_total=4_000,
    enqueue_batch_size=500,
    bigbatch_tasks=10_000,
)

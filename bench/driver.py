"""One database configuration's share of the bench, in a process of its own.

``python -m bench.run`` starts ``python -m bench.driver --config NAME --scenarios a,b --out F``
with the configuration's environment (bench/dbs.py). The driver migrates the work database,
seeds it, starts worker processes, measures, and writes its results to ``F`` as JSON after
every scenario (so an interrupted bench keeps what it measured).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from .plan import FULL, ORIGINAL_REFERENCE, QUICK, SLOTS_MODES, Plan

REPO = Path(__file__).resolve().parent.parent


def log(message: str) -> None:
    print(f"  [{time.strftime('%H:%M:%S')}] {message}", flush=True)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(q / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


def loadavg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def close_db() -> None:
    from django.db import connections

    connections.close_all()


# -- worker processes ---------------------------------------------------------------------------

STARTED_MARKERS = {"ours": " started: "}


def worker_command(
    kind: str, worker_id: str, *, concurrency: int = 1, extra: Sequence[str] = ()
) -> list[str]:
    """The command line of one worker process; ``concurrency`` and ``extra`` (more options,
    e.g. ``--claim-batch 1``) apply to ``ours`` only."""
    if kind != "ours" and (concurrency != 1 or extra):
        raise ValueError(f"{kind}: no --concurrency / extra options")
    if kind == "ours":
        return [
            sys.executable, "-m", "django", "pmcp_worker", "--burst", "--concurrency",
            str(concurrency), "--worker-id", worker_id, *extra,
        ]  # fmt: skip
    if kind == "ours-nolisten":
        return [sys.executable, "-m", "bench.poll_worker", "--worker-id", worker_id]
    if kind == "ours-daemon":
        return [
            sys.executable, "-m", "django", "pmcp_worker", "--concurrency", "1",
            "--worker-id", worker_id,
        ]  # fmt: skip
    raise ValueError(kind)


class Workers:
    """Worker processes with their output in log files."""

    def __init__(
        self,
        kind: str,
        count: int,
        logdir: Path,
        label: str,
        *,
        concurrency: int = 1,
        extra: Sequence[str] = (),
        command: Callable[[str], list[str]] | None = None,
        marker: str | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        """``command`` (worker id -> argv), ``marker`` and ``env`` start another system's
        workers (bench/peers/systems.py) instead of the ``kind``'s."""
        close_db()
        self.kind = kind
        self.concurrency = concurrency
        self.extra = tuple(extra)
        self.marker = marker or STARTED_MARKERS["ours"]
        self.logs = [logdir / f"{label}-{index}.log" for index in range(count)]
        self.ids = [f"bench-{index}" for index in range(count)]
        self.procs = []
        for worker_id, path in zip(self.ids, self.logs, strict=True):
            argv = (
                command(worker_id)
                if command
                else worker_command(kind, worker_id, concurrency=concurrency, extra=extra)
            )
            with path.open("w") as out:
                self.procs.append(
                    subprocess.Popen(
                        argv,
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                        cwd=REPO,
                        env=env or os.environ,
                    )
                )

    def wait_started(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            pending = [
                path
                for proc, path in zip(self.procs, self.logs, strict=True)
                if proc.poll() is None and self.marker not in path.read_text(errors="replace")
            ]
            if not pending:
                return True
            time.sleep(0.05)
        return False

    def running(self) -> bool:
        return any(proc.poll() is None for proc in self.procs)

    def stop(self, timeout: float = 20.0) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        for proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()  # our own child, by its pid
                proc.wait()

    def problems(self) -> dict[str, Any]:
        text = "\n".join(path.read_text(errors="replace") for path in self.logs)
        return {
            "exit_codes": [proc.returncode for proc in self.procs],
            "locked_lines": text.count("database is locked"),
            "tracebacks": text.count("Traceback"),
            "hiccups": text.count("database hiccup"),
        }


def proc_cpu_seconds(pid: int) -> float:
    """CPU time of a process, all its threads, in nanosecond resolution (schedstat), falling
    back to clock ticks (stat)."""
    total = 0
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                total += int((task / "schedstat").read_text().split()[0])
        return total / 1e9
    except OSError:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _steady_rate(
    firsts: dict[str, datetime],
    completions: list[datetime],
    *,
    capped: bool,
    stop: datetime,
    total: int | None = None,
) -> dict[str, Any]:
    """Completions per second from the moment every worker had claimed to the end: the last
    completion when the workers ran out of work (they exited, or all ``total`` tasks are
    done: workers without a burst mode idle until stopped), else the end of the window."""
    if not firsts or not completions:
        return {"rate": 0.0, "done": 0, "window": 0.0, "workers_claimed": len(firsts)}
    start = max(firsts.values())
    drained = not capped or (total is not None and len(completions) >= total)
    end = max(completions) if drained else stop
    done = sum(1 for moment in completions if start < moment <= end)
    window = (end - start).total_seconds()
    return {
        "rate": done / window if window > 0 else 0.0,
        "done": done,
        "window": round(window, 3),
        "workers_claimed": len(firsts),
        "completed_total": len(completions),
    }


def measure_workers(
    kind: str,
    count: int,
    plan: Plan,
    logdir: Path,
    label: str,
    *,
    concurrency: int = 1,
    extra: Sequence[str] = (),
) -> dict:
    """Start ``count`` burst workers on the work database as it is, measure, stop them."""
    load = loadavg()
    workers = Workers(kind, count, logdir, label, concurrency=concurrency, extra=extra)
    started_ok = workers.wait_started(plan.start_timeout)
    go = time.monotonic()
    while workers.running() and time.monotonic() - go < plan.window:
        time.sleep(0.05)
    capped = workers.running()
    stop = datetime.now(UTC)
    workers.stop()
    firsts, completions = _our_timestamps()
    result = _steady_rate(firsts, completions, capped=capped, stop=stop)
    result.update(capped=capped, all_started=started_ok, load_before=load, **workers.problems())
    return result


def _our_timestamps() -> tuple[dict[str, datetime], list[datetime]]:
    from django.db.models import Min

    from parallel_mcp.models import Attempt, Task

    firsts = {
        row["worker_id"]: row["first"]
        for row in Attempt.objects.values("worker_id").annotate(first=Min("leased_at"))
    }
    completions = list(
        Task.objects.filter(status="completed").values_list("completed_at", flat=True)
    )
    close_db()
    return firsts, completions


# -- scenarios ---------------------------------------------------------------------------------


class Driver:
    def __init__(self, config: str, plan: Plan, logdir: Path, out: Path) -> None:
        from .dbs import Workspace

        self.config = config
        self.plan = plan
        self.logdir = logdir
        self.out = out
        self.ws = Workspace()
        self.results: dict[str, Any] = {"config": config, "plan": plan.name, "scenarios": {}}

    def save(self) -> None:
        self.out.write_text(json.dumps(self.results, indent=2, default=str))

    def migrate(self) -> None:
        from django.core.management import call_command

        self.ws.make_blank()  # what the peers (bench/peers) seed their own schemas into
        started = time.monotonic()
        call_command("migrate", verbosity=0)
        self.ws.snapshot("empty")
        log(f"migrated in {time.monotonic() - started:.1f}s")

    def seeded(self, name: str, seed: Callable[[], Any]) -> None:
        """Restore snapshot ``name``, seeding it from an empty database the first time."""
        if not self.ws.has(name):
            started = time.monotonic()
            self.ws.restore("empty")
            seed()
            self.ws.analyze()
            self.ws.snapshot(name)
            log(f"seeded {name} in {time.monotonic() - started:.1f}s")
        self.ws.restore(name)

    def run(self, scenario: str) -> None:
        started = time.monotonic()
        load = loadavg()
        log(f"{self.config}: {scenario} (load {load[0]:.2f})")
        result = getattr(self, f"scenario_{scenario}")()
        result["load_before"] = load
        result["load_after"] = loadavg()
        result["seconds"] = round(time.monotonic() - started, 1)
        self.results["scenarios"][scenario] = result
        self.save()
        log(f"{self.config}: {scenario} done in {result['seconds']}s")

    # -- throughput at 1, 2, 4, 8 worker processes --------------------------------------------
    def _burn(self, kind: str, snapshot: str, counts: tuple[int, ...], label: str) -> dict:
        runs: dict[str, list[dict]] = {str(n): [] for n in counts}
        for rep in range(self.plan.reps):
            for count in counts:
                self.ws.restore(snapshot)
                result = measure_workers(
                    kind, count, self.plan, self.logdir, f"{label}-{count}w-r{rep}"
                )
                runs[str(count)].append(result)
                log(
                    f"    {label} {count}w rep {rep + 1}: {result['rate']:.0f} tasks/s "
                    f"({result['done']} in {result['window']}s"
                    f"{', capped' if result['capped'] else ''}; load {result['load_before'][0]})"
                )
        return {
            "median": {n: median([r["rate"] for r in rs]) for n, rs in runs.items()},
            "runs": runs,
        }

    def _seed_tput(self) -> None:
        from .seed import seed_runs

        self.seeded(f"tput-{self.plan.tasks}", lambda: seed_runs([(1, self.plan.tasks)]))

    def scenario_throughput(self) -> dict:
        self._seed_tput()
        result = self._burn("ours", f"tput-{self.plan.tasks}", self.plan.workers, "ours")
        result["tasks"] = self.plan.tasks
        return result

    def _interleaved(
        self,
        setups: dict[str, tuple[str, int, tuple[str, ...]]],
        counts: tuple[int, ...],
        label: str,
    ) -> dict[str, dict[str, list[dict]]]:
        """``pmcp_worker`` processes for each setup (name: snapshot, --concurrency, more
        options), per repetition and process count one setup after the other, so a change in
        the machine's load hits them alike. Returns setup -> process count -> results."""
        runs: dict[str, dict[str, list[dict]]] = {n: {str(c): [] for c in counts} for n in setups}
        for rep in range(self.plan.reps):
            for count in counts:
                for name, (snapshot, concurrency, extra) in setups.items():
                    self.ws.restore(snapshot)
                    result = measure_workers(
                        "ours",
                        count,
                        self.plan,
                        self.logdir,
                        f"{label}-{name}-{count}w-r{rep}",
                        concurrency=concurrency,
                        extra=extra,
                    )
                    runs[name][str(count)].append(result)
                    claimed = result["workers_claimed"]
                    log(
                        f"    {label} {name} {count}w x {concurrency} rep {rep + 1}: "
                        f"{result['rate']:.0f} tasks/s ({result['done']} in {result['window']}s"
                        f"{', capped' if result['capped'] else ''}; "
                        f"load {result['load_before'][0]})"
                        + (f" ONLY {claimed} OF {count} WORKERS CLAIMED" if claimed < count else "")
                    )
        return runs

    # -- several slots per worker process: batched claims vs one claim at a time ---------------
    def scenario_slots(self) -> dict:
        """``pmcp_worker --concurrency N`` processes on the throughput scenario's backlog, once
        with batched claims (``--claim-batch 16``, the default) and once claiming one task at a
        time (``--claim-batch 1``); within each repetition the two alternate per process count,
        so a change in the machine's load hits both alike."""
        self._seed_tput()
        snapshot = f"tput-{self.plan.tasks}"
        slots = self.plan.slots_concurrency
        counts = self.plan.slots_processes
        runs = self._interleaved(
            {
                mode: (snapshot, slots, ("--claim-batch", str(batch)))
                for mode, batch in SLOTS_MODES.items()
            },
            counts,
            "slots",
        )
        modes = {
            mode: {
                "claim_batch": SLOTS_MODES[mode],
                "median": {n: median([r["rate"] for r in rs]) for n, rs in runs[mode].items()},
                "runs": runs[mode],
            }
            for mode in SLOTS_MODES
        }
        ratio = {
            n: (rate / modes["single"]["median"][n] if modes["single"]["median"][n] else None)
            for n, rate in modes["batched"]["median"].items()
        }
        return {
            "tasks": self.plan.tasks,
            "concurrency": slots,
            "processes": list(counts),
            "modes": modes,
            "ratio_batched_single": ratio,
        }

    # -- capped runs, metadata, next_context, dependencies vs plain -----------------------------
    def scenario_variants(self) -> dict:
        """``pmcp_worker`` processes (default slots) burning down each variant's backlog;
        within a repetition the variants alternate per process count, so a change in the
        machine's load hits them alike. Issue 15's target: each within 15 % of plain."""
        from parallel_mcp.worker.loop import DEFAULT_CONCURRENCY

        from .seed import VARIANTS, seed_variant

        tasks = self.plan.variants_tasks
        for variant in VARIANTS:
            self.seeded(f"variant-{variant}-{tasks}", lambda v=variant: seed_variant(v, tasks))
        counts = self.plan.variants_processes
        runs = self._interleaved(
            {v: (f"variant-{v}-{tasks}", DEFAULT_CONCURRENCY, ()) for v in VARIANTS},
            counts,
            "variant",
        )
        medians = {
            v: {n: median([r["rate"] for r in rs]) for n, rs in runs[v].items()} for v in VARIANTS
        }
        return {
            "tasks": tasks,
            "processes": list(counts),
            "concurrency": DEFAULT_CONCURRENCY,
            "median": medians,
            "vs_plain": {
                v: {
                    n: (rate / medians["plain"][n] if medians["plain"][n] else None)
                    for n, rate in medians[v].items()
                }
                for v in VARIANTS
            },
            "runs": runs,
        }

    # -- the floor and ours in-process ---------------------------------------------------------
    def scenario_floor(self) -> dict:
        from . import floor

        raw, plain, worker_like = [], [], []
        for rep in range(self.plan.reps):
            self.ws.restore("empty")
            raw.append(floor.measure(count=self.plan.tasks, seconds=self.plan.inproc_seconds))
            close_db()
            self._seed_tput()
            plain.append(self._inproc_loop(worker_like=False, seconds=self.plan.inproc_seconds))
            self._seed_tput()
            worker_like.append(
                self._inproc_loop(worker_like=True, seconds=self.plan.inproc_seconds)
            )
            log(
                f"    rep {rep + 1}: floor {raw[-1]['rate']:.0f}/s, ours claim+complete "
                f"{plain[-1]['rate']:.0f}/s, ours worker cycle {worker_like[-1]['rate']:.0f}/s"
            )
        return {
            "floor": {"median": median([r["rate"] for r in raw]), "runs": raw},
            "inproc_claim_complete": {"median": median([r["rate"] for r in plain]), "runs": plain},
            "inproc_worker_cycle": {
                "median": median([r["rate"] for r in worker_like]),
                "runs": worker_like,
            },
        }

    def _inproc_loop(self, *, worker_like: bool, seconds: float) -> dict:
        """Claim+complete in this process; ``worker_like`` makes the calls one pmcp_worker
        slot makes for a task when it claims one at a time: a claim with ``kinds`` and a
        client token straight into running (``start=True``, no ``mark_task_running``), then a
        complete with a client token."""
        from parallel_mcp import Orchestrator

        orch = Orchestrator()
        kinds = ["bench.noop"] if worker_like else None
        done = 0
        started = time.perf_counter()
        deadline = started + seconds
        while time.perf_counter() < deadline:
            token = f"claim:{uuid.uuid4()}" if worker_like else None
            claim = orch.claim_next_task(
                worker_id="inproc", kinds=kinds, client_token=token, start=worker_like
            )
            if claim is None:
                break
            ids = {"task_id": claim.task.id, "lease_id": claim.lease.id, "worker_id": "inproc"}
            if worker_like:
                orch.complete_task(**ids, client_token=f"{claim.lease.id}:completed")
            else:
                orch.complete_task(**ids)
            done += 1
        elapsed = time.perf_counter() - started
        close_db()
        return {"cycles": done, "seconds": elapsed, "rate": done / elapsed}

    # -- parallel_mcp beside other job queues (bench/peers) --------------------------------
    def scenario_peers(self) -> dict:
        from .peers.scenario import run

        return run(self)

    # -- run size ------------------------------------------------------------------------------
    def scenario_runsize(self) -> dict:
        from .seed import seed_runs

        shapes = {}
        for runs, per_run in self.plan.runsize_shapes:
            name = f"{runs}x{per_run}"
            snapshot = f"runs-{name}"
            if runs == 1 and per_run == self.plan.tasks:
                self._seed_tput()
                snapshot = f"tput-{self.plan.tasks}"
            else:
                self.seeded(snapshot, lambda r=runs, p=per_run: seed_runs([(r, p)]))
            shapes[name] = self._burn(
                "ours", snapshot, (self.plan.runsize_workers,), f"runsize-{name}"
            )
        medians = {name: s["median"][str(self.plan.runsize_workers)] for name, s in shapes.items()}
        low, high = min(medians.values()), max(medians.values())
        return {
            "workers": self.plan.runsize_workers,
            "median": medians,
            "spread": (high - low) / high if high else float("nan"),
            "shapes": shapes,
        }

    # -- the original's claim bench, our side ---------------------------------------------------
    def scenario_reference(self) -> dict:
        from .seed import seed_runs

        sizes = {}
        for size in self.plan.reference_sizes:
            reps = []
            for _ in range(self.plan.reps):
                self.seeded(f"ref-{size}", lambda s=size: seed_runs([(1, s)]))
                reps.append(
                    self._inproc_loop(worker_like=False, seconds=self.plan.reference_seconds)
                )
            rate = median([r["rate"] for r in reps])
            log(
                f"    {size} tasks in one run: {rate:.0f} cycles/s "
                f"(original {ORIGINAL_REFERENCE[size]:.0f})"
            )
            sizes[str(size)] = {
                "median": rate,
                "original": ORIGINAL_REFERENCE[size],
                "ratio": rate / ORIGINAL_REFERENCE[size],
                "runs": reps,
            }
        return {"sizes": sizes}

    # -- backlog -------------------------------------------------------------------------------
    def _claim_latencies(self, count: int) -> list[float]:
        from parallel_mcp import Orchestrator

        orch = Orchestrator()
        timings = []
        for _ in range(count):
            started = time.perf_counter()
            claim = orch.claim_next_task(worker_id="backlog")
            timings.append((time.perf_counter() - started) * 1000)
            if claim is None:
                raise RuntimeError("backlog: nothing to claim")
        close_db()
        return timings

    def scenario_backlog(self) -> dict:
        from .seed import seed_backlog, seed_runs

        plan = self.plan
        claims = plan.backlog_claims
        name = f"backlog-{plan.backlog_queued}-{plan.backlog_blocked}"
        self.seeded(
            name, lambda: seed_backlog(queued=plan.backlog_queued, blocked=plan.backlog_blocked)
        )
        self.seeded(f"empty-{claims * plan.reps}", lambda: seed_runs([(1, claims * plan.reps)]))
        result: dict[str, Any] = {"queued": plan.backlog_queued, "blocked": plan.backlog_blocked}
        for label, snapshot in (("empty", f"empty-{claims * plan.reps}"), ("backlog", name)):
            self.ws.restore(snapshot)
            reps = []
            for _ in range(plan.reps):
                timings = self._claim_latencies(claims)
                reps.append({"p50": percentile(timings, 50), "p99": percentile(timings, 99)})
            result[label] = {
                "p50": median([r["p50"] for r in reps]),
                "p99": median([r["p99"] for r in reps]),
                "runs": reps,
            }
            log(
                f"    {label}: claim p50 {result[label]['p50']:.2f} ms, "
                f"p99 {result[label]['p99']:.2f} ms"
            )
        result["ratio_p50"] = result["backlog"]["p50"] / result["empty"]["p50"]
        result["ratio_p99"] = result["backlog"]["p99"] / result["empty"]["p99"]
        return result

    # -- enqueue -> claim/start latency ---------------------------------------------------------
    def scenario_latency(self) -> dict:
        modes = ["ours-daemon"]
        if self.ws.vendor == "postgresql":
            modes.append("ours-nolisten")
        result = {}
        for mode in modes:
            name = {"ours-daemon": "notify" if self.ws.vendor == "postgresql" else "poll"}.get(
                mode, "poll"
            )
            result[name] = self._latency(mode)
            r = result[name]
            log(
                f"    {name}: claim p50 {r['claim_p50']:.1f} ms p99 {r['claim_p99']:.1f} ms, "
                f"start p50 {r['start_p50']:.1f} ms p99 {r['start_p99']:.1f} ms, "
                f"idle CPU {r['idle_cpu_percent']:.2f}%"
            )
        return result

    def _latency(self, mode: str) -> dict:
        from django.db.models import Min

        from parallel_mcp import Orchestrator
        from parallel_mcp.models import Attempt, Task

        plan = self.plan
        self.ws.restore("empty")
        orch = Orchestrator()
        run = orch.create_run(namespace="bench-latency")
        # A run whose tasks have all finished is completed and takes no more tasks: one task
        # that is never due (and sorts last) keeps it open.
        orch.enqueue_task(
            run_id=run.id,
            kind="bench.noop",
            priority=-1,
            not_before=datetime(2100, 1, 1, tzinfo=UTC),
        )
        workers = Workers(mode, 1, self.logdir, f"latency-{mode}")
        try:
            workers.wait_started(plan.start_timeout)
            time.sleep(1.0)  # let it settle into its idle poll
            pid = workers.procs[0].pid
            cpu0, wall0 = proc_cpu_seconds(pid), time.monotonic()
            time.sleep(plan.idle_seconds)
            idle_cpu = (proc_cpu_seconds(pid) - cpu0) / (time.monotonic() - wall0) * 100
            count = int(plan.latency_rate * plan.latency_seconds)
            committed = {}  # task id -> when enqueue_task returned (its commit)
            begin = time.monotonic()
            for index in range(count):
                delay = begin + index / plan.latency_rate - time.monotonic()
                if delay > 0:
                    time.sleep(delay)
                task = orch.enqueue_task(run_id=run.id, kind="bench.noop")
                committed[task.id] = datetime.now(UTC)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                if not Task.objects.filter(run_id=run.id, priority=0, started_at=None).exists():
                    break
                time.sleep(0.05)
        finally:
            close_db()
            workers.stop()
        leased = {
            row["task_id"]: row["first"]
            for row in Attempt.objects.filter(run_id=run.id)
            .values("task_id")
            .annotate(first=Min("leased_at"))
        }
        claim_ms, start_ms, commit_claim_ms = [], [], []
        for task_id, created, started in Task.objects.filter(run_id=run.id, priority=0).values_list(
            "id", "created_at", "started_at"
        ):
            # created_at is the enqueue call's start: its own transaction is part of the figure.
            if task_id in leased:
                claim_ms.append((leased[task_id] - created).total_seconds() * 1000)
                commit_claim_ms.append(
                    (leased[task_id] - committed[task_id]).total_seconds() * 1000
                )
            if started is not None:
                start_ms.append((started - created).total_seconds() * 1000)
        close_db()
        return {
            "tasks": count,
            "rate": plan.latency_rate,
            "claimed": len(claim_ms),
            "claim_p50": percentile(claim_ms, 50),
            "claim_p99": percentile(claim_ms, 99),
            "start_p50": percentile(start_ms, 50),
            "start_p99": percentile(start_ms, 99),
            "commit_to_claim_p50": percentile(commit_claim_ms, 50),
            "commit_to_claim_p99": percentile(commit_claim_ms, 99),
            "idle_cpu_percent": idle_cpu,
            **workers.problems(),
        }

    # -- enqueue throughput ---------------------------------------------------------------------
    def scenario_enqueue(self) -> dict:
        from django.conf import settings

        from parallel_mcp import Orchestrator

        plan = self.plan
        orch = Orchestrator()
        single, batch, peer = [], [], []
        for _ in range(plan.reps):
            self.ws.restore("empty")
            run = orch.create_run(namespace="bench-enqueue")
            done, started = 0, time.perf_counter()
            while time.perf_counter() - started < plan.enqueue_seconds:
                orch.enqueue_task(run_id=run.id, kind="bench.noop")
                done += 1
            single.append(done / (time.perf_counter() - started))
            run = orch.create_run(namespace="bench-enqueue")
            items = [{"kind": "bench.noop"}] * plan.enqueue_batch_size
            started = time.perf_counter()
            for _ in range(plan.enqueue_batch_total // plan.enqueue_batch_size):
                orch.enqueue_tasks(run_id=run.id, tasks=items)
            batch.append(plan.enqueue_batch_total / (time.perf_counter() - started))
            if settings.PEER_INSTALLED:
                from .benchapp.tasks import noop

                done, started = 0, time.perf_counter()
                while time.perf_counter() - started < plan.enqueue_seconds:
                    noop.enqueue()
                    done += 1
                peer.append(done / (time.perf_counter() - started))
            close_db()
            log(
                f"    single {single[-1]:.0f}/s, batch of {plan.enqueue_batch_size} "
                f"{batch[-1]:.0f}/s"
                + (f", django-tasks-db single {peer[-1]:.0f}/s" if peer else "")
            )
        return {
            "single": median(single),
            "batch": median(batch),
            "batch_size": plan.enqueue_batch_size,
            "peer_single": median(peer) if peer else None,
            "runs": {"single": single, "batch": batch, "peer_single": peer},
        }

    # -- one big batch, and a claim waiting for it ---------------------------------------------
    def scenario_bigbatch(self) -> dict:
        """One ``enqueue_tasks`` of ``bigbatch_tasks`` tasks in this process (flat, and as a
        binary dependency tree; before them a flat one into the fresh database, reported
        apart), all or nothing in one transaction, while a probe process
        claims and completes tasks of another run one at a time and times each of these
        writes: the longest that overlapped the enqueue is how long the batch held a worker
        up."""
        from parallel_mcp import Orchestrator

        plan = self.plan
        count = plan.bigbatch_tasks
        # "first": the first batch into the freshly restored database, which also grows its
        # WAL file by the batch's size (a database in use keeps its WAL file at its largest);
        # then a flat batch and a dependency tree.
        shapes: dict[str, dict[str, list[float]]] = {
            shape: {"seconds": [], "claim_wait_max": [], "claims_during": []}
            for shape in ("first", "flat", "tree")
        }
        baseline: list[float] = []
        for rep in range(plan.reps):
            self.ws.restore("empty")
            orch = Orchestrator()
            probe_run = orch.create_run(namespace="bench-probe")
            orch.enqueue_tasks(run_id=probe_run.id, tasks=[{"kind": "bench.probe"}] * 5_000)
            close_db()
            out = self.logdir / f"claim-probe-{rep}.json"
            log_file = open(self.logdir / f"claim-probe-{rep}.log", "w")
            probe = subprocess.Popen(
                [sys.executable, "-m", "bench.claim_probe", str(out)],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=REPO,
            )
            windows: dict[str, tuple[float, float]] = {}
            try:
                time.sleep(2.0)  # Django set up, claiming
                for shape in shapes:
                    specs: list[dict[str, Any]] = [
                        {"kind": "bench.noop", "key": f"t{i}"} for i in range(count)
                    ]
                    if shape == "tree":
                        for i in range(1, count):
                            specs[i]["depends_on"] = [f"t{(i - 1) // 2}"]
                    run = orch.create_run(namespace="bench-bigbatch")
                    began, clock = time.time(), time.perf_counter()
                    orch.enqueue_tasks(run_id=run.id, tasks=specs)
                    seconds = time.perf_counter() - clock
                    windows[shape] = (began, began + seconds)
                    shapes[shape]["seconds"].append(seconds)
                    time.sleep(0.5)
            finally:
                probe.send_signal(signal.SIGTERM)
                probe.wait(timeout=60)
                log_file.close()
                close_db()
            timings = json.loads(out.read_text())
            for shape, (start, end) in windows.items():
                during = [d for t, d in timings if t < end and t + d > start]
                shapes[shape]["claim_wait_max"].append(max(during, default=0.0))
                shapes[shape]["claims_during"].append(float(len(during)))
            outside = [
                d
                for t, d in timings
                if not any(t < end and t + d > start for start, end in windows.values())
            ]
            baseline.append(median(outside) if outside else 0.0)
            log(
                "    "
                + ", ".join(
                    f"{shape} {v['seconds'][-1]:.3f} s (a worker's write waited up to "
                    f"{v['claim_wait_max'][-1] * 1000:.0f} ms)"
                    for shape, v in shapes.items()
                )
                + f"; its p50 otherwise {baseline[-1] * 1000:.1f} ms"
            )
        return {
            "tasks": count,
            **{
                shape: {
                    "seconds": median(v["seconds"]),
                    "claim_wait_max": max(v["claim_wait_max"]),
                    "runs": v,
                }
                for shape, v in shapes.items()
            },
            "claim_p50_otherwise": median(baseline),
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True)
    parser.add_argument("--scenarios", required=True)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--logdir", type=Path, required=True)
    args = parser.parse_args(argv)

    import django

    django.setup()
    args.logdir.mkdir(parents=True, exist_ok=True)
    driver = Driver(args.config, QUICK if args.quick else FULL, args.logdir, args.out)
    driver.migrate()
    for scenario in args.scenarios.split(","):
        try:
            driver.run(scenario)
        except Exception as exc:  # noqa: BLE001 - one broken scenario must not lose the others
            import traceback

            traceback.print_exc()
            driver.results["scenarios"][scenario] = {"error": f"{type(exc).__name__}: {exc}"}
            driver.save()
    return 0


if __name__ == "__main__":
    sys.exit(main())

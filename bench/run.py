"""The parallel_mcp benchmark: one command, its own throwaway databases.

    python -m bench.run                       # full: about 10 minutes on 2 cores
    python -m bench.run --quick               # smaller and one repetition: ~2 minutes
    python -m bench.run --only throughput,floor --db sqlite-full
    python -m bench.run --only slots --db sqlite-full  # batched vs single claims

Databases: a SQLite file in WAL mode with ``synchronous=FULL`` (durable) and, separately,
``NORMAL``; a throwaway PostgreSQL cluster (tests/pg_cluster.py) switched to ``fsync=on`` and
``synchronous_commit=on``. Workers are OS processes (``python -m django pmcp_worker --burst
--concurrency 1``; ``--concurrency 8`` with and without batched claims in the "slots"
scenario) running a no-op handler (bench/benchapp). django-tasks-db's ``db_worker`` and a
raw-SQL floor run on the same databases. Each figure is the median of 3 runs (1 with
``--quick``). Prints tables and writes ``bench/results/<timestamp>.json`` (plus a PNG chart when
matplotlib is importable). See bench/README.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from datetime import UTC, datetime
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from .dbs import CONFIGS, durable_cluster, process_env
from .plan import DEFAULT_MATRIX, FULL, ORIGINAL_REFERENCE, QUICK, SCENARIOS

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent


# -- the machine ---------------------------------------------------------------------------------


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _package(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _filesystem(path: Path) -> str:
    """Type of the filesystem holding ``path`` (fsync costs differ: ext4 vs tmpfs)."""
    best, kind = "", "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) > 2 and str(path).startswith(parts[1]) and len(parts[1]) > len(best):
                best, kind = parts[1], parts[2]
    return kind


def _git() -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "parallel_mcp"],
            cwd=REPO,
            capture_output=True,
            text=True,
        ).stdout.strip()
        return f"{head}{' (parallel_mcp/ modified)' if dirty else ''}" if head else None
    return None


def machine(workdir: Path) -> dict[str, Any]:
    import sqlite3

    memory = None
    with contextlib.suppress(OSError, ValueError, IndexError):
        first = Path("/proc/meminfo").read_text().splitlines()[0]
        memory = f"{int(first.split()[1]) / 1024 / 1024:.1f} GiB"
    return {
        "cores": os.cpu_count(),
        "cpu": _cpu_model(),
        "memory": memory,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "django": _package("django"),
        "psycopg": _package("psycopg"),
        "sqlite": sqlite3.sqlite_version,
        "django_tasks": _package("django-tasks"),
        "django_tasks_db": _package("django-tasks-db"),
        "procrastinate": _package("procrastinate"),
        "dbos": _package("dbos"),
        "parallel_mcp": _package("parallel-mcp"),
        "git": _git(),
        "workdir_filesystem": _filesystem(workdir),
    }


def busy_processes() -> list[str]:
    """Other processes using CPU right now (a snapshot from top), to say what the load was."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(
            ["top", "-bn1", "-w", "200"], capture_output=True, text=True, timeout=10
        ).stdout
        rows, seen_header = [], False
        for line in out.splitlines():
            if line.lstrip().startswith("PID"):
                seen_header = True
                continue
            parts = line.split(None, 11)
            if seen_header and len(parts) == 12:
                with contextlib.suppress(ValueError):
                    if float(parts[8]) >= 10 and int(parts[0]) != os.getpid():
                        rows.append(f"{parts[11][:60]} {parts[8]}%")
        return rows
    return []


class ForeignCpu(threading.Thread):
    """Samples, every few seconds, the CPU used by processes that are not the bench's own
    (not descendants of this process, not the bench's PostgreSQL server, not kernel threads):
    the load the figures were taken under, beyond the load average (which counts our workers).
    """

    def __init__(self, interval: float = 3.0) -> None:
        super().__init__(name="foreign-cpu", daemon=True)
        self.interval = interval
        self.samples: list[tuple[float, float, list[str]]] = []  # (time, % of one core, top)
        self.stop = threading.Event()
        self.tick = os.sysconf("SC_CLK_TCK")
        try:
            import pwd

            self.pg_uid = pwd.getpwnam("pmcp_pg").pw_uid
        except (KeyError, ImportError):
            self.pg_uid = -1

    def _snapshot(self) -> dict[int, tuple[int, int, float, str]]:
        procs = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError, ValueError, IndexError):
                raw = (entry / "stat").read_text()
                name = raw[raw.index("(") + 1 : raw.rindex(")")]
                fields = raw.rsplit(")", 1)[1].split()
                ppid, flags = int(fields[1]), int(fields[6])
                cpu = (int(fields[11]) + int(fields[12])) / self.tick
                if flags & 0x00200000:  # PF_KTHREAD
                    continue
                uid = entry.stat().st_uid
                procs[int(entry.name)] = (ppid, uid, cpu, name)
        return procs

    def _ours(self, pid: int, procs: dict) -> bool:
        me = os.getpid()
        seen = 0
        while pid > 1 and seen < 64:
            if pid == me:
                return True
            if procs.get(pid, (0, -2))[1] == self.pg_uid:
                return True
            pid = procs.get(pid, (0,))[0]
            seen += 1
        return False

    def run(self) -> None:
        before = self._snapshot()
        last = time.monotonic()
        while not self.stop.wait(self.interval):
            now_procs, now = self._snapshot(), time.monotonic()
            elapsed = now - last
            total, top = 0.0, []
            for pid, (_ppid, _uid, cpu, name) in now_procs.items():
                if pid in before and not self._ours(pid, now_procs):
                    share = (cpu - before[pid][2]) / elapsed * 100
                    if share > 0:
                        total += share
                        if share >= 10:
                            top.append(f"{name} {share:.0f}%")
            self.samples.append((time.time(), total, top))
            before, last = now_procs, now

    def summary(self, since: float = 0.0, until: float = float("inf")) -> dict[str, Any]:
        values = [s for s in self.samples if since <= s[0] <= until]
        if not values:
            return {"mean_percent": None, "max_percent": None, "busy": []}
        peaks: dict[str, float] = {}
        for sample in values:
            for item in sample[2]:
                name, share = item.rsplit(" ", 1)
                peaks[name] = max(peaks.get(name, 0.0), float(share.rstrip("%")))
        busy = [f"{name} (up to {share:.0f}%)" for name, share in sorted(peaks.items())]
        return {
            "mean_percent": round(sum(v[1] for v in values) / len(values), 1),
            "max_percent": round(max(v[1] for v in values), 1),
            "busy": busy[:10],
        }


def wait_for_quiet(max_load: float, minutes: float) -> list[float]:
    deadline = time.monotonic() + minutes * 60
    while True:
        load = list(os.getloadavg())
        if load[0] <= max_load or time.monotonic() >= deadline:
            if load[0] > max_load:
                print(f"warning: load average {load[0]:.2f} > {max_load}; measuring anyway")
            return [round(x, 2) for x in load]
        print(f"load average {load[0]:.2f} > {max_load}: waiting ({', '.join(busy_processes())})")
        time.sleep(30)


# -- tables --------------------------------------------------------------------------------------


def _fmt(value: Any, digits: int = 0) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        if value != value:  # nan
            return "-"
        return f"{value:,.{digits}f}"
    return str(value)


def _table(title: str, header: list[str], rows: list[list[Any]]) -> str:
    cells = [[str(c) for c in header]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    lines = [f"\n{title}"]
    for index, row in enumerate(cells):
        lines.append(
            "  ".join(
                c.ljust(w) if i == 0 else c.rjust(w)
                for i, (c, w) in enumerate(zip(row, widths, strict=True))
            )
        )
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _scenario(results: dict, config: str, name: str) -> dict | None:
    value = results.get(config, {}).get("scenarios", {}).get(name)
    return value if value and "error" not in value and "skipped" not in value else None


def annotate_slots(results: dict[str, Any]) -> None:
    """Adds to each "slots" result the ratio of its batched figures to the same database's
    throughput figure with one single-slot worker process, when both ran in this bench."""
    for config in results:
        slots = _scenario(results, config, "slots")
        if not slots:
            continue
        tput = _scenario(results, config, "throughput")
        one = tput["median"].get("1") if tput else None
        slots["ratio_batched_vs_throughput_1w"] = {
            n: (rate / one if one else None)
            for n, rate in slots["modes"]["batched"]["median"].items()
        }


def _ratio(value: float | None) -> str:
    return f"{value:.2f}x" if value else "-"


def _cell_title(cell: str) -> str:
    processes, slots = cell.split("x")
    return f"{processes}p x {'1 at a time' if slots == '1' else slots + ' slots'}"


def peers_tables(results: dict[str, Any]) -> list[str]:
    """One table per database: tasks/s of every system per cell (processes x tasks at a
    time per process), the floor, and parallel_mcp / the best peer per cell."""
    tables = []
    for config in results:
        peers = _scenario(results, config, "peers")
        if not peers:
            continue
        cells = peers["cells"]
        rows = []
        for item in peers["systems"].values():
            first = next(iter(item["versions"].values()), "")
            rows.append([f"{item['label']} {first}", *[_fmt(item["median"].get(c)) for c in cells]])
        rows.append(
            [
                "raw-SQL floor (1 process)",
                *[_fmt(peers["floor"]["median"]) if c == "1x1" else "-" for c in cells],
            ]
        )
        rows.append(
            [
                "parallel_mcp / best peer",
                *[
                    f"{_ratio(peers['ratios'][c]['ratio'])} vs "
                    f"{peers['systems'][peers['ratios'][c]['best_peer']]['label']}"
                    if peers["ratios"][c]["ratio"]
                    else "-"
                    for c in cells
                ],
            ]
        )
        title = (
            f"Peers on {config}, tasks/s: {peers['tasks']:,} pre-seeded no-op tasks, medians "
            f"of the interleaved runs ({peers['window']} s window)"
        )
        tables.append(_table(title, ["system", *[_cell_title(c) for c in cells]], rows))
        for name, why in peers["not_measured"].items():
            tables.append(f"  {name}: not measured on {config}: {why}")
    return tables


def variants_tables(results: dict[str, Any]) -> list[str]:
    """Per database: each variant's tasks/s and its ratio to plain tasks (issue 15: >= 0.85)."""
    out = []
    for config in results:
        variants = _scenario(results, config, "variants")
        if not variants:
            continue
        counts = [str(n) for n in variants["processes"]]
        rows = [
            [
                name,
                *[
                    f"{_fmt(rates.get(n))} ({_ratio(variants['vs_plain'][name].get(n))})"
                    for n in counts
                ],
            ]
            for name, rates in variants["median"].items()
        ]
        out.append(
            _table(
                f"Variants on {config}, tasks/s (x plain); {variants['tasks']:,} tasks, "
                f"pmcp_worker --concurrency {variants['concurrency']}",
                ["variant", *[f"{n} process(es)" for n in counts]],
                rows,
            )
        )
    return out


def report(results: dict[str, Any], plan_name: str) -> str:
    plan = QUICK if plan_name == "quick" else FULL
    out = []
    rows = []
    for config in results:
        tput = _scenario(results, config, "throughput")
        floor = _scenario(results, config, "floor")
        ours = tput["median"] if tput else {}
        one = ours.get("1")
        floor_rate = floor["floor"]["median"] if floor else None
        inproc = floor["inproc_claim_complete"]["median"] if floor else None
        worker_cycle = floor["inproc_worker_cycle"]["median"] if floor else None
        if not (tput or floor):
            continue
        capped = any(r["capped"] for rs in (tput or {}).get("runs", {}).values() for r in rs)
        rows.append(
            [
                config + (" *" if capped else ""),
                *[_fmt(ours.get(str(n))) for n in plan.workers],
                _fmt(floor_rate),
                _fmt(inproc),
                _fmt(worker_cycle),
                _fmt(floor_rate / one, 1) + "x" if floor_rate and one else "-",
            ]
        )
    out.append(
        ""
        if not rows
        else _table(
            "Throughput, tasks/s (worker processes, no-op handler; * = window-capped burn-down)",
            [
                "database",
                *[f"ours {n}w" for n in plan.workers],
                "floor 1p",
                "ours inproc c+c",
                "ours inproc worker-cycle",
                "floor/ours1w",
            ],
            rows,
        )
    )
    out.extend(peers_tables(results))
    out.extend(variants_tables(results))

    rows = []
    slots_title = ""
    for config in results:
        slots = _scenario(results, config, "slots")
        if not slots:
            continue
        batched, single = slots["modes"]["batched"], slots["modes"]["single"]
        vs_tput = slots.get("ratio_batched_vs_throughput_1w", {})
        capped = any(
            r["capped"] for mode in (batched, single) for rs in mode["runs"].values() for r in rs
        )
        for n in batched["median"]:
            rows.append(
                [
                    config + (" *" if capped else ""),
                    n,
                    _fmt(batched["median"][n]),
                    _fmt(single["median"][n]),
                    _ratio(slots["ratio_batched_single"].get(n)),
                    _ratio(vs_tput.get(n)),
                ]
            )
        slots_title = (
            f"Slots, tasks/s: pmcp_worker --concurrency {slots['concurrency']}, batched "
            f"(--claim-batch {batched['claim_batch']}) vs single claims (--claim-batch "
            f"{single['claim_batch']}); * = window-capped"
        )
    if rows:
        out.append(
            _table(
                slots_title,
                [
                    "database",
                    "processes",
                    "batched",
                    "single claims",
                    "batched/single",
                    "batched/ours 1w 1 slot",
                ],
                rows,
            )
        )

    rows = []
    for config in results:
        runsize = _scenario(results, config, "runsize")
        if runsize:
            rows.append(
                [config, *[_fmt(v) for v in runsize["median"].values()], f"{runsize['spread']:.0%}"]
            )
            shape_names = list(runsize["median"])
    if rows:
        out.append(
            _table(
                f"Run size, tasks/s with {plan.runsize_workers} worker processes "
                "(target: spread <= 15%)",
                ["database", *[n.replace("x", " x ") for n in shape_names], "spread"],
                rows,
            )
        )

    rows = []
    for config in results:
        ref = _scenario(results, config, "reference")
        if ref:
            for size, item in ref["sizes"].items():
                rows.append(
                    [
                        config,
                        f"{int(size):,}",
                        _fmt(item["original"]),
                        _fmt(item["median"]),
                        f"{item['ratio']:.2f}x",
                    ]
                )
    if rows:
        out.append(
            _table(
                "Claim+complete cycles/s in one process, N tasks in one run "
                "(original: its own bench, SQLite NORMAL)",
                ["database", "tasks", "original", "ours", "ours/original"],
                rows,
            )
        )

    rows = []
    for config in results:
        backlog = _scenario(results, config, "backlog")
        if backlog:
            rows.append(
                [
                    config,
                    _fmt(backlog["empty"]["p50"], 2),
                    _fmt(backlog["empty"]["p99"], 2),
                    _fmt(backlog["backlog"]["p50"], 2),
                    _fmt(backlog["backlog"]["p99"], 2),
                    f"{backlog['ratio_p50']:.2f}x / {backlog['ratio_p99']:.2f}x",
                ]
            )
    if rows:
        out.append(
            _table(
                f"Claim latency, ms (in-process): empty vs {plan.backlog_queued:,} queued + "
                f"{plan.backlog_blocked:,} blocked (target: within 20%)",
                [
                    "database",
                    "empty p50",
                    "empty p99",
                    "backlog p50",
                    "backlog p99",
                    "ratio p50 / p99",
                ],
                rows,
            )
        )

    rows = []
    for config in results:
        latency = _scenario(results, config, "latency")
        for mode, item in (latency or {}).items():
            if not isinstance(item, dict):
                continue
            rows.append(
                [
                    f"{config} {mode}",
                    _fmt(item["claim_p50"], 1),
                    _fmt(item["claim_p99"], 1),
                    _fmt(item["start_p50"], 1),
                    _fmt(item["start_p99"], 1),
                    f"{_fmt(item.get('commit_to_claim_p50'), 1)} / "
                    f"{_fmt(item.get('commit_to_claim_p99'), 1)}",
                    _fmt(item["idle_cpu_percent"], 2),
                ]
            )
    if rows:
        out.append(
            _table(
                f"Enqueue -> claim / start latency, ms, {plan.latency_rate:.0f} tasks/s arriving, "
                "one worker",
                [
                    "database",
                    "claim p50",
                    "claim p99",
                    "start p50",
                    "start p99",
                    "commit->claim p50 / p99",
                    "idle CPU %",
                ],
                rows,
            )
        )

    rows = []
    for config in results:
        enqueue = _scenario(results, config, "enqueue")
        if enqueue:
            rows.append(
                [
                    config,
                    _fmt(enqueue["single"]),
                    _fmt(enqueue["batch"]),
                    _fmt(enqueue["peer_single"]),
                ]
            )
    if rows:
        out.append(
            _table(
                "Enqueue throughput, tasks/s",
                [
                    "database",
                    "ours enqueue_task",
                    f"ours enqueue_tasks ({plan.enqueue_batch_size})",
                    "dtdb enqueue",
                ],
                rows,
            )
        )

    rows = []
    for config in results:
        big = _scenario(results, config, "bigbatch")
        if big and "first" in big:
            rows.append(
                [
                    config,
                    *[
                        f"{big[shape]['seconds']:.3f} s / "
                        f"{big[shape]['claim_wait_max'] * 1000:.0f} ms"
                        for shape in ("first", "flat", "tree")
                    ],
                    f"{big['claim_p50_otherwise'] * 1000:.1f} ms",
                ]
            )
    if rows:
        out.append(
            _table(
                f"One enqueue_tasks of {plan.bigbatch_tasks:,} tasks (median) / the longest "
                "claim or completion of another process that overlapped it (max)",
                [
                    "database",
                    "first (fresh database)",
                    "flat",
                    "dependency tree",
                    "their p50 otherwise",
                ],
                rows,
            )
        )
    return "\n".join(out)


def targets(results: dict[str, Any], plan_name: str) -> list[dict[str, Any]]:
    """The issue's targets, each with the measured value and whether it is met."""
    checks: list[dict[str, Any]] = []

    def add(what: str, measured: Any, goal: str, ok: bool | None) -> None:
        checks.append({"target": what, "measured": measured, "goal": goal, "met": ok})

    sq = _scenario(results, "sqlite-full", "throughput")
    if sq:
        low = min(sq["median"].get(str(n), 0.0) for n in (1, 2, 4) if str(n) in sq["median"])
        add("SQLite FULL 1-4 workers", round(low), ">= 1,500 tasks/s", low >= 1500)
        if "8" in sq["median"]:
            add(
                "SQLite FULL 8 workers",
                round(sq["median"]["8"]),
                ">= 1,200 tasks/s",
                sq["median"]["8"] >= 1200,
            )
        locked = sum(r["tracebacks"] for rs in sq["runs"].values() for r in rs)
        add(
            "SQLite unhandled 'database is locked'",
            locked,
            "0 tracebacks in worker logs",
            locked == 0,
        )
    pg = _scenario(results, "postgres", "throughput")
    if pg:
        four = pg["median"].get("4")
        if four is not None:
            add("PostgreSQL 4 workers", round(four), ">= 1,000 tasks/s", four >= 1000)
        peak = max(pg["median"].values())
        if "8" in pg["median"] and peak:
            share = pg["median"]["8"] / peak
            add("PostgreSQL 8 workers vs peak", f"{share:.0%}", ">= 80%", share >= 0.8)
    for config, limit in (("sqlite-full", 2.0), ("postgres", 1.5)):
        floor = _scenario(results, config, "floor")
        tput = _scenario(results, config, "throughput")
        if floor and tput and tput["median"].get("1"):
            ratio = floor["floor"]["median"] / tput["median"]["1"]
            add(
                f"{config}: floor / ours (1 worker)",
                f"{ratio:.1f}x",
                f"<= {limit}x",
                ratio <= limit,
            )
    for config in ("sqlite-full", "postgres"):
        runsize = _scenario(results, config, "runsize")
        if runsize:
            add(
                f"{config}: run-size spread",
                f"{runsize['spread']:.0%}",
                "<= 15%",
                runsize["spread"] <= 0.15,
            )
        backlog = _scenario(results, config, "backlog")
        if backlog:
            worst = max(backlog["ratio_p50"], backlog["ratio_p99"])
            add(
                f"{config}: backlog claim latency vs empty",
                f"{worst:.2f}x",
                "<= 1.20x",
                worst <= 1.2,
            )
    ref = _scenario(results, "sqlite-normal", "reference")
    if ref:
        for size, item in ref["sizes"].items():
            add(
                f"beat the original at {int(size):,} tasks/run",
                f"{item['median']:.0f} vs {item['original']:.0f}",
                "> original",
                item["median"] > item["original"],
            )
    latency = _scenario(results, "postgres", "latency")
    if latency and "notify" in latency:
        n = latency["notify"]
        add(
            "PostgreSQL NOTIFY enqueue->claim p50",
            f"{n['claim_p50']:.1f} ms",
            "<= 5 ms",
            n["claim_p50"] <= 5,
        )
        add(
            "PostgreSQL NOTIFY enqueue->claim p99",
            f"{n['claim_p99']:.1f} ms",
            "<= 20 ms",
            n["claim_p99"] <= 20,
        )
    latency = _scenario(results, "sqlite-full", "latency")
    if latency and "poll" in latency:
        p = latency["poll"]
        add(
            "SQLite poll enqueue->claim p50",
            f"{p['claim_p50']:.1f} ms",
            "<= 30 ms",
            p["claim_p50"] <= 30,
        )
        add(
            "SQLite poll enqueue->claim p99",
            f"{p['claim_p99']:.1f} ms",
            "<= 60 ms",
            p["claim_p99"] <= 60,
        )
        add(
            "SQLite idle worker CPU",
            f"{p['idle_cpu_percent']:.2f}%",
            "<= 2% of a core",
            p["idle_cpu_percent"] <= 2,
        )
    return checks


def chart(results: dict[str, Any], plan_name: str, path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    plan = QUICK if plan_name == "quick" else FULL
    fig, ax = plt.subplots(figsize=(9, 5))
    for config in results:
        tput = _scenario(results, config, "throughput")
        if tput:
            xs = [n for n in plan.workers if str(n) in tput["median"]]
            ax.plot(xs, [tput["median"][str(n)] for n in xs], marker="o", label=f"ours {config}")
        peers = _scenario(results, config, "peers")
        for name, item in (peers or {}).get("systems", {}).items():
            if name == "pmcp":
                continue
            points = [
                (int(cell.split("x")[0]), rate)
                for cell, rate in item["median"].items()
                if cell.endswith("x1") and rate
            ]
            if points:
                ax.plot(*zip(*points, strict=True), marker="s", linestyle="--",
                        label=f"{item['label']} (1 at a time) {config}")  # fmt: skip
        slots = _scenario(results, config, "slots")
        if slots:
            for mode, marker, style in (("batched", "^", "-."), ("single", "v", ":")):
                median = slots["modes"][mode]["median"]
                xs = [int(n) for n in median]
                ax.plot(xs, list(median.values()), marker=marker, linestyle=style,
                        label=f"ours x{slots['concurrency']} slots {mode} {config}")  # fmt: skip
        floor = _scenario(results, config, "floor")
        if floor:
            ax.scatter([1], [floor["floor"]["median"]], marker="*", s=120, label=f"floor {config}")
    ax.set_xlabel("worker processes")
    ax.set_ylabel("tasks/s")
    ax.set_xscale("log", base=2)
    ax.set_title("parallel_mcp throughput (no-op tasks)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


# -- main ------------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="smaller, one repetition (~2 min)")
    parser.add_argument(
        "--only", metavar="SCENARIO[,…]", help=f"only these scenarios: {', '.join(SCENARIOS)}"
    )
    parser.add_argument(
        "--db", metavar="CONFIG[,…]", help=f"only these databases: {', '.join(CONFIGS)}"
    )
    parser.add_argument(
        "--wait-quiet",
        type=float,
        default=0.0,
        metavar="MINUTES",
        help="wait up to this long for the load average to drop below --max-load (default 0)",
    )
    parser.add_argument("--max-load", type=float, default=1.5)
    parser.add_argument("--results", type=Path, default=BENCH / "results")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where the SQLite files and logs go (default: a temporary directory on disk)",
    )
    parser.add_argument("--keep", action="store_true", help="keep the work directory and logs")
    args = parser.parse_args(argv)
    args.scenarios = _names(args.only, SCENARIOS, "--only")
    args.configs = _names(args.db, tuple(CONFIGS), "--db")
    return args


def _names(value: str | None, known: tuple[str, ...], flag: str) -> list[str]:
    if not value:
        return list(known)
    names = [v.strip() for v in value.split(",") if v.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"{flag}: unknown {', '.join(unknown)}; known: {', '.join(known)}")
    return names


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    plan_name = "quick" if args.quick else "full"
    started = time.monotonic()
    load_start = wait_for_quiet(args.max_load, args.wait_quiet)
    busy = busy_processes()
    base = args.workdir or Path("/var/tmp" if Path("/var/tmp").is_dir() else tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="pmcp-bench-", dir=base))
    info = machine(workdir)
    print(
        f"parallel_mcp bench ({plan_name}): {info['cores']} cores, {info['cpu']}; "
        f"python {info['python']}, django {info['django']}, sqlite {info['sqlite']}; "
        f"load {load_start}" + (f"; busy: {', '.join(busy)}" if busy else "")
    )
    print(f"work directory {workdir} ({info['workdir_filesystem']})")
    matrix = {
        config: [s for s in DEFAULT_MATRIX[config] if s in args.scenarios]
        for config in args.configs
    }
    matrix = {config: scenarios for config, scenarios in matrix.items() if scenarios}
    results: dict[str, Any] = {}
    notes: list[str] = []
    sampler = ForeignCpu()
    sampler.start()
    try:
        with contextlib.ExitStack() as stack:
            pg_env = None
            if "postgres" in matrix:
                try:
                    pg_env = stack.enter_context(durable_cluster())
                    info["postgres"] = pg_env.get("PMCP_BENCH_PG_SETTINGS")
                except Exception as exc:  # noqa: BLE001 - no server: bench SQLite alone
                    notes.append(f"PostgreSQL skipped: {exc}")
                    matrix.pop("postgres")
            for config_name, scenarios in matrix.items():
                config = CONFIGS[config_name]
                print(f"\n== {config.label}: {', '.join(scenarios)}", flush=True)
                out = workdir / f"{config_name}.json"
                env = process_env(config, workdir, pg_env)
                command = [
                    sys.executable, "-m", "bench.driver", "--config", config_name,
                    "--scenarios", ",".join(scenarios), "--out", str(out),
                    "--logdir", str(workdir / "logs" / config_name),
                ] + (["--quick"] if args.quick else [])  # fmt: skip
                config_started = time.time()
                code = subprocess.call(command, cwd=REPO, env=env)
                if out.exists():
                    results[config_name] = json.loads(out.read_text())
                    results[config_name]["label"] = config.label
                    results[config_name]["foreign_cpu"] = sampler.summary(
                        config_started, time.time()
                    )
                    print(f"other processes' CPU during {config_name}: "
                          f"{results[config_name]['foreign_cpu']}")  # fmt: skip
                if code:
                    notes.append(f"{config_name}: driver exited with {code}")
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)

    sampler.stop.set()
    foreign = sampler.summary()
    elapsed = time.monotonic() - started
    annotate_slots(results)
    text = report(results, plan_name)
    checks = targets(results, plan_name)
    print(text)
    print(
        f"\nOther processes used {foreign['mean_percent']}% of a core on average "
        f"(max {foreign['max_percent']}%) during the bench"
        + (f"; busy: {', '.join(foreign['busy'])}" if foreign["busy"] else "")
    )
    if checks:
        print(
            _table(
                "Targets of issue 9",
                ["target", "measured", "goal", "met"],
                [
                    [
                        c["target"],
                        c["measured"],
                        c["goal"],
                        {True: "yes", False: "NO", None: "-"}[c["met"]],
                    ]
                    for c in checks
                ],
            )
        )
    for note in notes:
        print(f"note: {note}")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    args.results.mkdir(parents=True, exist_ok=True)
    document = {
        "when": stamp,
        "plan": plan_name,
        "seconds": round(elapsed, 1),
        "machine": info,
        "load": {
            "start": load_start,
            "end": [round(x, 2) for x in os.getloadavg()],
            "busy_at_start": busy,
            "foreign_cpu": foreign,
        },
        "original_reference": ORIGINAL_REFERENCE,
        "results": results,
        "targets": checks,
        "notes": notes,
        "table": text,
    }
    path = args.results / f"{stamp}.json"
    path.write_text(json.dumps(document, indent=2, default=str))
    print(f"\nwrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    if chart(results, plan_name, path.with_suffix(".png")):
        print(f"wrote {path.with_suffix('.png').name}")
    print(f"bench took {elapsed / 60:.1f} min")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The "peers" scenario: parallel_mcp and the other job queues (bench/peers/systems.py) burn
down the same number of pre-seeded no-op tasks on the same database.

Each system is measured with 1 and 4 worker processes (1 with ``--quick``), each running one
task at a time and then its best concurrency per process (8 slots), over the same
steady-state window as the rest of the bench. Systems, cells and repetitions are interleaved
(every repetition goes through every cell, and every cell through every system, in an order
that rotates per repetition), so a change in the machine's load hits all of them alike. The
raw-SQL floor (bench/floor.py, one process, one task at a time) runs once per repetition.
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from .systems import SYSTEMS, System, seed_command, versions

if TYPE_CHECKING:
    from bench.driver import Driver


def cell_key(processes: int, slots: int) -> str:
    return f"{processes}x{slots}"


def _seed(driver: Driver, system: System, tasks: int) -> str:
    """The snapshot every run of ``system`` starts from, seeding it the first time."""
    from bench.driver import REPO, close_db, log

    name = f"peers-{system.name}-{tasks}"
    if system.name == "pmcp":
        from bench.seed import seed_runs

        driver.seeded(name, lambda: seed_runs([(1, tasks)]))
        return name
    if driver.ws.has(name):
        return name
    started = time.monotonic()
    driver.ws.restore("blank")
    path = driver.logdir / f"seed-{system.name}.log"
    with path.open("w") as out:
        code = subprocess.call(
            seed_command(system, tasks),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=REPO,
            env=system.process_env(dict(os.environ)),
            timeout=900,
        )
    if code:
        tail = path.read_text(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"seeding exited with {code}: {' / '.join(tail)}")
    driver.ws.analyze()
    close_db()
    driver.ws.snapshot(name)
    log(f"seeded {name} in {time.monotonic() - started:.1f}s")
    return name


def _measure(
    driver: Driver, system: System, processes: int, slots: int, tasks: int, label: str
) -> dict[str, Any]:
    from bench.driver import Workers, _steady_rate, close_db, loadavg

    plan = driver.plan
    load = loadavg()
    workers = Workers(
        system.name,
        processes,
        driver.logdir,
        label,
        command=lambda worker_id: system.command(worker_id, slots),
        marker=system.marker,
        env=system.process_env(dict(os.environ)),
    )
    try:
        started_ok = workers.wait_started(plan.start_timeout)
        go = time.monotonic()
        while workers.running() and time.monotonic() - go < plan.peers_window:
            time.sleep(0.05)
        stop = datetime.now(UTC)
        running = workers.running()
        # Before the workers stop: procrastinate forgets which worker ran a job when the
        # worker unregisters.
        firsts = system.firsts()
        close_db()
    finally:
        workers.stop()
    completions = system.completions()
    close_db()
    result = _steady_rate(firsts, completions, capped=running, stop=stop, total=tasks)
    result.update(
        capped=running and len(completions) < tasks,
        all_started=started_ok,
        load_before=load,
        **workers.problems(),
    )
    return result


def run(driver: Driver) -> dict[str, Any]:
    from bench import floor
    from bench.driver import close_db, log, median

    plan = driver.plan
    tasks = plan.peers_tasks
    engine = "postgres" if driver.ws.vendor == "postgresql" else "sqlite"
    cells = [(p, s) for p in plan.peers_processes for s in plan.peers_slots]
    systems: list[System] = []
    skipped: dict[str, str] = {}
    described: dict[str, dict[str, Any]] = {}
    for system in SYSTEMS.values():
        if engine not in system.engines:
            skipped[system.name] = system.not_on[engine]
            continue
        found, why = versions(system)
        if found is None:
            skipped[system.name] = why or "unavailable"
            log(f"    {system.label}: skipped ({skipped[system.name]})")
            continue
        described[system.name] = {
            "label": system.label,
            "versions": found,
            "python": found.pop("python", platform.python_version()),
            "settings": system.settings,
            "no_slots": system.no_slots or None,
        }
        systems.append(system)

    snapshots: dict[str, str] = {}
    for system in list(systems):
        try:
            snapshots[system.name] = _seed(driver, system, tasks)
        except Exception as exc:  # noqa: BLE001 - a peer that cannot seed is reported, not fatal
            skipped[system.name] = f"{type(exc).__name__}: {exc}"
            log(f"    {system.label}: skipped ({skipped[system.name]})")
            systems.remove(system)
            described.pop(system.name)

    runs: dict[str, dict[str, list[dict]]] = {s.name: {} for s in systems}
    floor_runs: list[dict] = []
    for rep in range(plan.reps):
        driver.ws.restore("blank")
        floor_runs.append(floor.measure(count=tasks, seconds=plan.inproc_seconds))
        close_db()
        log(f"    floor rep {rep + 1}: {floor_runs[-1]['rate']:.0f} tasks/s")
        shift = rep % len(systems) if systems else 0
        order = systems[shift:] + systems[:shift]
        for processes, slots in cells:
            key = cell_key(processes, slots)
            for system in order:
                if slots > 1 and not system.multi_slot:
                    continue
                driver.ws.restore(snapshots[system.name])
                label = f"peers-{system.name}-{processes}p-{slots}s-r{rep}"
                result = _measure(driver, system, processes, slots, tasks, label)
                runs[system.name].setdefault(key, []).append(result)
                problems = ""
                if result["tracebacks"] or any(result["exit_codes"]):
                    problems = f"; exit codes {result['exit_codes']}, see {label}-*.log"
                log(
                    f"    {system.label} {processes}p x {slots} rep {rep + 1}: "
                    f"{result['rate']:.0f} tasks/s ({result['done']} in {result['window']}s"
                    f"{', capped' if result['capped'] else ''}; load "
                    f"{result['load_before'][0]}{problems})"
                )

    for system in systems:
        item = described[system.name]
        item["runs"] = runs[system.name]
        item["median"] = {
            cell_key(p, s): (
                median([r["rate"] for r in runs[system.name][cell_key(p, s)]])
                if cell_key(p, s) in runs[system.name]
                else None
            )
            for p, s in cells
        }
    return {
        "tasks": tasks,
        "window": plan.peers_window,
        "cells": [cell_key(p, s) for p, s in cells],
        "order": [s.name for s in systems],
        "systems": described,
        "not_measured": skipped,
        "floor": {"median": median([r["rate"] for r in floor_runs]), "runs": floor_runs},
        "ratios": ratios(described, [cell_key(p, s) for p, s in cells]),
    }


def ratios(described: dict[str, dict[str, Any]], cells: list[str]) -> dict[str, Any]:
    """Per cell: parallel_mcp's median / the best peer's median (and which peer that is)."""
    out: dict[str, Any] = {}
    ours = described.get("pmcp", {}).get("median", {})
    for cell in cells:
        peers = [
            (item["median"].get(cell), name)
            for name, item in described.items()
            if name != "pmcp" and item["median"].get(cell)
        ]
        best = max(peers) if peers else (None, None)
        mine = ours.get(cell)
        out[cell] = {
            "pmcp": mine,
            "best_peer": best[1],
            "best_rate": best[0],
            "ratio": (mine / best[0]) if mine and best[0] else None,
        }
    return out

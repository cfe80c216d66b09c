"""Handlers the worker tests run (discovered like any app's pmcp_handlers module)."""

from __future__ import annotations

import os
import time
from pathlib import Path

from parallel_mcp import Completed, Failed, Paused, Released, handler


def _mark(ctx, what: str) -> None:
    """Append a line to the file named by input["marker"], so tests in another process can
    see what a handler did."""
    marker = (ctx.input or {}).get("marker")
    if marker:
        with Path(marker).open("a") as out:
            out.write(f"{what} {ctx.task.id} pid={os.getpid()}\n")


@handler("test.echo")
def echo(ctx):
    _mark(ctx, "ran")
    return {"echo": ctx.input, "attempt": ctx.task.attempt_count}


@handler("test.sleep")
def sleep(ctx):
    """Sleep input["seconds"], stopping early if told to; reports whether it was cancelled."""
    _mark(ctx, "started")
    cancelled = ctx.cancelled.wait((ctx.input or {}).get("seconds", 1))
    _mark(ctx, f"cancelled:{ctx.cancel_reason}" if cancelled else "finished")
    return {"slept": not cancelled}


@handler("test.stubborn")
def stubborn(ctx):
    """Ignores cancellation: sleeps the full input["seconds"]."""
    _mark(ctx, "started")
    time.sleep((ctx.input or {}).get("seconds", 1))
    _mark(ctx, "finished")
    return "done"


@handler("test.raise")
def boom(ctx):
    raise ValueError(f"boom on attempt {ctx.task.attempt_count}")


@handler("test.flaky")
def flaky(ctx):
    """Fails (raises) until attempt input["succeed_on"]."""
    if ctx.task.attempt_count < (ctx.input or {}).get("succeed_on", 2):
        raise ConnectionError("transient")
    return {"succeeded_on": ctx.task.attempt_count}


@handler("test.failed")
def failed(ctx):
    return Failed(
        error="handler said no",
        retry=(ctx.input or {}).get("retry", False),
        metadata={"why": "test"},
    )


@handler("test.pause")
def pause(ctx):
    if (ctx.input or {}).get("resumed"):
        return "resumed"
    return Paused(status="waiting_input", reason="need an answer")


@handler("test.release")
def release(ctx):
    return Released(reason="not now")


@handler("test.context")
def context(ctx):
    seen = ctx.context
    return Completed(
        output={"seen": seen},
        next_context={"step": (seen or {}).get("step", 0) + 1},
        next_context_label="test.context.next",
    )


@handler("test.aggregate")
def aggregate(ctx):
    """Fan-in through ``ctx.orchestrator`` reads (local or over the API): its dependencies'
    outputs with get_task, the run's tasks with list_run_tasks."""
    echoed = [
        ctx.orchestrator.get_task(task_id=task_id).output["echo"]
        for task_id in ctx.task.depends_on_task_ids
    ]
    tasks = ctx.orchestrator.list_run_tasks(run_id=ctx.run.id)
    return {
        "echoed": echoed,
        "completed_keys": sorted(t.key for t in tasks if t.status == "completed"),
        "unknown": ctx.orchestrator.get_task(task_id=ctx.run.id),  # not a task: None
    }


@handler("test.progress")
def progress(ctx):
    ctx.report_progress(0.5, "half way")
    ctx.heartbeat()
    return None


@handler("test.bad_output")
def bad_output(ctx):
    return {"not json": object()}


# -- added for the worker process tests (tests/test_worker_*.py) ------------------------------


def _marker_text(ctx) -> str:
    marker = (ctx.input or {}).get("marker")
    if not marker or not Path(marker).exists():
        return ""
    return Path(marker).read_text()


@handler("test.slow_on_worker")
def slow_on_worker(ctx):
    """Sleeps input["seconds"] (stopping early if told to) when run by the worker named
    input["slow_worker"]; any other worker finishes it at once. For crash tests: the attempt
    that gets killed is slow, its retry elsewhere is quick."""
    _mark(ctx, "started")
    if ctx.worker_id == (ctx.input or {}).get("slow_worker"):
        ctx.cancelled.wait((ctx.input or {}).get("seconds", 1))
    _mark(ctx, "finished")
    return {"by": ctx.worker_id}


@handler("test.release_once")
def release_once(ctx):
    """Released the first time it runs (remembered in the marker file), completed after."""
    if f"released {ctx.task.id}" not in _marker_text(ctx):
        _mark(ctx, "released")
        return Released(reason="not yet")
    _mark(ctx, "ran")
    return {"after_release": True}


@handler("test.rendezvous")
def rendezvous(ctx):
    """Waits until input["parties"] tasks have written "started" to the shared marker file
    (up to input["timeout"] seconds): only tasks that run at the same time can all meet."""
    _mark(ctx, "started")
    parties = (ctx.input or {}).get("parties", 2)
    deadline = time.monotonic() + (ctx.input or {}).get("timeout", 10)
    met = False
    while time.monotonic() < deadline and not ctx.cancelled.is_set():
        if _marker_text(ctx).count("started ") >= parties:
            met = True
            break
        time.sleep(0.02)
    _mark(ctx, "finished")
    return {"met": met}


@handler("test.failed_empty")
def failed_empty(ctx):
    """A failure the orchestrator cannot store (an empty error, e.g. ``str(exc)`` of an
    exception without a message)."""
    return Failed(error="")

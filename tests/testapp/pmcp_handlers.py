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


@handler("test.progress")
def progress(ctx):
    ctx.report_progress(0.5, "half way")
    ctx.heartbeat()
    return None


@handler("test.bad_output")
def bad_output(ctx):
    return {"not json": object()}

"""No-op handlers: the benchmark measures the queue, not the work."""

from __future__ import annotations

from parallel_mcp import Completed, handler


@handler("bench.noop")
def noop(ctx):
    return None


@handler("bench.metadata")
def with_metadata(ctx):
    """A completion that merges metadata into the task (the "variants" scenario)."""
    return Completed(metadata={"bench": True})


@handler("bench.context")
def with_context(ctx):
    """A completion that records a context snapshot for its run (the "variants" scenario)."""
    return Completed(next_context={"done": str(ctx.task.id)})

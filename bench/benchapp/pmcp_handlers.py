"""No-op handlers: the benchmark measures the queue, not the work."""

from __future__ import annotations

from parallel_mcp import handler


@handler("bench.noop")
def noop(ctx):
    return None

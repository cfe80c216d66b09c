"""procrastinate's no-op task, async as its docs recommend for concurrent sub-workers."""

from __future__ import annotations

from procrastinate.contrib.django import app


@app.task(name="bench.noop")
async def noop() -> None:
    return None

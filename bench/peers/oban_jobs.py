"""Oban's no-op worker (jobs name it by import path: ``bench.peers.oban_jobs.Noop``)."""

from __future__ import annotations

from oban import worker


@worker(queue="default")
class Noop:
    async def process(self, job) -> None:
        return None

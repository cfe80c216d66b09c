"""Racing threads against one database: the one way the tests start them."""

from __future__ import annotations

import threading
from collections.abc import Callable

from django.db import connections


def race(count: int, body: Callable[[str], None], *, timeout: float = 120) -> None:
    """Run ``body(name)`` in ``count`` threads named ``t0``, ``t1``, … released together (a
    barrier), each closing its own database connections when done; return once all have
    ended. A thread still running after ``timeout`` seconds fails the test."""
    barrier = threading.Barrier(count)

    def contender(name: str) -> None:
        try:
            barrier.wait()
            body(name)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=contender, args=(f"t{n}",)) for n in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    stuck = [thread.name for thread in threads if thread.is_alive()]
    assert not stuck, f"threads still running after {timeout} s: {stuck}"

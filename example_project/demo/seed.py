"""Create the demo run: a fan-out/fan-in DAG plus a flaky task and one that waits for input."""

from __future__ import annotations

from parallel_mcp import Orchestrator


def seed_demo_run(orchestrator: Orchestrator, *, fetches: int = 8, namespace: str = "demo"):
    """Create a run and enqueue its whole graph in one batch::

        parse ──> fetch-page-01 … fetch-page-N ──> aggregate
        flaky     (fails once, retried after 1 s)
        approve   (waits for an operator)

    The run starts with a context; parse adds its plan to it (``next_context``), and each
    fetch task reads the plan from ``ctx.context``, the run's current context when it is
    claimed.
    """
    items = [f"page-{index:02d}" for index in range(1, fetches + 1)]
    fetch_keys = [f"fetch-{item}" for item in items]
    with orchestrator.transaction():
        run = orchestrator.create_run(
            namespace=namespace,
            metadata={"seeded_by": "example_project/demo.py", "fetches": fetches},
            context={"job": "count the words of a document"},
        )
        orchestrator.enqueue_tasks(
            run_id=run.id,
            tasks=[
                {
                    "kind": "demo.parse",
                    "key": "parse",
                    "priority": 10,
                    "input": {"items": items},
                },
                *(
                    {
                        "kind": "demo.fetch",
                        "key": key,
                        "input": {"item": item},
                        "depends_on": ["parse"],  # a key of this batch
                        "max_attempts": 3,
                        "retry": {"delay_ms": 500, "backoff": "exponential"},
                        "timeout_ms": 10_000,
                    }
                    for key, item in zip(fetch_keys, items, strict=True)
                ),
                {"kind": "demo.aggregate", "key": "aggregate", "depends_on": fetch_keys},
                {
                    "kind": "demo.flaky",
                    "key": "flaky",
                    "max_attempts": 3,
                    "retry": {"delay_ms": 1_000, "backoff": "fixed"},
                },
                {
                    "kind": "demo.approve",
                    "key": "approve",
                    "input": {"question": "publish the word count?"},
                },
            ],
        )
    return orchestrator.get_run(run_id=run.id)

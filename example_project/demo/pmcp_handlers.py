"""The demo's task handlers. The worker imports every installed app's ``pmcp_handlers``
module at start-up (like ``admin.py``), so ``@handler`` is all it takes to register one.

The run they make up (see ``seed.py``): ``demo.parse`` plans the work and passes it on through
the run context; N ``demo.fetch`` tasks run in parallel and report progress; ``demo.aggregate``
combines their outputs once all of them completed; ``demo.flaky`` fails on its first attempt
and is retried; ``demo.approve`` waits for an operator.

The MCP tools (served by ``pmcp_mcp``; README.md, "Your own MCP tools, as durable tasks"):
``count_words`` fans out into ``demo.fetch_page`` tasks and adds up their word counts;
``review_pages`` does the same, then asks the MCP client whether to publish
(docs/mcp-tasks.md, "Walkthrough").
"""

from __future__ import annotations

import random

from parallel_mcp import Completed, Failed, Paused, Released, handler
from parallel_mcp.mcp import tool


@handler("demo.parse")
def parse(ctx):
    """Plan the work, and hand the plan to later tasks as a new run context snapshot."""
    items = list((ctx.input or {}).get("items", []))
    if not items:
        return Failed(error="nothing to do: input has no items")
    ctx.cancelled.wait(0.3)  # pretend to read a document
    # ctx.context is the run's current context: here the one the run was created with.
    context = {**(ctx.context or {}), "plan": {"items": items, "planned_by": ctx.worker_id}}
    return Completed(
        output={"items": len(items)},
        next_context=context,
        next_context_label="demo.parse.completed",
    )


@handler("demo.fetch")
def fetch(ctx):
    """Fetch one item of the plan: 0.2 to 0.8 s of work in four steps, reporting progress."""
    item = (ctx.input or {}).get("item")
    # The run's current context when this task was claimed: parse's snapshot, since a fetch
    # task is claimed only after parse completed.
    plan = (ctx.context or {}).get("plan") or {}
    if item not in plan.get("items", ()):
        return Failed(error=f"{item!r} is not in the plan of the run context")
    steps = 4
    seconds = random.uniform(0.2, 0.8)
    for step in range(1, steps + 1):
        if ctx.cancelled.wait(seconds / steps):  # stop promptly on drain or cancellation
            return Released(reason=f"stopped: {ctx.cancel_reason}")
        ctx.report_progress(step / steps, f"{item}: chunk {step} of {steps}")
    words = random.Random(item).randint(100, 999)  # the same "content" on every run
    return {"item": item, "words": words, "seconds": round(seconds, 2), "worker": ctx.worker_id}


@handler("demo.aggregate")
def aggregate(ctx):
    """Combine the outputs of the fetch tasks this task depends on."""
    outputs = [
        ctx.orchestrator.get_task(task_id=task_id).output
        for task_id in ctx.task.depends_on_task_ids
    ]
    summary = {
        "items": len(outputs),
        "words": sum(output["words"] for output in outputs),
        "slowest_seconds": max(output["seconds"] for output in outputs),
        "workers": sorted({output["worker"] for output in outputs}),
    }
    return Completed(
        output=summary,
        next_context={**(ctx.context or {}), "summary": summary},
        next_context_label="demo.aggregate.completed",
    )


@handler("demo.flaky")
def flaky(ctx):
    """Fails on its first attempt. An exception is a failure that is retried (after the
    task's retry delay) because the task has max_attempts; the second attempt succeeds."""
    if ctx.task.attempt_count < 2:
        raise ConnectionError(f"simulated network blip on attempt {ctx.task.attempt_count}")
    return {"succeeded_on_attempt": ctx.task.attempt_count}


@handler("demo.approve")
def approve(ctx):
    """Waits for an operator: pauses as ``waiting_input`` until the operator answers with
    ``resume_task(task_id=…, input={…, "answer": …})``; the next claim then finds the answer
    in its input."""
    question = (ctx.input or {}).get("question", "approve?")
    answer = (ctx.input or {}).get("answer")
    if answer is None:
        return Paused(status="waiting_input", reason=f"waiting for an operator: {question}")
    return {"question": question, "answer": answer}


# -- MCP tools (README.md; docs/mcp-tasks.md, "Walkthrough") ---------------------------------
# `pmcp_mcp` serves them; each call is a run. Both fan out (one demo.fetch_page task per page,
# run in parallel by the workers); review_pages then asks the MCP client whether to publish.
PUBLISH_QUESTION = {
    "type": "object",
    "properties": {"publish": {"type": "boolean", "title": "Publish the summary?"}},
    "required": ["publish"],
}


# A fetch task that ended in one of these will not change any more.
FINISHED = ("completed", "failed", "cancelled")


def fetched_words(ctx, pages: list[str]) -> dict[str, int] | Paused | Failed:
    """The word count of each page, once the run's demo.fetch_page tasks are done; on the
    tool's first run, the pause that creates them and waits for all of them. A fetch that
    failed or was cancelled keeps the tool blocked until an operator re-executes it, or
    resumes the tool (then it has no output: the tool fails, naming the pages)."""
    orch = ctx.orchestrator
    fetched = [t for t in orch.list_run_tasks(run_id=ctx.run.id) if t.kind == "demo.fetch_page"]
    if not fetched:
        if not pages:  # nothing to fetch (blocked_by must name at least one task)
            return {}
        created = orch.enqueue_tasks(
            run_id=ctx.run.id,
            tasks=[{"kind": "demo.fetch_page", "input": page} for page in pages],
        )
        return Paused("blocked", reason="fetching pages", blocked_by=[t.id for t in created])
    unfinished = [task.id for task in fetched if task.status not in FINISHED]
    if unfinished:  # resumed early by an operator: wait for the rest
        return Paused("blocked", reason="fetching pages", blocked_by=unfinished)
    lost = [task.input for task in fetched if task.status != "completed"]
    if lost:
        return Failed(error=f"pages not fetched (failed or cancelled): {', '.join(lost)}")
    return {task.input: task.output for task in fetched}


@tool("count_words", task="optional")
def count_words(ctx, pages: list[str]) -> dict:
    """Fetch the pages in parallel and count their words."""
    words = fetched_words(ctx, pages)
    if isinstance(words, Paused | Failed):
        return words
    return {"words": words, "total": sum(words.values())}


@tool("review_pages", task="optional")
def review_pages(ctx, pages: list[str]) -> dict:
    """Fetch the pages in parallel, count their words, then ask whether to publish."""
    words = fetched_words(ctx, pages)
    if isinstance(words, Paused | Failed):
        return words
    answer = ctx.input_responses.get("publish")
    if answer is None:  # fetched: ask the caller (answered through tasks/update)
        message = f"Fetched {len(words)} pages, {sum(words.values())} words. Publish?"
        return Paused(
            "waiting_input",
            input_requests={
                "publish": {
                    "method": "elicitation/create",
                    "params": {
                        "mode": "form",
                        "message": message,
                        "requestedSchema": PUBLISH_QUESTION,
                    },
                }
            },
        )
    content = answer.get("content") or {}
    published = answer.get("action") == "accept" and content.get("publish") is True
    return {"words": words, "total": sum(words.values()), "published": published}


@handler("demo.fetch_page")
def fetch_page(ctx):
    """One page of count_words or review_pages: its word count (the same on every run)."""
    ctx.cancelled.wait(0.1)  # pretend to fetch it
    return random.Random(ctx.input).randint(100, 999)

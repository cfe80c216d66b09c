"""The fan-out tools users copy: docs/mcp-tasks.md's "Fanning out" example and the example
project's ``count_words``, run by a real worker (in process, ``--burst``) against the
database: no children to fan out, a child that fails for good (the call says it is stalled;
resumed, the tool ends with a tool error naming it), and the happy path."""

from __future__ import annotations

import functools
import runpy
from pathlib import Path

import pytest
from django.db import connections

import parallel_mcp
import parallel_mcp.mcp
from parallel_mcp import Orchestrator
from parallel_mcp.mcp.declare import ToolArgumentsError, ToolRegistry, tool
from parallel_mcp.mcp.task_state import task_object
from parallel_mcp.mcp.task_tools import read_state
from parallel_mcp.services.tool_calls import start_tool_call
from parallel_mcp.worker.loop import Worker
from parallel_mcp.worker.registry import HandlerRegistry, handler
from tests.docs_support import EXAMPLE, REPO, code_blocks

pytestmark = pytest.mark.django_db(transaction=True)


class Project:
    """Tools and handlers declared into registries of their own, run by a burst worker."""

    def __init__(self) -> None:
        self.tools, self.handlers = ToolRegistry(), HandlerRegistry()
        self.tool = functools.partial(tool, registry=self.tools, handlers=self.handlers)
        self.handler = functools.partial(handler, registry=self.handlers)
        self.orch = Orchestrator()

    def call(self, name: str, **arguments) -> str:
        definition = self.tools.get(name)
        created = start_tool_call(
            using="default",
            tool=name,
            kind=definition.kind,
            input=definition.task_input(arguments),
            principal="local",
            ttl_ms=None,
        )
        return str(created.run_id)

    def work(self, kinds: list[str] | None = None) -> None:
        """Run everything claimable (of ``kinds``), until nothing is."""
        worker = Worker(
            registry=self.handlers, kinds=kinds, burst=True, listen=False, poll_max_ms=50
        )
        try:
            assert worker.run() == 0
        finally:
            connections.close_all()

    def seen(self, run_id: str) -> dict:
        return task_object(read_state("default", run_id, "local"))

    def tool_task(self, run_id: str):
        return next(t for t in self.orch.list_run_tasks(run_id=run_id) if t.key == "tool")


@pytest.fixture
def docs_squares() -> Project:
    """The page's ``squares`` tool, and a ``demo.square`` handler that fails for 2."""
    project = Project()
    (block,) = [
        b
        for b in code_blocks(REPO / "docs" / "mcp-tasks.md", section="Fanning out")
        if b.lang == "python"
    ]
    source = block.text.replace("from parallel_mcp.mcp import tool\n", "")
    # As a module of its own: without this file's `from __future__ import annotations`.
    exec(compile(source, block.where, "exec", dont_inherit=True), {"tool": project.tool})

    @project.handler("demo.square")
    def square(ctx):
        if ctx.input == 2:
            raise ValueError("2 is unlucky")
        return ctx.input * ctx.input

    return project


def test_the_documented_fan_out_with_nothing_to_fan_out_answers_at_once(docs_squares):
    run_id = docs_squares.call("squares", n=0)
    docs_squares.work()
    shown = docs_squares.seen(run_id)
    assert shown["status"] == "completed"
    assert shown["result"]["structuredContent"] == {"total": 0}


@pytest.mark.parametrize("n", [10**30, 1001, -1])
def test_the_documented_fan_out_refuses_a_size_beyond_its_bound_before_anything_is_created(
    docs_squares, n
):
    with pytest.raises(ToolArgumentsError, match=r"^Invalid arguments for squares: n: "):
        docs_squares.call("squares", n=n)
    assert docs_squares.orch.list_runs() == []
    schema = docs_squares.tools.get("squares").input_schema["properties"]["n"]
    assert (schema["minimum"], schema["maximum"]) == (0, 1000)  # what the client is shown


def test_the_documented_fan_out_gathers_its_children(docs_squares):
    run_id = docs_squares.call("squares", n=2)
    docs_squares.work()
    assert docs_squares.seen(run_id)["result"]["structuredContent"] == {"total": 0 + 1}


def test_a_failed_child_stalls_the_documented_fan_out_until_an_operator_acts(docs_squares):
    orch = docs_squares.orch
    run_id = docs_squares.call("squares", n=4)
    docs_squares.work()
    (failed,) = [t for t in orch.list_run_tasks(run_id=run_id) if t.status == "failed"]
    shown = docs_squares.seen(run_id)
    assert shown["status"] == "working"
    assert shown["statusMessage"].startswith(
        f"Stalled: blocked by task {failed.id} (demo.square), which failed: "
    )
    assert "2 is unlucky" in shown["statusMessage"]
    # The operator resumes the tool's task: it finds the child without output and says so.
    orch.resume_task(task_id=docs_squares.tool_task(run_id).id)
    docs_squares.work()
    shown = docs_squares.seen(run_id)
    assert shown["status"] == "completed" and shown["result"]["isError"] is True
    assert f"1 of 4 squares did not complete: {failed.id}" in shown["result"]["content"][0]["text"]


def test_a_tool_resumed_before_its_children_finished_waits_for_the_rest(docs_squares):
    orch = docs_squares.orch
    run_id = docs_squares.call("squares", n=3)
    claim = orch.claim_next_task(worker_id="w", kinds=["mcp.tool.squares"])
    # The tool's first run (its fan-out) played here, then resumed at once by an operator.
    children = orch.enqueue_tasks(
        run_id=run_id, tasks=[{"kind": "demo.square", "input": i} for i in (0, 1, 3)]
    )
    orch.pause_task(
        task_id=claim.task.id,
        lease_id=claim.lease.id,
        worker_id="w",
        status="blocked",
        blocked_by=[c.id for c in children],
    )
    orch.resume_task(task_id=claim.task.id)
    docs_squares.work()
    assert docs_squares.seen(run_id)["result"]["structuredContent"] == {"total": 0 + 1 + 9}


@pytest.fixture
def demo(monkeypatch) -> Project:
    """The example project's handlers and tools, declared into a Project's registries."""
    project = Project()
    monkeypatch.setattr(parallel_mcp.mcp, "tool", project.tool)
    monkeypatch.setattr(parallel_mcp, "handler", project.handler, raising=False)
    runpy.run_path(str(Path(EXAMPLE) / "demo" / "pmcp_handlers.py"))
    return project


def test_the_example_projects_fan_out_with_no_pages_answers_at_once(demo):
    run_id = demo.call("count_words", pages=[])
    demo.work()
    shown = demo.seen(run_id)
    assert shown["status"] == "completed", shown
    assert shown["result"]["structuredContent"] == {"words": {}, "total": 0}


def test_the_example_projects_fan_out_counts_the_words_of_each_page(demo):
    run_id = demo.call("count_words", pages=["home", "about"])
    demo.work()
    words = demo.seen(run_id)["result"]["structuredContent"]["words"]
    assert set(words) == {"home", "about"} and all(count >= 100 for count in words.values())


def test_the_example_projects_fan_out_names_the_pages_it_could_not_fetch(demo):
    orch = demo.orch
    run_id = demo.call("count_words", pages=["home", "about"])
    demo.work(kinds=["mcp.tool.count_words"])  # fans out, fetches nothing yet
    about = next(t for t in orch.list_run_tasks(run_id=run_id) if t.input == "about")
    orch.cancel_task(task_id=about.id)
    demo.work()
    assert demo.seen(run_id)["statusMessage"].startswith(
        f"Stalled: blocked by task {about.id} (demo.fetch_page), which was cancelled."
    )
    orch.resume_task(task_id=demo.tool_task(run_id).id)
    demo.work()
    result = demo.seen(run_id)["result"]
    assert result["isError"] is True
    assert "pages not fetched (failed or cancelled): about" in result["content"][0]["text"]

"""README.md's Python quick start, pasted into the REPL as the README says, in a database that
already holds other work: it runs, prints what the README shows, and can be pasted again."""

from __future__ import annotations

import pytest

from parallel_mcp import Orchestrator
from tests.docs_support import REPO, code_blocks, is_module_file, paste_all

pytestmark = pytest.mark.django_db

README = REPO / "README.md"


@pytest.fixture
def other_work():
    """Queued work of someone else, ahead of the quick start's in claim order."""
    orch = Orchestrator()
    run = orch.create_run(namespace="elsewhere")
    return orch.enqueue_task(run_id=run.id, kind="report.build", priority=100)


def quick_start():
    (block,) = code_blocks(README, lang="python", section="Python quick start")
    return block


def test_the_quick_start_leaves_other_queued_work_alone(other_work):
    """And the next section's enqueue continues the same session."""
    (enqueue,) = [
        block
        for block in code_blocks(README, lang="python", section="Run a worker")
        if not is_module_file(block)
    ]
    namespace: dict = {}
    paste_all([quick_start(), enqueue], namespace, check_output=True)
    assert [task.key for task in namespace["orch"].list_pending_tasks(kinds=["resume.parse"])] == [
        "parse"
    ]
    other_work.refresh_from_db()
    assert other_work.status == "queued" and other_work.attempt_count == 0


def test_the_quick_start_can_be_pasted_again_in_the_same_database(other_work):
    paste_all([quick_start()], {}, check_output=True)
    paste_all([quick_start()], {}, check_output=True)

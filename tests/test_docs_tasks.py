"""docs/django-tasks.md's example as a user runs it: the module saved as ``myapp/tasks.py``,
the enqueue pasted into the shell, a real ``pmcp_worker --burst`` (which imports the module),
then the result read back. The task runs exactly once."""

from __future__ import annotations

import os

import pytest
from django.test import override_settings

from parallel_mcp.models import Attempt, Run
from tests import tasks_settings
from tests.docs_support import REPO, PasteConsole, code_blocks, is_module_file
from tests.workers import kill_leftover_processes, start_worker  # noqa: F401 - autouse fixture

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.django_entry,
]

PAGE = REPO / "docs" / "django-tasks.md"


def test_the_example_enqueues_once_and_a_worker_runs_it_once(tmp_path, monkeypatch):
    module, enqueue, read = code_blocks(PAGE, lang="python", section="An example")
    assert is_module_file(module) and module.first_line == "# myapp/tasks.py"
    assert not is_module_file(enqueue) and not is_module_file(read)
    package = tmp_path / "myapp"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tasks.py").write_text(module.text + "\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    console = PasteConsole({})
    with override_settings(TASKS=tasks_settings.TASKS):
        console.paste(enqueue, check_output=True)
        assert Run.objects.filter(namespace="django.tasks").count() == 1

        pythonpath = os.pathsep.join([str(tmp_path), str(REPO), os.environ.get("PYTHONPATH", "")])
        worker = start_worker(
            "--burst", "--settings=tests.tasks_settings", env={"PYTHONPATH": pythonpath}
        )
        assert worker.finish(60) == 0, worker.describe()

        printed = console.paste(read, check_output=True)
    assert printed == "SUCCESSFUL {'sent': True}\n"
    run = Run.objects.get(namespace="django.tasks")  # importing the module enqueued nothing
    assert (run.status, run.tasks_total) == ("completed", 1)
    assert Attempt.objects.filter(run=run).count() == 1

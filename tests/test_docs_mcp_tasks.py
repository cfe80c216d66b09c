"""docs/mcp-tasks.md's walkthrough as shown: the example project's ``pmcp_worker`` and
``pmcp_mcp --transport http`` (the commands of the page), then the page's ``review.py`` run
as a file, printing what the page shows."""

from __future__ import annotations

import ast
import os
import subprocess
import sys

import pytest

from tests.docs_support import EXAMPLE, MANAGE, REPO, code_blocks, example_env, manage
from tests.mcp_support import LiveServer

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_entry,
    pytest.mark.skipif(
        os.environ.get("PMCP_TEST_DB") == "postgres",
        reason="the example project runs on its own SQLite file",
    ),
]

PAGE = REPO / "docs" / "mcp-tasks.md"
SECTION = "Walkthrough: a tool that fans out and asks"
DOC_URL = "http://127.0.0.1:8765/mcp"


def test_the_walkthrough_runs_as_shown(tmp_path):
    setup, script, run, output = code_blocks(PAGE, section=SECTION)
    assert (setup.lang, script.lang, run.lang, output.lang) == ("bash", "python", "bash", "text")
    # The processes the page starts (the test starts its own, on a free port).
    assert "python manage.py pmcp_worker &" in setup.text
    assert "python manage.py pmcp_mcp --transport http --port 8765" in setup.text
    assert run.text.strip() == "python review.py"

    env = example_env(tmp_path / "walkthrough.sqlite3")
    manage("migrate", "--noinput", env=env)
    worker = subprocess.Popen(
        [sys.executable, str(MANAGE), "pmcp_worker"],
        cwd=EXAMPLE,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = LiveServer("--allow-unauthenticated", project=(MANAGE, env))
    try:
        file = tmp_path / "review.py"
        file.write_text(script.text.replace(DOC_URL, server.url))
        result = subprocess.run(
            [sys.executable, str(file)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        server.stop()
        worker.terminate()
        worker.wait(30)
    assert result.returncode == 0, result.stderr
    printed, shown = result.stdout.strip().splitlines(), output.text.strip().splitlines()
    assert printed[0] == shown[0]
    assert ast.literal_eval(printed[1]) == ast.literal_eval(shown[1])

"""The example project's MCP tools used from a real MCP client, as the pages show it:
docs/mcp-tasks.md's walkthrough and README.md's "Your own MCP tools, as durable tasks". Each
starts the example project's ``pmcp_worker`` and ``pmcp_mcp --transport http`` (the commands of
the page), then runs the page's client script as a file and compares what it prints with the
page's output."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

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

DOC_URL = "http://127.0.0.1:8765/mcp"


def run_as_shown(page: Path, section: str, tmp_path: Path) -> tuple[list[str], list[str]]:
    """The section's client script run against the example project, as its bash blocks
    start it: (the lines it printed, the lines the page shows)."""
    setup, script, run, output = code_blocks(page, section=section)
    assert (setup.lang, script.lang, run.lang, output.lang) == ("bash", "python", "bash", "text")
    # The processes the page starts (the test starts its own, on a free port).
    assert "cd example_project" in setup.text
    assert "python manage.py pmcp_worker &" in setup.text
    assert "python manage.py pmcp_mcp --transport http --port 8765" in setup.text
    name = script.text.splitlines()[0].removeprefix("# ").strip()
    assert run.text.strip() == f"python {name}"

    env = example_env(tmp_path / "example.sqlite3")
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
        file = tmp_path / name
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
    return result.stdout.strip().splitlines(), output.text.strip().splitlines()


def same_line(printed: str, shown: str) -> bool:
    """Equal, or the same Python literal (a dict printed in another key order)."""
    if printed == shown:
        return True
    try:
        return ast.literal_eval(printed) == ast.literal_eval(shown)
    except (ValueError, SyntaxError):
        return False


def test_the_walkthrough_runs_as_shown(tmp_path):
    printed, shown = run_as_shown(
        REPO / "docs" / "mcp-tasks.md", "Walkthrough: a tool that fans out and asks", tmp_path
    )
    assert len(printed) == len(shown) and all(map(same_line, printed, shown)), printed


def test_the_readme_uses_the_fan_out_and_the_asking_tool_as_shown(tmp_path):
    printed, shown = run_as_shown(
        REPO / "README.md", "Your own MCP tools, as durable tasks", tmp_path
    )
    assert len(printed) == len(shown) and all(map(same_line, printed, shown)), printed

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


def run_as_shown(
    page: Path, section: str, tmp_path: Path, *, tokens: bool = False
) -> tuple[list[str], list[str]]:
    """The section's client script run against the example project, as its bash blocks
    start it: (the lines it printed, the lines the page shows). With ``tokens``, the page
    creates a user and a token and starts a server that requires tokens; the script reads
    the token from ``PMCP_TOKEN``, as the page exports it."""
    setup, script, run, output = [
        block for block in code_blocks(page, section=section) if block.lang != "sh"
    ]
    assert (setup.lang, script.lang, run.lang, output.lang) == ("bash", "python", "bash", "text")
    # The processes the page starts (the test starts its own, on a free port).
    assert "python manage.py pmcp_worker &" in setup.text
    name = script.text.splitlines()[0].removeprefix("# ").strip()
    assert run.text.strip() == f"python {name}"

    env = example_env(tmp_path / "example.sqlite3")
    manage("migrate", "--noinput", env=env)
    if tokens:
        assert "python manage.py pmcp_mcp --transport http --port 8765 &" in setup.text
        assert "python manage.py createsuperuser --username alice" in setup.text
        assert (
            "export PMCP_TOKEN=$(python manage.py pmcp_token create --user alice --name fastmcp "
            "--role full)" in setup.text
        )
        manage(
            "createsuperuser", "--noinput", "--username", "alice", "--email", "a@example.com",
            env={**env, "DJANGO_SUPERUSER_PASSWORD": "correct horse battery"},
        )  # fmt: skip
        created = manage(
            "pmcp_token", "create", "--user", "alice", "--name", "fastmcp", "--role", "full",
            env=env,
        )  # fmt: skip
        env = {**env, "PMCP_TOKEN": created.stdout.strip()}
        server_options: tuple[str, ...] = ()
    else:
        assert "cd example_project" in setup.text
        assert "python manage.py pmcp_mcp --transport http --port 8765" in setup.text
        server_options = ("--allow-unauthenticated",)
    worker = subprocess.Popen(
        [sys.executable, str(MANAGE), "pmcp_worker"],
        cwd=EXAMPLE,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    server = LiveServer(*server_options, project=(MANAGE, env))
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


def test_the_fastmcp_client_with_a_token_runs_as_shown(tmp_path):
    printed, shown = run_as_shown(
        REPO / "docs" / "mcp-tasks.md", "From a Python client: fastmcp", tmp_path, tokens=True
    )
    assert len(printed) == len(shown) and all(map(same_line, printed, shown)), printed


def test_the_fastmcp_client_without_the_token_is_refused(tmp_path):
    """What the page says a client without ``auth=`` gets from a server requiring tokens."""
    (script,) = [
        b
        for b in code_blocks(
            REPO / "docs" / "mcp-tasks.md", section="From a Python client: fastmcp"
        )
        if b.lang == "python"
    ]
    assert 'Client("http://127.0.0.1:8765/mcp", auth=token, ' in script.text
    env = example_env(tmp_path / "example.sqlite3")
    manage("migrate", "--noinput", env=env)
    manage(
        "createsuperuser", "--noinput", "--username", "alice", "--email", "a@example.com",
        env={**env, "DJANGO_SUPERUSER_PASSWORD": "correct horse battery"},
    )  # fmt: skip
    manage("pmcp_token", "create", "--user", "alice", "--name", "t", "--role", "full", env=env)
    server = LiveServer(project=(MANAGE, env))
    try:
        file = tmp_path / "client.py"
        file.write_text(script.text.replace(DOC_URL, server.url).replace("auth=token, ", ""))
        result = subprocess.run(
            [sys.executable, str(file)],
            cwd=tmp_path,
            env={**env, "PMCP_TOKEN": "unused"},
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        server.stop()
    assert result.returncode != 0
    assert "ExceptionGroup" in result.stderr, result.stderr
    assert "MCPError: Server returned an error response" in result.stderr, result.stderr

"""docs/api.md against a live ``runserver`` of the example project: the walkthrough, command by
command as the page shows it (users, permissions, tokens, curl), then every runnable example of
the reference sections with the walkthrough's variables, and the token commands."""

from __future__ import annotations

import json
import os

import pytest

from tests.docs_support import (
    EXAMPLE,
    REPO,
    code_blocks,
    example_env,
    live_server,
    manage,
    run_steps,
    shell_steps,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_entry,
    pytest.mark.skipif(
        os.environ.get("PMCP_TEST_DB") == "postgres",
        reason="the example project runs on its own SQLite file",
    ),
]

PAGE = REPO / "docs" / "api.md"
REFERENCE_SECTIONS = ("Runs", "Tasks", "Events", "Maintenance", "The worker protocol")
DOC_ADDRESS = "http://127.0.0.1:8000"
# `python manage.py` is the example project's, whatever the directory the steps run in.
PREAMBLE = (
    f'python() {{ if [ "${{1:-}}" = manage.py ]; then shift; '
    f'command python {EXAMPLE / "manage.py"} "$@"; else command python "$@"; fi; }}'
)


def walkthrough_steps():
    blocks = code_blocks(PAGE, lang="bash", section="Walkthrough")
    server, *rest = blocks
    assert "python manage.py runserver" in server.text  # the test runs its own
    return shell_steps(rest)


def reference_steps():
    """The examples of the reference sections that run as they are: no placeholder (…), no
    endless event stream."""
    steps = [
        step
        for section in REFERENCE_SECTIONS
        for step in shell_steps(code_blocks(PAGE, lang="bash", section=section))
    ]
    return [
        step
        for step in steps
        if step.command.startswith("curl")
        and "…" not in step.command
        and " -N " not in step.command
    ]


@pytest.fixture
def server(tmp_path):
    env = example_env(tmp_path / "api.sqlite3")
    manage("migrate", "--noinput", env=env)
    with live_server(env) as url:
        yield env, url


def localize(steps, url):
    for step in steps:
        step.command = step.command.replace(DOC_ADDRESS, url)
    return steps


def test_the_walkthrough_and_the_reference_examples_work_as_shown(server, tmp_path):
    env, url = server
    walkthrough = localize(walkthrough_steps(), url)
    reference = reference_steps()
    assert len(reference) >= 25
    run_steps([*walkthrough, *reference], env=env, cwd=tmp_path, preamble=PREAMBLE)

    requests = [(step, request) for step in walkthrough for request in step.requests]
    assert len(requests) >= 10
    for step in walkthrough:
        shown = "\n".join(step.shown)
        if shown.startswith("{"):  # a refusal the page shows
            assert json.loads(step.stdout) == json.loads(shown), step.command
            assert [status for status, *_ in step.requests] == [403], step.command
        else:
            assert all(200 <= status < 300 for status, *_ in step.requests), (
                step.command,
                step.requests,
                step.stdout,
            )
            if shown:
                assert step.stdout.strip() == shown, step.command

    # $T is an operator's token: no reference example is refused (or breaks the server)
    first = reference[0]
    assert "-X POST $B/runs " in first.command and first.requests[0][0] == 201
    for step in reference:
        statuses = [status for status, *_ in step.requests]
        assert len(statuses) == 1 and statuses[0] not in (401, 403), (step.command, step.stdout)
        assert statuses[0] < 500, (step.command, step.stdout)


def test_the_pmcp_token_commands_of_the_page_run(server, tmp_path):
    """After the walkthrough's users exist: the Authentication section's commands."""
    env, url = server
    users = [step for step in localize(walkthrough_steps(), url) if "<<" in step.command]
    (tokens,) = [
        block
        for block in code_blocks(PAGE, lang="bash", section="Authentication")
        if "pmcp_token" in block.text
    ]
    *commands, revoke = shell_steps([tokens])
    assert " revoke " in revoke.command and " list" in commands[-1].command
    run_steps([*users, *commands], env=env, cwd=tmp_path, preamble=PREAMBLE)
    listing = commands[-1].stdout.splitlines()
    assert listing[0].split()[:4] == ["PREFIX", "USER", "ROLE", "STATE"]
    assert [line.split()[2:4] for line in listing[1:]] == [
        ["worker", "active"],
        ["read", "active"],
        ["full", "active"],
    ]
    prefix = listing[1].split()[0]  # the page revokes by a prefix `list` showed
    revoke.command = revoke.command.replace("3f2a9c81d0b4", prefix)
    run_steps([revoke], env=env, cwd=tmp_path, preamble=PREAMBLE)
    assert "revoked" in manage("pmcp_token", "list", env=env).stdout.splitlines()[1]

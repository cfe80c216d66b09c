"""``pmcp_worker`` and ``pmcp_expire_leases`` on the command line: output, exit codes,
option checking and ``--help``."""

from __future__ import annotations

import re
import signal
from datetime import timedelta

import pytest
from django.core.management import load_command_class
from django.utils import timezone

from parallel_mcp import Orchestrator
from parallel_mcp.models import Task
from tests.workers import (
    DEFAULT_TIMEOUT,
    kill_leftover_processes,  # noqa: F401 - autouse fixture
    run_command,
    start_command,
    wait_until,
)

pytestmark = pytest.mark.slow


def _expired_leases(orch: Orchestrator, count: int) -> list:
    """``count`` tasks claimed with leases that ran out a minute ago."""
    run = orch.create_run(namespace="expiry")
    past = timezone.now() - timedelta(minutes=1)
    ids = []
    for _ in range(count):
        task = orch.enqueue_task(run_id=run.id, kind="test.echo", now=past)
        orch.claim_next_task(worker_id="gone", lease_ms=1000, now=past)
        ids.append(task.id)
    return ids


# -- pmcp_expire_leases -------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_expire_leases_once_prints_the_count_and_the_ids():
    orch = Orchestrator()
    expired = _expired_leases(orch, 2)
    live = orch.enqueue_task(run_id=orch.create_run().id, kind="test.echo")
    orch.claim_next_task(worker_id="alive", lease_ms=60_000)

    code, out, err = run_command("pmcp_expire_leases", "--once")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "expired 2 lease(s)"
    assert sorted(line.strip() for line in lines[1:]) == sorted(str(i) for i in expired)
    assert all(line.startswith("  ") for line in lines[1:])
    for task_id in expired:
        task = Task.objects.get(pk=task_id)
        assert (task.status, task.lease_id) == ("queued", None)
    assert Task.objects.get(pk=live.id).status == "leased"

    code, out, err = run_command("pmcp_expire_leases", "--once")
    assert (code, out.strip()) == (0, "expired 0 lease(s)"), err


@pytest.mark.django_db(transaction=True)
def test_expire_leases_loops_until_sigterm():
    orch = Orchestrator()
    looper = start_command("pmcp_expire_leases", "--interval-ms", "100")
    (task_id,) = _expired_leases(orch, 1)
    wait_until(lambda: Task.objects.get(pk=task_id).status == "queued", alive=[looper])
    # It says at once that it runs, how often, and on which database.
    assert "lease expiry started: a pass every 100 ms on database 'default'" in looper.err
    looper.send_signal(signal.SIGTERM)
    assert looper.finish(timeout=10) == 0, looper.describe()
    assert looper.out.strip() == "expired 1 lease(s)"


# -- bad options --------------------------------------------------------------------------------

BAD_OPTIONS = [
    ("pmcp_worker", ["--concurrency", "0"], "--concurrency"),
    ("pmcp_worker", ["--concurrency", "x"], "--concurrency"),
    ("pmcp_worker", ["--concurrency", "-2"], "--concurrency"),
    ("pmcp_worker", ["--kinds", ""], "--kinds"),
    ("pmcp_worker", ["--kinds", "test.echo,,test.sleep"], "--kinds"),
    ("pmcp_worker", ["--kinds", "nosuchkind"], "nosuchkind"),
    ("pmcp_worker", ["--lease-ms", "-5"], "--lease-ms"),
    ("pmcp_worker", ["--lease-ms", "0"], "--lease-ms"),
    ("pmcp_worker", ["--lease-ms", "1.5"], "--lease-ms"),
    ("pmcp_worker", ["--drain-timeout-ms", "-1"], "--drain-timeout-ms"),
    ("pmcp_worker", ["--worker-id", " "], "--worker-id"),
    ("pmcp_expire_leases", ["--interval-ms", "0"], "--interval-ms"),
    ("pmcp_expire_leases", ["--interval-ms", "soon"], "--interval-ms"),
    ("pmcp_expire_leases", ["--once", "--interval-ms", "-1"], "--interval-ms"),
]


def test_bad_options_exit_non_zero_with_a_one_line_command_error():
    """All cases in one test, a few processes at a time (each case is a process start-up)."""
    processes = []
    for command, args, names in BAD_OPTIONS:
        if len(processes) >= 3:
            processes[-3][-1].wait(DEFAULT_TIMEOUT)
        processes.append((command, args, names, start_command(command, *args)))
    problems = []
    for command, args, names, process in processes:
        code = process.finish()
        err = process.err.strip()
        label = f"{command} {' '.join(repr(a) for a in args)}"
        if code == 0:
            problems.append(f"{label}: exit 0")
        if len(err.splitlines()) != 1 or not err.startswith("CommandError: "):
            problems.append(f"{label}: stderr is not one CommandError line: {err!r}")
        if "Traceback" in err:
            problems.append(f"{label}: traceback on stderr")
        if names not in err:
            problems.append(f"{label}: message does not name {names!r}: {err!r}")
        if process.out:
            problems.append(f"{label}: wrote to stdout: {process.out!r}")
    assert not problems, "\n".join(problems)


def test_unknown_kind_message_lists_the_registered_kinds():
    code, _, err = run_command("pmcp_worker", "--kinds", "test.echo,nosuchkind")
    assert code != 0
    assert "nosuchkind" in err
    assert "test.echo" in err and "test.sleep" in err  # what could have been meant


# -- --help -------------------------------------------------------------------------------------


def _words(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@pytest.mark.parametrize(
    ("command", "options"),
    [
        (
            "pmcp_worker",
            [
                "--concurrency",
                "--kinds",
                "--worker-id",
                "--lease-ms",
                "--drain-timeout-ms",
                "--burst",
            ],
        ),
        ("pmcp_expire_leases", ["--interval-ms", "--once"]),
    ],
)
def test_help_lists_each_option_with_its_help_text(command, options):
    code, out, err = run_command(command, "--help")
    assert code == 0, err
    shown = _words(out)
    parser = load_command_class("parallel_mcp", command).create_parser("django", command)
    actions = {option: action for action in parser._actions for option in action.option_strings}
    for option in options:
        action = actions[option]
        assert action.help, f"{option} has no help text"
        assert option in shown
        assert _words(action.help % {"default": action.default}) in shown, option
    assert _words(load_command_class("parallel_mcp", command).help) in shown


# -- handlers from settings ---------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_a_worker_runs_handlers_named_in_settings():
    orch = Orchestrator()
    run = orch.create_run(namespace="settings")
    task = orch.enqueue_task(run_id=run.id, kind="settings.echo", input={"via": "settings"})
    handlers = {"settings.echo": "tests.testapp.pmcp_handlers.echo"}
    code, _, err = run_command(
        "pmcp_worker",
        "--burst",
        "--kinds",
        "settings.echo",
        settings={"PARALLEL_MCP": {"HANDLERS": handlers}},
    )
    assert code == 0, err
    task = Task.objects.get(pk=task.id)
    assert (task.status, task.output) == ("completed", {"echo": {"via": "settings"}, "attempt": 1})


@pytest.mark.parametrize(
    ("handlers", "expected"),
    [
        (
            {"settings.bad": "tests.testapp.pmcp_handlers.no_such_handler"},
            ["ImproperlyConfigured", "'settings.bad'", "no_such_handler", "cannot be imported"],
        ),
        (
            {"test.echo": "tests.testapp.pmcp_handlers.sleep"},
            ["DuplicateHandlerError", "'test.echo'", "pmcp_handlers.echo", "pmcp_handlers.sleep"],
        ),
    ],
    ids=["bad-path", "duplicate-kind"],
)
def test_bad_handler_settings_stop_the_worker_at_start_up(handlers, expected):
    code, _, err = run_command(
        "pmcp_worker", "--burst", settings={"PARALLEL_MCP": {"HANDLERS": handlers}}
    )
    assert code != 0, err
    for text in expected:
        assert text in err, err
    assert "started" not in err  # it never got as far as running

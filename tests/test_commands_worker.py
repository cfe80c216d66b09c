"""``pmcp_worker`` and ``pmcp_expire_leases`` on the command line: output, exit codes,
option checking and ``--help``."""

from __future__ import annotations

import re
import signal
from datetime import timedelta
from pathlib import Path

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

pytestmark = [pytest.mark.slow, pytest.mark.django_entry]


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
    assert not any(str(task_id) in err for task_id in expired)  # said once, on stdout
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
    ("pmcp_worker", ["--lease-expiry-interval-ms", "0"], "--lease-expiry-interval-ms"),
    ("pmcp_worker", ["--lease-expiry-interval-ms", "x"], "--lease-expiry-interval-ms"),
    (
        "pmcp_worker",
        ["--lease-expiry-interval-ms", "100", "--no-expire-leases"],
        "--no-expire-leases",
    ),
    (
        "pmcp_worker",
        [
            "--api",
            "http://127.0.0.1:9/api/pmcp/",
            "--token",
            "t",
            "--lease-expiry-interval-ms",
            "5",
        ],
        "--api",
    ),
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


# -- -v 2 / -v 3: a line per task event ---------------------------------------------------------


def _one_of_each_outcome(tmp_path) -> dict[str, Task]:
    """Tasks that complete, fail then succeed on a retry, fail for good, pause and release."""
    orch = Orchestrator()
    run = orch.create_run(namespace="verbosity")
    marker = str(tmp_path / "marker")

    def add(kind, **kwargs):
        return orch.enqueue_task(run_id=run.id, kind=kind, **kwargs)

    return {
        "echo": add("test.echo"),
        "flaky": add("test.flaky", input={"succeed_on": 2}, max_attempts=3),
        "failed": add("test.failed"),
        "pause": add("test.pause"),
        "release": add("test.release_once", input={"marker": marker}),
    }


def _task_lines(err: str) -> list[str]:
    """The per-task lines (the tests' LOGGING prints the bare message)."""
    return [line for line in err.splitlines() if line.startswith("task ")]


@pytest.mark.django_db(transaction=True)
def test_verbosity_2_logs_each_task_event_with_its_duration(tmp_path):
    tasks = _one_of_each_outcome(tmp_path)
    # One slot, so that each task's lines come in order: with more, the claimer may claim a
    # retry (and log it) before the slot that failed the attempt has logged the failure.
    code, _, err = run_command("pmcp_worker", "--burst", "--concurrency", "1", "-v", "2")
    assert code == 0, err
    lines = _task_lines(err)

    def lines_of(name: str) -> list[str]:
        prefix = f"task {tasks[name].id} ({tasks[name].kind}) "
        found = [line.removeprefix(prefix) for line in lines if line.startswith(prefix)]
        return [line for line in found if line != "raised:"]  # the ERROR line (-v 1 too)

    took = r"after \d+\.\d{3}s"
    echo = lines_of("echo")
    assert echo[0] == f"claimed: attempt 1 of unlimited, run {tasks['echo'].run_id}"
    assert re.fullmatch(f"completed {took}", echo[1]), echo
    flaky = lines_of("flaky")
    assert flaky[0].startswith("claimed: attempt 1 of 3")
    assert re.fullmatch(
        rf"failed, retried in \d+ ms \(attempt 1 of 3\) {took}: ConnectionError: transient",
        flaky[1],
    ), flaky
    assert flaky[2].startswith("claimed: attempt 2 of 3")
    assert re.fullmatch(f"completed {took}", flaky[3]), flaky
    assert re.fullmatch(f"failed {took}: handler said no", lines_of("failed")[1])
    assert re.fullmatch(f"paused \\(waiting_input\\) {took}: need an answer", lines_of("pause")[1])
    release = lines_of("release")
    assert re.fullmatch(f"released {took}: not yet", release[1]), release
    assert re.fullmatch(f"completed {took}", release[3]), release
    assert not any("heartbeat" in line for line in lines)  # -v 3 only


@pytest.mark.django_db(transaction=True)
def test_verbosity_1_has_no_per_task_lines(tmp_path):
    _one_of_each_outcome(tmp_path)
    code, _, err = run_command("pmcp_worker", "--burst", "-v", "1")
    assert code == 0, err
    assert "worker" in err and "started" in err  # INFO lines are there
    assert not [line for line in _task_lines(err) if "claimed" in line or "completed" in line]


@pytest.mark.django_db(transaction=True)
def test_verbosity_3_adds_the_heartbeats():
    orch = Orchestrator()
    run = orch.create_run(namespace="verbosity")
    task = orch.enqueue_task(run_id=run.id, kind="test.sleep", input={"seconds": 0.5})
    code, _, err = run_command("pmcp_worker", "--burst", "--lease-ms", "300", "-v", "3")
    assert code == 0, err
    assert re.search(rf"^task {task.id}: heartbeat, lease until \S+", err, re.MULTILINE), err


# -- docs/workers.md documents every option ----------------------------------------------------

DOCS = Path(__file__).resolve().parent.parent / "docs" / "workers.md"
DJANGO_OPTIONS = {
    "--help",
    "--version",
    "--verbosity",
    "--settings",
    "--pythonpath",
    "--traceback",
    "--no-color",
    "--force-color",
    "--skip-checks",
}


@pytest.mark.parametrize(
    "command", ["pmcp_worker", "pmcp_expire_leases", "pmcp_prune", "pmcp_status"]
)
def test_docs_name_every_option_of_the_command(command):
    """Read from the real argument parser, so a new option cannot go undocumented."""
    parser = load_command_class("parallel_mcp", command).create_parser("django", command)
    options = {
        option
        for action in parser._actions
        for option in action.option_strings
        if option.startswith("--") and option not in DJANGO_OPTIONS
    }
    text = DOCS.read_text()
    section = text.split(f"## `{command}`", 1)[1].split("\n## ", 1)[0]
    missing = sorted(
        option for option in options if not re.search(rf"(?<![\w-]){option}(?![\w-])", section)
    )
    assert not missing, f"docs/workers.md, section {command}, lacks {missing}"
    if command == "pmcp_worker":
        assert "PMCP_API_TOKEN" in section

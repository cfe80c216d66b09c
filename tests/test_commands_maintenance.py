"""pmcp_prune, pmcp_status and the example project's demo, as commands and as processes."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from parallel_mcp import Orchestrator
from parallel_mcp.management.tables import short_id
from parallel_mcp.models import Run, Task
from parallel_mcp.selectors import no_worker_message
from tests.conftest import live_worker
from tests.subprocesses import REPO, subprocess_env

ANSI = re.compile(r"\x1b\[[0-9;]*m")


def command(name: str, *args: str) -> str:
    out = io.StringIO()
    call_command(name, *args, stdout=out)
    return out.getvalue()


def command_error(name: str, *args: str) -> str:
    with pytest.raises(CommandError) as info:
        command(name, *args)
    message = str(info.value)
    assert "\n" not in message
    return message


def run_process(*args: str) -> subprocess.CompletedProcess:
    """``python -m django ARGS`` against the test database."""
    return subprocess.run(
        [sys.executable, "-m", "django", *args],
        cwd=REPO,
        env=subprocess_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def make_run(orch: Orchestrator, status: str, *, when, namespace: str = "tests") -> Run:
    """A run of one task, brought to ``status`` at ``when`` (which becomes its updated_at)."""
    run = orch.create_run(namespace=namespace, now=when)
    kind = f"k.{short_id(run.id)}"  # claims below take this run's task, no other
    task = orch.enqueue_task(run_id=run.id, kind=kind, now=when)
    if status in ("completed", "failed"):
        claim = orch.claim_next_task(worker_id="w", kinds=[kind], now=when)
        ids = {"task_id": task.id, "lease_id": claim.lease.id, "worker_id": "w"}
        if status == "completed":
            orch.complete_task(**ids, now=when)
        else:
            orch.fail_task(**ids, error="boom", now=when)
    elif status == "cancelled":
        orch.cancel_run(run_id=run.id, now=when)
    run = orch.get_run(run_id=run.id)
    assert run.status == (status if status != "queued" else "active")
    return run


@pytest.fixture
def aged_runs(db):
    """Three old terminal runs, one old active run and one recent completed run."""
    orch = Orchestrator()
    now = timezone.now()
    old = [
        make_run(orch, "failed", when=now - timedelta(days=40)),
        make_run(orch, "completed", when=now - timedelta(days=30)),
        make_run(orch, "cancelled", when=now - timedelta(days=20)),
    ]
    active = make_run(orch, "queued", when=now - timedelta(days=50))
    recent = make_run(orch, "completed", when=now - timedelta(hours=1))
    return {"old": old, "active": active, "recent": recent}


def listed_ids(output: str) -> list[str]:
    return [line.strip() for line in output.splitlines()[1:]]


# -- pmcp_prune ---------------------------------------------------------------------------------
def test_prune_deletes_old_terminal_runs_oldest_first(aged_runs):
    output = command("pmcp_prune", "--older-than", "7d")
    assert output.splitlines()[0] == "pruned 3 run(s)"
    assert listed_ids(output) == [str(run.id) for run in aged_runs["old"]]
    remaining = set(Run.objects.values_list("id", flat=True))
    assert remaining == {aged_runs["active"].id, aged_runs["recent"].id}
    assert not Task.objects.filter(run_id__in=[run.id for run in aged_runs["old"]]).exists()


def test_prune_dry_run_lists_the_same_runs_and_deletes_nothing(aged_runs):
    output = command("pmcp_prune", "--older-than", "7d", "--dry-run")
    assert output.splitlines()[0] == "would prune 3 run(s)"
    assert Run.objects.count() == 5
    assert listed_ids(output) == listed_ids(command("pmcp_prune", "--older-than", "7d"))
    assert Run.objects.count() == 2


def test_prune_by_status_and_age(aged_runs):
    output = command("pmcp_prune", "--older-than", "25d", "--status", "completed,failed")
    assert listed_ids(output) == [str(aged_runs["old"][0].id), str(aged_runs["old"][1].id)]
    assert command("pmcp_prune", "--older-than", "1w").splitlines() == [
        "pruned 1 run(s)",
        f"  {aged_runs['old'][2].id}",
    ]


def test_prune_repeats_batches_until_nothing_is_left(aged_runs):
    output = command("pmcp_prune", "--older-than", "1m", "--limit", "1")
    assert output.splitlines()[0] == "pruned 4 run(s)"  # the recent run is an hour old
    assert list(Run.objects.values_list("id", flat=True)) == [aged_runs["active"].id]


def test_prune_quiet_prints_only_the_count(aged_runs):
    out = io.StringIO()
    call_command("pmcp_prune", "--older-than", "7d", "--dry-run", verbosity=0, stdout=out)
    assert out.getvalue() == "would prune 3 run(s)\n"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--older-than", "7x"], "--older-than must be a number with a unit"),
        (["--older-than", ""], "--older-than must be a number with a unit"),
        (["--older-than", "7d", "--status", "active"], "'active' is not a terminal run status"),
        (["--older-than", "7d", "--status", "done"], "'done' is not a terminal run status"),
        (["--older-than", "7d", "--status", "completed,"], "--status must be a comma-separated"),
        (["--older-than", "7d", "--limit", "0"], "--limit must be > 0"),
        (["--older-than", "7d", "--limit", "many"], "--limit must be a whole number"),
        (["--older-than", "7d", "--limit", "5000"], "--limit must be <= 1000"),
    ],
)
def test_prune_refuses_bad_options_in_one_line(db, args, expected):
    assert expected in command_error("pmcp_prune", *args)
    assert expected in command_error("pmcp_prune", *args, "--dry-run")


def test_prune_needs_older_than(db):
    assert "--older-than" in command_error("pmcp_prune")


@pytest.mark.django_db(transaction=True)
def test_prune_as_a_process():
    run = make_run(Orchestrator(), "completed", when=timezone.now() - timedelta(days=9))
    dry = run_process("pmcp_prune", "--older-than", "7d", "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert dry.stdout.splitlines() == ["would prune 1 run(s)", f"  {run.id}"]
    real = run_process("pmcp_prune", "--older-than", "7d")
    assert real.returncode == 0, real.stderr
    assert real.stdout.splitlines()[0] == "pruned 1 run(s)"
    assert not Run.objects.filter(pk=run.id).exists()
    bad = run_process("pmcp_prune", "--older-than", "7d", "--status", "active")
    assert bad.returncode == 1
    assert bad.stdout == ""
    assert bad.stderr.strip().splitlines() == [
        "CommandError: --status 'active' is not a terminal run status; pmcp_prune deletes only "
        "completed, failed, cancelled runs"
    ]


# -- pmcp_status: the run list ------------------------------------------------------------------
def row_of(output: str, run) -> list[str]:
    (line,) = [line for line in output.splitlines() if line.startswith(short_id(run.id))]
    return line.split()


def test_status_lists_recent_runs_with_counts_progress_and_age(db):
    orch = Orchestrator()
    run = orch.create_run(namespace="alpha")
    first = orch.enqueue_task(run_id=run.id, kind="k")
    orch.enqueue_task(run_id=run.id, kind="k", depends_on=[first.id])
    claim = orch.claim_next_task(worker_id="w")
    orch.complete_task(task_id=first.id, lease_id=claim.lease.id, worker_id="w")
    done = make_run(orch, "completed", when=timezone.now() - timedelta(minutes=5), namespace="b")

    output = command("pmcp_status")
    lines = output.splitlines()
    assert lines[0].split() == [
        "RUN",
        "NAMESPACE",
        "STATUS",
        "TASKS",
        "ACT",
        "WAIT",
        "STUCK",
        "DONE",
        "FAIL",
        "CANC",
        "PROGRESS",
        "UPDATED",
    ]
    assert lines[1].startswith(short_id(run.id))  # the most recently updated first
    # id, namespace, status, total/active/waiting/stuck/completed/failed/cancelled, bar, age
    row = row_of(output, run)
    assert row[:12] == [
        short_id(run.id),
        "alpha",
        "active",
        *"2 1 0 0 1 0 0".split(),
        "[#####-----]",
        "50%",
    ]
    assert re.fullmatch(r"\d+s", row[12]) and row[13:] == ["ago"]
    assert row_of(output, done)[2:12] == [
        "completed",
        *"1 0 0 0 1 0 0".split(),
        "[##########]",
        "100%",
    ]
    assert row_of(output, done)[-2:] == ["5m", "ago"]
    assert "\x1b" not in output  # no colour when stdout is not a terminal
    assert all(len(line) <= 100 for line in lines)


def test_status_filters_and_limits_the_list(db):
    orch = Orchestrator()
    runs = [orch.create_run(namespace=ns) for ns in ("alpha", "beta", "beta")]
    failed = make_run(orch, "failed", when=timezone.now(), namespace="gamma")

    def shown(*args):
        return [line.split()[0] for line in command("pmcp_status", *args).splitlines()[1:] if line]

    assert shown("--namespace", "beta", "-v0") == [short_id(runs[2].id), short_id(runs[1].id)]
    assert shown("--status", "failed,cancelled", "-v0") == [short_id(failed.id)]
    assert shown("--limit", "1", "-v0") == [short_id(failed.id)]
    assert command("pmcp_status", "--namespace", "nobody") == "no runs match\n"


def test_status_without_runs(db):
    assert command("pmcp_status") == "no runs\n"


def test_status_fits_100_columns_and_colours_only_when_asked(db):
    orch = Orchestrator()
    run = orch.create_run(namespace="n" * 200)
    orch.enqueue_task(run_id=run.id, kind="kind." + "x" * 150, key="key-" + "y" * 150)
    for args in ([], [str(run.id)]):
        plain = command("pmcp_status", *args)
        assert "\x1b" not in plain
        assert all(len(line) <= 100 for line in plain.splitlines()), plain
        coloured = command("pmcp_status", "--force-color", *args)
        assert "\x1b[" in coloured
        assert ANSI.sub("", coloured) == plain


# -- pmcp_status RUN_ID -------------------------------------------------------------------------
@pytest.fixture
def busy_run(db):
    """A run whose tasks are in every interesting state."""
    orch = Orchestrator()
    run = orch.create_run(namespace="busy", external_id="order-7")
    tasks = {
        "first": orch.enqueue_task(run_id=run.id, kind="k.first", key="first", max_attempts=3),
        "paused": orch.enqueue_task(run_id=run.id, kind="k.paused", key="paused"),
        "leased": orch.enqueue_task(run_id=run.id, kind="k.leased", key="leased"),
        "broken": orch.enqueue_task(run_id=run.id, kind="k.broken", key="broken"),
    }
    tasks["second"] = orch.enqueue_task(
        run_id=run.id, kind="k.second", depends_on=[tasks["first"].id]
    )
    claim = orch.claim_next_task(worker_id="w", kinds=["k.paused"])
    orch.pause_task(
        task_id=claim.task.id,
        lease_id=claim.lease.id,
        worker_id="w",
        status="waiting_input",
        reason="need an answer",
    )
    claim = orch.claim_next_task(worker_id="worker-x", kinds=["k.leased"])
    orch.report_progress(
        task_id=claim.task.id,
        lease_id=claim.lease.id,
        worker_id="worker-x",
        progress=0.25,
        message="a quarter done",
    )
    claim = orch.claim_next_task(worker_id="w", kinds=["k.broken"])
    orch.fail_task(
        task_id=claim.task.id, lease_id=claim.lease.id, worker_id="w", error="ValueError: boom"
    )
    return orch.get_run(run_id=run.id), tasks


def test_status_of_one_run_shows_tasks_and_why_they_wait(busy_run):
    run, tasks = busy_run
    output = command("pmcp_status", str(run.id))
    lines = output.splitlines()
    assert lines[0] == f"Run {run.id}  namespace busy  external id order-7"
    assert lines[1].split()[:2] == ["status", "active"]
    assert "1 of 5 task(s) finished" in lines[1]
    assert lines[2].split(None, 1) == [
        "tasks",
        "5 total: 3 active, 1 waiting, 0 stuck, 0 completed, 1 failed, 0 cancelled",
    ]
    table = lines[lines.index("") + 1 :]
    assert table[0].split() == ["TASK", "KIND", "STATUS", "TRIES", "LEASE", "HOLDER", "PROGRESS"]
    rows = {line.split()[0]: line.split() for line in table[1:] if not line.startswith(" ")}
    assert rows["first"][1:5] == ["k.first", "queued", "0/3", "-"]
    assert rows["paused"][1:5] == ["k.paused", "waiting_input", "1/-", "-"]
    assert rows["leased"][1:7] == ["k.leased", "leased", "1/-", "worker-x", "[##--------]", "25%"]
    assert rows["broken"][1:3] == ["k.broken", "failed"]
    assert rows[short_id(tasks["second"].id)][1:3] == ["k.second", "queued"]

    def notes_of(key):
        start = next(i for i, line in enumerate(table) if line.startswith(key + " "))
        notes = []
        for line in table[start + 1 :]:
            if not line.startswith(" "):
                break
            notes.append(line.strip())
        return " ".join(notes)

    assert notes_of("first") == ""  # claimable now: nothing to explain
    assert notes_of("paused").startswith("waits: Task is paused (waiting_input): need an answer")
    assert "waits: Task is leased by worker 'worker-x'" in notes_of("leased")
    assert "progress: a quarter done" in notes_of("leased")
    assert notes_of("broken") == "error: ValueError: boom"
    assert notes_of(short_id(tasks["second"].id)) == (
        f"waits: Waiting for dependency {tasks['first'].id} (k.first), which is queued."
    )
    assert all(len(line) <= 100 for line in lines)


def test_status_finds_a_run_by_its_short_id_and_limits_tasks(busy_run):
    run, _ = busy_run
    output = command("pmcp_status", short_id(run.id), "--limit", "2")
    assert output.splitlines()[0].startswith(f"Run {run.id}")
    assert output.splitlines()[-1] == "... and 3 more task(s) (see --limit)"
    assert output == command("pmcp_status", str(run.id).upper(), "--limit", "2")


def test_status_shows_at_most_five_reasons_per_task(db):
    orch = Orchestrator()
    run = orch.create_run()
    upstream = [orch.enqueue_task(run_id=run.id, kind="k").id for _ in range(7)]
    orch.enqueue_task(run_id=run.id, kind="k", key="fan-in", depends_on=upstream)
    lines = command("pmcp_status", str(run.id)).splitlines()
    waits = [line.strip() for line in lines if line.startswith("    waits:")]
    assert len(waits) == 6
    assert waits[-1] == "waits: ... and 2 more (see explain_task)"


def _header(output: str) -> list[str]:
    return output.split("\n\n", 1)[0].splitlines()


def test_status_of_one_run_says_once_which_kinds_no_running_worker_handles(busy_run):
    """Only ``first`` is claimable; ``second`` waits for it, so only k.first is named."""
    run, _ = busy_run
    output = command("pmcp_status", str(run.id))
    header = _header(output)
    start = next(i for i, line in enumerate(header) if line.startswith("  workers "))
    said = [header[start][10:]]
    said += [line.strip() for line in header[start + 1 :] if line.startswith(" " * 10)]
    assert " ".join(said) == no_worker_message("k.first")
    assert output.count("No running worker handles") == 1  # not again under the task
    assert all(len(line) <= 100 for line in output.splitlines())


def test_status_of_one_run_with_a_worker_for_its_kinds_says_nothing_about_workers(busy_run):
    run, _ = busy_run
    live_worker("k.first", "k.second")
    output = command("pmcp_status", str(run.id))
    assert "No running worker" not in output
    assert not [line for line in _header(output) if line.startswith("  workers")]


def test_status_run_list_says_whether_any_worker_runs(db):
    make_run(Orchestrator(), "active", when=timezone.now())
    last = command("pmcp_status").splitlines()[-1]
    assert last == (
        "No worker is running: queued tasks wait until a pmcp_worker starts "
        "(pmcp_status --workers)."
    )
    live_worker("a", worker_id="w1")
    live_worker("b", worker_id="w2")
    last = command("pmcp_status").splitlines()[-1]
    assert last == "2 worker process(es) running: pmcp_status --workers lists them."


def test_status_workers_lists_the_running_worker_processes(db):
    assert command("pmcp_status", "--workers").strip() == "no running workers"
    live_worker("site.apply", "site.check", worker_id="web-1:4711")
    gone = live_worker("old.kind", worker_id="gone-1")
    type(gone).objects.filter(pk=gone.pk).update(
        last_seen_at=timezone.now() - timedelta(minutes=5),
        expires_at=timezone.now() - timedelta(minutes=4),
    )
    lines = command("pmcp_status", "--workers").splitlines()
    assert lines[0].split() == ["WORKER", "HOST", "PID", "SLOTS", "VIA", "KINDS", "STARTED", "SEEN"]
    assert len(lines) == 2  # the gone one is not listed
    assert lines[1].split()[:6] == [
        "web-1:4711",
        "test-host",
        "-",
        "1",
        "db",
        "site.apply,site.check",
    ]
    assert "--workers lists worker processes" in command_error(
        "pmcp_status", "--workers", "--stuck"
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["nope"], "RUN_ID must be a run id or the short id pmcp_status lists, got 'nope'"),
        (["0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"], "no run with id 0190a1b2-c3d4"),
        (["0123456789ab"], "no run whose id ends in 0123456789ab"),
        (["0123456789ab", "--namespace", "x"], "--namespace and --status filter the run list"),
        (["--status", "done"], "--status has 'done'; run statuses are pending, active"),
        (["--namespace", " "], "--namespace must not be empty"),
        (["--limit", "0"], "--limit must be > 0"),
        (["--limit", "1001"], "--limit must be <= 1000"),
    ],
)
def test_status_refuses_bad_arguments_in_one_line(db, args, expected):
    assert expected in command_error("pmcp_status", *args)


@pytest.mark.django_db(transaction=True)
def test_status_as_a_process():
    run = make_run(Orchestrator(), "completed", when=timezone.now())
    listing = run_process("pmcp_status")
    assert listing.returncode == 0, listing.stderr
    assert listing.stdout.splitlines()[0].startswith("RUN ")
    assert short_id(run.id) in listing.stdout
    one = run_process("pmcp_status", short_id(run.id))
    assert one.returncode == 0, one.stderr
    assert one.stdout.startswith(f"Run {run.id}")
    bad = run_process("pmcp_status", "not-a-run")
    assert bad.returncode == 1
    assert bad.stderr.strip().splitlines() == [
        "CommandError: RUN_ID must be a run id or the short id pmcp_status lists, got 'not-a-run'"
    ]

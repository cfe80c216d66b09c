"""Worker presence: running workers record themselves and the kinds they handle, so
explain_task, pmcp_status and the admin can say "no running worker handles kind X". The
service, the HTTP endpoint, and real worker processes (local and ``--api``) that stop cleanly
or are killed."""

from __future__ import annotations

import re
import signal
import time
import uuid
from datetime import timedelta

import pytest
from django.db import OperationalError
from django.db.models import F
from django.utils import timezone

from parallel_mcp import Orchestrator
from parallel_mcp.exceptions import RecordNotFoundError, ValidationError
from parallel_mcp.models import WorkerProcess, WorkerProcessKind
from parallel_mcp.services import record_worker_presence, remove_worker_presence
from parallel_mcp.services.workers import GONE_ROWS_KEPT, PRESENCE_MISSED_REPORTS
from parallel_mcp.worker.loop import DEFAULT_CONCURRENCY
from parallel_mcp.worker.presence import PresenceReporter
from parallel_mcp.worker.remote import RemoteOrchestrator
from tests.api_helpers import WORKER_PERMS, bearer, error_of, make_user, token_for
from tests.conftest import at
from tests.workers import (
    kill_leftover_processes,  # noqa: F401 - autouse fixture
    start_worker,
    wait_until,
)


def report(**overrides):
    fields = {
        "using": "default",
        "process_id": uuid.uuid4(),
        "worker_id": "host-1:42",
        "hostname": "host-1",
        "pid": 42,
        "kinds": ["b.kind", "a.kind", "a.kind"],
        "concurrency": 4,
        "interval_ms": 10_000,
        "now": at(0),
    }
    fields.update(overrides)
    return record_worker_presence(**fields), fields


def kinds_of(process) -> list[str]:
    return list(
        WorkerProcessKind.objects.filter(worker_process=process).values_list("kind", flat=True)
    )


def blocker_kinds(task, now=None) -> list[str]:
    return [b.kind for b in Orchestrator().explain_task(task_id=task.id, now=now)]


# -- the service --------------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_first_report_records_the_process_and_its_kinds():
    _, fields = report()
    stored = WorkerProcess.objects.get(pk=fields["process_id"])
    assert (stored.worker_id, stored.hostname, stored.pid, stored.concurrency) == (
        "host-1:42",
        "host-1",
        42,
        4,
    )
    assert stored.remote is False
    assert (stored.started_at, stored.last_seen_at) == (at(0), at(0))
    assert stored.expires_at == at(0) + PRESENCE_MISSED_REPORTS * timedelta(seconds=10)
    assert kinds_of(stored) == ["a.kind", "b.kind"]  # each once


@pytest.mark.django_db
def test_later_reports_refresh_it_and_keep_what_it_handles():
    _, fields = report()
    report(**{**fields, "kinds": ["other"], "worker_id": "renamed", "now": at(10)})
    stored = WorkerProcess.objects.get(pk=fields["process_id"])
    assert (stored.started_at, stored.last_seen_at) == (at(0), at(10))
    assert stored.expires_at == at(40)
    assert stored.worker_id == "host-1:42" and kinds_of(stored) == ["a.kind", "b.kind"]
    assert WorkerProcess.objects.count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"process_id": "nope"}, "process_id"),
        ({"worker_id": ""}, "worker_id"),
        ({"hostname": "h" * 256}, "hostname"),
        ({"kinds": []}, "kinds"),
        ({"kinds": None}, "kinds"),
        ({"kinds": [""]}, "kinds"),
        ({"kinds": [f"k{n}" for n in range(1_001)]}, "kinds"),
        ({"interval_ms": 0}, "interval_ms"),
        ({"pid": -1}, "pid"),
        ({"concurrency": 0}, "concurrency"),
    ],
)
def test_bad_reports_are_refused_and_write_nothing(overrides, field):
    with pytest.raises(ValidationError) as refused:
        report(**overrides)
    assert refused.value.details.get("field") == field or field in str(refused.value)
    assert not WorkerProcess.objects.exists() and not WorkerProcessKind.objects.exists()


@pytest.mark.django_db
def test_a_clean_stop_forgets_the_process_at_once():
    process, fields = report()
    other, _ = report()
    assert remove_worker_presence(using="default", process_id=fields["process_id"]) is True
    assert list(WorkerProcess.objects.values_list("pk", flat=True)) == [other.pk]
    assert kinds_of(process) == [] and kinds_of(other) == ["a.kind", "b.kind"]
    assert remove_worker_presence(using="default", process_id=fields["process_id"]) is False


@pytest.mark.django_db
def test_processes_gone_for_long_are_deleted_when_another_starts():
    long_gone, _ = report(now=at(0))
    expired_at = long_gone.expires_at
    recently_gone, _ = report(now=expired_at + GONE_ROWS_KEPT - timedelta(seconds=40))
    report(now=expired_at + GONE_ROWS_KEPT + timedelta(seconds=1))
    assert not WorkerProcess.objects.filter(pk=long_gone.pk).exists()
    assert kinds_of(long_gone) == []
    assert WorkerProcess.objects.filter(pk=recently_gone.pk).exists()  # the admin shows it


# -- the HTTP endpoint --------------------------------------------------------------------------


@pytest.mark.django_db
def test_the_endpoint_records_a_remote_process_and_forgets_it():
    api = bearer(token_for(make_user("w", WORKER_PERMS), role="worker"))
    process_id = str(uuid.uuid4())
    body = {
        "process_id": process_id,
        "worker_id": "host-2:7",
        "hostname": "host-2",
        "pid": 7,
        "kinds": ["site.apply"],
        "concurrency": 2,
        "interval_ms": 5_000,
    }
    response = api.post("worker/presence", body)
    assert response.status_code == 200, response.content
    data = response.json()
    assert data["id"] == process_id and data["remote"] is True
    assert data["kinds"] == ["site.apply"] and data["concurrency"] == 2
    assert set(data) == {
        "id",
        "worker_id",
        "hostname",
        "pid",
        "concurrency",
        "remote",
        "kinds",
        "started_at",
        "last_seen_at",
        "expires_at",
    }
    assert WorkerProcess.objects.get(pk=process_id).remote is True

    assert api.post("worker/presence/stop", {"process_id": process_id}).status_code == 204
    assert not WorkerProcess.objects.exists()
    assert api.post("worker/presence/stop", {"process_id": process_id}).status_code == 204


@pytest.mark.django_db
def test_the_endpoint_refuses_bad_reports_in_the_envelope():
    api = bearer(token_for(make_user("w", WORKER_PERMS), role="worker"))
    response = api.post("worker/presence", {"process_id": "x", "kinds": [], "interval_ms": 0})
    assert response.status_code == 400
    fields = error_of(response)["details"]["fields"]
    assert {"process_id", "worker_id", "hostname", "kinds", "interval_ms"} <= set(fields)
    assert not WorkerProcess.objects.exists()


# -- real worker processes ----------------------------------------------------------------------

INTERVAL_MS = 200
FAST = {"PARALLEL_MCP": {"DEFAULT_LEASE_MS": 30_000, "WORKER_PRESENCE_INTERVAL_MS": INTERVAL_MS}}


def _recorded(worker) -> WorkerProcess:
    """The presence row of ``worker`` (a process), once it has reported at least twice."""
    return wait_until(
        lambda: (
            WorkerProcess.objects.filter(pid=worker.pid)
            .exclude(last_seen_at=F("started_at"))
            .first()
        ),
        alive=[worker],
        message="the worker never reported its presence twice",
    )


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_is_recorded_while_it_runs_and_forgotten_when_it_stops():
    orch = Orchestrator()
    run = orch.create_run()
    later = orch.enqueue_task(
        run_id=run.id, kind="test.echo", not_before=timezone.now() + timedelta(hours=1)
    )
    unhandled = orch.enqueue_task(run_id=run.id, kind="nobody.handles.this")
    assert blocker_kinds(later) == ["not_before", "no_worker"]

    worker = start_worker("--worker-id", "presence-test", settings=FAST)
    process = _recorded(worker)
    # No --kinds: every kind it has a handler for, as the worker resolved them (its log says).
    logged = re.search(r"started: \d+ slot\(s\), kinds (\S+), lease", worker.err).group(1)
    assert kinds_of(process) == sorted(logged.split(",")) and "test.echo" in logged
    assert (process.worker_id, process.remote, process.concurrency) == (
        "presence-test",
        False,
        DEFAULT_CONCURRENCY,
    )
    assert blocker_kinds(later) == ["not_before"]
    assert blocker_kinds(unhandled) == ["no_worker"]

    worker.send_signal(signal.SIGTERM)
    assert worker.finish() == 0, worker.describe()
    assert not WorkerProcess.objects.filter(pk=process.pk).exists()  # at once, not in 3 intervals
    assert blocker_kinds(later) == ["not_before", "no_worker"]


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_killed_worker_stops_counting_after_three_missed_reports():
    orch = Orchestrator()
    run = orch.create_run()
    later = orch.enqueue_task(
        run_id=run.id, kind="test.echo", not_before=timezone.now() + timedelta(hours=1)
    )
    worker = start_worker("--kinds", "test.echo", settings=FAST)
    process = _recorded(worker)
    assert kinds_of(process) == ["test.echo"]
    assert blocker_kinds(later) == ["not_before"]

    worker.send_signal(signal.SIGKILL)
    worker.wait(10)
    assert WorkerProcess.objects.filter(pk=process.pk).exists()  # no goodbye from kill -9
    wait_until(
        lambda: blocker_kinds(later) == ["not_before", "no_worker"],
        timeout=10,
        message="the killed worker still counts as running",
    )
    # It stopped counting no earlier than three intervals after its last report.
    last_seen = WorkerProcess.objects.get(pk=process.pk).last_seen_at
    assert timezone.now() >= last_seen + timedelta(milliseconds=3 * INTERVAL_MS)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_worker_without_database_access_is_recorded_through_the_api(live_server):
    token = token_for(make_user("remote", WORKER_PERMS), role="worker")
    worker = start_worker(
        "--api",
        f"{live_server.url}/api/pmcp/",
        "--kinds",
        "test.echo,test.sleep",
        "--concurrency",
        "2",
        env={"DJANGO_SETTINGS_MODULE": "tests.remote_worker_settings", "PMCP_API_TOKEN": token},
        settings=FAST,
    )
    process = _recorded(worker)
    assert process.remote is True and process.concurrency == 2
    assert kinds_of(process) == ["test.echo", "test.sleep"]
    worker.send_signal(signal.SIGTERM)
    assert worker.finish() == 0, worker.describe()
    assert not WorkerProcess.objects.filter(pk=process.pk).exists()


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_remote_orchestrator_reports_and_removes_presence(live_server):
    token = token_for(make_user("remote", WORKER_PERMS), role="worker")
    remote = RemoteOrchestrator(base_url=f"{live_server.url}/api/pmcp/", token=token)
    process_id = uuid.uuid4()
    try:
        data = remote.record_worker_presence(
            process_id=process_id,
            worker_id="r1",
            hostname="h",
            kinds=["k"],
            interval_ms=1_000,
            pid=1,
            concurrency=3,
        )
        assert data["id"] == str(process_id) and data["kinds"] == ["k"]
        assert WorkerProcess.objects.get(pk=process_id).remote is True
        with pytest.raises(ValidationError):
            remote.record_worker_presence(
                process_id=process_id, worker_id="r1", hostname="h", kinds=[], interval_ms=1
            )
        remote.remove_worker_presence(process_id=process_id)
        assert not WorkerProcess.objects.filter(pk=process_id).exists()
    finally:
        remote.close()


# -- the reporter, with a fake environment ----------------------------------------------------


class FakeEnv:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.reports = 0
        self.removed: list = []

    def report_presence(self, fields):
        self.reports += 1
        if self.error is not None:
            raise self.error

    def remove_presence(self, process_id):
        self.removed.append(process_id)

    def close_thread(self):
        pass


def test_a_failing_report_is_logged_and_tried_again_never_raised(caplog):
    env = FakeEnv(OperationalError("database is locked"))
    reporter = PresenceReporter(env=env, fields={"process_id": "p"}, interval_ms=20)
    reporter.start()
    wait_until(lambda: env.reports >= 3, timeout=10)
    reporter.stop()
    assert env.removed == ["p"]
    assert "could not report this worker's presence: database is locked" in caplog.text


def test_an_api_without_the_presence_endpoint_is_asked_once():
    """Only an older server answers 404 (not_found) there: stop reporting, say so once."""
    env = FakeEnv(RecordNotFoundError("No API endpoint at /api/pmcp/worker/presence."))
    reporter = PresenceReporter(env=env, fields={"process_id": "p"}, interval_ms=10)
    reporter.start()
    time.sleep(0.1)
    reporter.stop()
    assert env.reports == 1 and env.removed == []

"""The worker's pieces in-process: the handler registry, ``as_outcome``, ``with_db_retry``,
and a ``Worker`` run in a thread whose database calls fail the way dropped connections do."""

from __future__ import annotations

import threading
import time
from collections import Counter
from unittest.mock import Mock

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.db import IntegrityError, InterfaceError, OperationalError, connection, connections
from django.test import override_settings

from parallel_mcp import Completed, Failed, HandlerContext, Orchestrator, Paused, Released
from parallel_mcp.exceptions import ValidationError
from parallel_mcp.models import Attempt, ClientTokenRecord, Event, Lease, Run, RunDelta, Task
from parallel_mcp.worker import loop
from parallel_mcp.worker import registry as global_registry
from parallel_mcp.worker.dbretry import with_db_retry
from parallel_mcp.worker.loop import DEFAULT_CLAIM_BATCH, DEFAULT_CONCURRENCY, Worker
from parallel_mcp.worker.registry import (
    DuplicateHandlerError,
    HandlerRegistry,
    autodiscover,
    handler,
    load_settings_handlers,
)
from parallel_mcp.worker.results import as_outcome
from tests.testapp import pmcp_handlers

# -- registry ---------------------------------------------------------------------------------


def first_handler(ctx):
    return 1


def second_handler(ctx):
    return 2


def test_a_kind_registered_by_two_functions_is_an_error_naming_both():
    registry = HandlerRegistry()
    registry.register("k", first_handler)
    with pytest.raises(DuplicateHandlerError) as raised:
        registry.register("k", second_handler)
    message = str(raised.value)
    assert "'k'" in message
    assert f"{__name__}.first_handler" in message
    assert f"{__name__}.second_handler" in message
    assert isinstance(raised.value, ImproperlyConfigured)
    assert registry.get("k") is first_handler  # the first one stays


def test_the_decorator_registers_and_returns_the_function():
    registry = HandlerRegistry()

    @handler("a.kind", registry=registry)
    def run_it(ctx):
        return "ran"

    assert run_it(None) == "ran"
    assert registry.get("a.kind") is run_it
    assert "a.kind" in registry
    assert registry.kinds() == ["a.kind"]
    assert registry.origin("a.kind") == f"{__name__}.{run_it.__qualname__}"
    with pytest.raises(DuplicateHandlerError):
        handler("a.kind", registry=registry)(first_handler)


def test_registering_the_same_function_twice_is_fine():
    registry = HandlerRegistry()
    registry.register("k", first_handler)
    registry.register("k", first_handler)
    handler("k", registry=registry)(first_handler)
    assert registry.get("k") is first_handler
    assert len(registry) == 1


def test_two_different_functions_with_the_same_name_are_a_duplicate():
    """Two lambdas (or two closures of one factory) share module and qualname, yet they are
    different handlers."""
    registry = HandlerRegistry()
    registry.register("k", lambda ctx: "first")
    with pytest.raises(DuplicateHandlerError):
        registry.register("k", lambda ctx: "second")


@pytest.mark.parametrize("kind", ["", "   ", None, 5])
def test_a_kind_must_be_a_non_empty_string(kind):
    with pytest.raises(ImproperlyConfigured, match="non-empty string"):
        HandlerRegistry().register(kind, first_handler)


def test_a_handler_must_be_callable():
    with pytest.raises(ImproperlyConfigured, match="not callable"):
        HandlerRegistry().register("k", "tests.testapp.pmcp_handlers.echo")


def test_settings_handlers_are_loaded_from_dotted_paths():
    registry = HandlerRegistry()
    load_settings_handlers(
        {
            "settings.echo": "tests.testapp.pmcp_handlers.echo",
            "settings.direct": second_handler,
        },
        target=registry,
    )
    assert registry.get("settings.echo") is pmcp_handlers.echo
    assert registry.get("settings.direct") is second_handler
    assert registry.origin("settings.echo") == "tests.testapp.pmcp_handlers.echo"


@pytest.mark.parametrize(
    "path",
    [
        "tests.testapp.pmcp_handlers.no_such_handler",
        "tests.no_such_module.handler",
        "nodots",
    ],
)
def test_a_bad_settings_path_is_improperly_configured_with_a_clear_message(path):
    with pytest.raises(ImproperlyConfigured) as raised:
        load_settings_handlers({"bad.kind": path}, target=HandlerRegistry())
    message = str(raised.value)
    assert "PARALLEL_MCP['HANDLERS']" in message
    assert "'bad.kind'" in message
    assert repr(path) in message
    assert "cannot be imported" in message


def test_settings_handlers_must_be_a_mapping():
    with pytest.raises(ImproperlyConfigured, match="must map task kinds"):
        load_settings_handlers(["tests.testapp.pmcp_handlers.echo"], target=HandlerRegistry())


def test_a_settings_path_to_something_not_callable_is_refused():
    with pytest.raises(ImproperlyConfigured, match="not callable"):
        load_settings_handlers({"k": "parallel_mcp.conf.DEFAULTS"}, target=HandlerRegistry())


def test_autodiscover_reads_the_settings_mapping():
    before = dict.fromkeys(global_registry.kinds())
    # The function the app module registered, again under its own kind: no duplicate.
    with override_settings(PARALLEL_MCP={"HANDLERS": {"test.echo": pmcp_handlers.echo}}):
        autodiscover()
    with override_settings(PARALLEL_MCP={"HANDLERS": {"test.echo": second_handler}}):
        with pytest.raises(DuplicateHandlerError):
            autodiscover()
    with override_settings(PARALLEL_MCP={"HANDLERS": {"x.y": "tests.nowhere.handler"}}):
        with pytest.raises(ImproperlyConfigured, match="cannot be imported"):
            autodiscover()
    assert dict.fromkeys(global_registry.kinds()) == before
    assert global_registry.get("test.echo") is pmcp_handlers.echo


def test_the_test_apps_handlers_are_discovered():
    assert {"test.echo", "test.sleep", "test.pause", "test.release_once"} <= set(
        global_registry.kinds()
    )


# -- results ----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [None, 0, "", "text", [1, 2], {"a": 1}, {"output": 1}])
def test_a_plain_value_is_completed_with_that_output(value):
    assert as_outcome(value) == Completed(output=value)


@pytest.mark.parametrize(
    "outcome",
    [
        Completed(),
        Completed(output=1, metadata={"m": 1}, next_context={"c": 1}, next_context_label="l"),
        Failed(error="no"),
        Failed(error="no", retry=True, metadata={"m": 1}),
        Paused(status="blocked"),
        Paused(status="waiting_input", reason="why"),
        Released(),
        Released(reason="later"),
    ],
)
def test_a_result_object_is_its_own_outcome(outcome):
    assert as_outcome(outcome) is outcome


def test_result_defaults():
    assert Completed() == Completed(
        output=None, metadata=None, next_context=None, next_context_label=None
    )
    assert Failed("x") == Failed(error="x", retry=False, metadata=None)
    assert Paused("blocked").reason is None
    assert Released().reason is None


def test_the_context_cancel_keeps_the_first_reason():
    ctx = HandlerContext(
        orchestrator=None,
        task=None,
        run=None,
        lease=None,
        worker_id="w",
        lease_ms=1000,
    )
    assert not ctx.cancelled.is_set()
    ctx.cancel("timeout")
    ctx.cancel("worker stopped")
    assert ctx.cancelled.is_set()
    assert ctx.cancel_reason == "timeout"


# -- with_db_retry ----------------------------------------------------------------------------


class Flaky:
    """A call that raises the given errors in turn, then returns "ok"."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def test_db_retry_retries_operational_errors_then_succeeds(caplog):
    call = Flaky(OperationalError("server closed the connection"), InterfaceError("gone"))
    with caplog.at_level("WARNING", logger="parallel_mcp.worker"):
        assert with_db_retry(call, what="probe", using="default", first_delay=0) == "ok"
    assert call.calls == 3
    retries = [r.getMessage() for r in caplog.records if "database hiccup" in r.getMessage()]
    assert len(retries) == 2
    assert "probe" in retries[0] and "OperationalError" in retries[0]


def test_db_retry_gives_up_after_its_attempts():
    call = Flaky(*[OperationalError(f"down {n}") for n in range(10)])
    with pytest.raises(OperationalError, match="down 3"):
        with_db_retry(call, what="probe", using="default", attempts=4, first_delay=0)
    assert call.calls == 4


@pytest.mark.parametrize(
    "error", [IntegrityError("duplicate"), ValueError("bad"), ValidationError("refused")]
)
def test_db_retry_does_not_retry_other_errors(error):
    call = Flaky(error)
    with pytest.raises(type(error)):
        with_db_retry(call, what="probe", using="default", first_delay=0)
    assert call.calls == 1


# -- a Worker in a thread, with dropped connections -------------------------------------------


def run_in_thread(worker: Worker, timeout: float = 30) -> int:
    box: dict = {}

    def target() -> None:
        try:
            box["code"] = worker.run()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test thread
            box["error"] = exc
        finally:
            connections.close_all()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        worker.request_stop()
        worker.request_stop()
        thread.join(10)
        raise AssertionError(f"worker still running after {timeout}s: {worker.stats}")
    if "error" in box:
        raise box["error"]
    return box["code"]


def drop_connection_once(target, monkeypatch, method: str, *, after_commit: bool):
    """Make ``target.<method>`` (an orchestrator's, or a worker environment's) fail once with a
    dropped connection: before it reaches the database, or after it committed (the reply was
    lost). Returns the call log."""
    real = getattr(target, method)
    calls: list[str] = []

    def flaky(**kwargs):
        calls.append("call")
        if len(calls) == 1:
            if after_commit:
                real(**kwargs)
            connections[target.using].close()
            raise OperationalError("server closed the connection unexpectedly")
        return real(**kwargs)

    monkeypatch.setattr(target, method, flaky)
    return calls


def unit_registry() -> HandlerRegistry:
    registry = HandlerRegistry()
    registry.register("unit.echo", lambda ctx: {"echo": ctx.input})
    registry.register("unit.fail", lambda ctx: Failed(error="unit says no"))
    return registry


def quiet_worker(
    orch, registry: HandlerRegistry, *, concurrency: int, burst: bool = True
) -> Worker:
    """A worker that neither listens for notifications nor expires leases: only its own cycles."""
    return Worker(
        orchestrator=orch,
        registry=registry,
        concurrency=concurrency,
        burst=burst,
        listen=False,
        expire_leases=False,
    )


def event_types(task_id) -> Counter:
    return Counter(Event.objects.filter(task_id=task_id).values_list("event_type", flat=True))


@pytest.mark.django_db(transaction=True)
def test_a_burst_worker_whose_claims_keep_failing_exits_1(monkeypatch):
    """It could not even look for work: that is not "nothing claimable". (A database that is
    unreachable at start-up is refused earlier, by the command's start-up check.)"""
    orch = Orchestrator()

    def unreachable(**kwargs):
        raise OperationalError("could not connect to server")

    monkeypatch.setattr(orch, "claim_next_task", unreachable)  # one free slot
    monkeypatch.setattr(orch, "claim_next_tasks", unreachable)  # several
    worker = Worker(
        orchestrator=orch, registry=unit_registry(), burst=True, listen=False, db_retry_attempts=2
    )
    assert run_in_thread(worker) == 1


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("after_commit", [False, True], ids=["before", "after-commit"])
def test_a_dropped_connection_while_completing_applies_the_result_once(monkeypatch, after_commit):
    orch = Orchestrator()
    run = orch.create_run(namespace="units")
    task = orch.enqueue_task(run_id=run.id, kind="unit.echo", input={"n": 1})
    worker = Worker(
        orchestrator=orch, registry=unit_registry(), burst=True, listen=False, worker_id="u1"
    )
    # The slot hands its completion in; the claimer writes it with its next claim.
    calls = drop_connection_once(
        worker.env, monkeypatch, "complete_and_claim", after_commit=after_commit
    )
    assert run_in_thread(worker) == 0

    assert len(calls) == 2  # the first call failed, the retry went through (or replayed)
    task = Task.objects.get(pk=task.id)
    assert (task.status, task.output) == ("completed", {"echo": {"n": 1}})
    assert event_types(task.id)["task.completed"] == 1
    assert ClientTokenRecord.objects.filter(task_id=task.id).count() == 1
    assert list(Attempt.objects.filter(task_id=task.id).values_list("status", flat=True)) == [
        "completed"
    ]
    assert (worker.stats.claimed, worker.stats.completed, worker.stats.lost) == (1, 1, 0)
    assert orch.get_run(run_id=run.id).status == "completed"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("after_commit", [False, True], ids=["before", "after-commit"])
def test_a_dropped_connection_while_failing_applies_the_failure_once(monkeypatch, after_commit):
    orch = Orchestrator()
    run = orch.create_run(namespace="units")
    task = orch.enqueue_task(run_id=run.id, kind="unit.fail", max_attempts=3)
    calls = drop_connection_once(orch, monkeypatch, "fail_task", after_commit=after_commit)
    worker = Worker(orchestrator=orch, registry=unit_registry(), burst=True, listen=False)
    assert run_in_thread(worker) == 0

    assert len(calls) == 2
    task = Task.objects.get(pk=task.id)
    assert (task.status, task.error, task.attempt_count) == ("failed", "unit says no", 1)
    assert event_types(task.id)["task.failed"] == 1
    assert ClientTokenRecord.objects.get(task_id=task.id).outcome == "failed"


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("after_commit", [False, True], ids=["before", "after-commit"])
@pytest.mark.parametrize(
    ("concurrency", "method"),
    [(1, "claim_next_task"), (4, "claim_next_tasks")],
    ids=["one-slot", "batch"],
)
def test_a_dropped_connection_while_claiming_claims_once(
    monkeypatch, after_commit, concurrency, method
):
    orch = Orchestrator()
    run = orch.create_run(namespace="units")
    task = orch.enqueue_task(run_id=run.id, kind="unit.echo")
    calls = drop_connection_once(orch, monkeypatch, method, after_commit=after_commit)
    worker = Worker(
        orchestrator=orch,
        registry=unit_registry(),
        concurrency=concurrency,
        burst=True,
        listen=False,
    )
    assert run_in_thread(worker) == 0

    assert len(calls) >= 2
    task = Task.objects.get(pk=task.id)
    assert (task.status, task.attempt_count) == ("completed", 1)
    assert Attempt.objects.filter(task_id=task.id).count() == 1
    assert Lease.objects.filter(task_id=task.id).count() == 1
    assert event_types(task.id)["task.claimed"] == 1
    assert event_types(task.id)["task.completed"] == 1
    assert worker.stats.claimed == 1


@pytest.mark.django_db(transaction=True)
def test_a_worker_stopped_in_a_thread_releases_its_task_after_the_drain_timeout():
    orch = Orchestrator()
    run = orch.create_run(namespace="units")
    task = orch.enqueue_task(run_id=run.id, kind="unit.block")
    started, seen_cancel = threading.Event(), threading.Event()

    def block(ctx):
        started.set()
        if ctx.cancelled.wait(20):
            seen_cancel.set()
        return "too late"

    registry = HandlerRegistry()
    registry.register("unit.block", block)
    worker = Worker(orchestrator=orch, registry=registry, drain_timeout_ms=0, listen=False)
    stopper = threading.Thread(target=lambda: started.wait(20) and worker.request_stop())
    stopper.start()
    assert run_in_thread(worker) == 0
    stopper.join()

    assert seen_cancel.wait(5)
    task = Task.objects.get(pk=task.id)
    assert (task.status, task.attempt_count) == ("queued", 0)
    assert event_types(task.id)["task.released"] == 1
    assert worker.stats.released == 1


# -- Worker configuration ---------------------------------------------------------------------


def test_worker_refuses_bad_configuration():
    registry = unit_registry()
    with pytest.raises(ValidationError, match="No handler for kind"):
        Worker(registry=registry, kinds=["unit.echo", "nope"])
    for bad in (0, -1, True, 1.5):
        with pytest.raises(ValidationError, match="concurrency"):
            Worker(registry=registry, concurrency=bad)
        with pytest.raises(ValidationError, match="lease_ms"):
            Worker(registry=registry, lease_ms=bad)
    with pytest.raises(ValidationError, match="drain_timeout_ms"):
        Worker(registry=registry, drain_timeout_ms=-1)


def test_a_worker_given_an_empty_registry_has_no_handlers():
    """An explicit registry is used even when empty (it must not fall back to the global
    one, whose handlers the caller did not ask for)."""
    with pytest.raises(ValidationError, match="No task handlers"):
        Worker(registry=HandlerRegistry())


def test_worker_defaults():
    worker = Worker(registry=unit_registry(), orchestrator=Orchestrator(default_lease_ms=9000))
    assert worker.kinds == ["unit.echo", "unit.fail"]
    assert worker.lease_ms == 9000
    assert worker.heartbeat_interval == pytest.approx(3.0)
    # Eight slots fed by batched claims (never more than the free slots): see docs/workers.md.
    assert (worker.concurrency, worker.claim_batch) == (DEFAULT_CONCURRENCY, 8) == (8, 8)
    assert DEFAULT_CLAIM_BATCH == 16
    assert Worker(registry=unit_registry(), concurrency=2).claim_batch == 2
    assert Worker(registry=unit_registry(), kinds=["unit.fail"]).kinds == ["unit.fail"]
    assert Worker(registry=unit_registry(), lease_ms=1500).heartbeat_interval == pytest.approx(0.5)


@pytest.mark.django_db(transaction=True)
@pytest.mark.skipif("connection.vendor != 'postgresql'")
def test_a_worker_survives_its_connection_being_terminated_by_the_server(caplog):
    """A real dropped connection: the handler has the server terminate every other session
    of the test database (the worker slot's among them) before returning its result."""
    orch = Orchestrator()
    run = orch.create_run(namespace="units")
    task = orch.enqueue_task(run_id=run.id, kind="unit.drop")
    terminated: list[int] = []

    def drop(ctx):
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
            terminated.extend(row[0] for row in cursor.fetchall())
        return {"dropped": len(terminated)}

    registry = HandlerRegistry()
    registry.register("unit.drop", drop)
    worker = Worker(orchestrator=orch, registry=registry, burst=True, listen=False)
    with caplog.at_level("WARNING", logger="parallel_mcp.worker"):
        assert run_in_thread(worker) == 0
    connection.close()  # this thread's session was terminated too
    hiccups = [r.getMessage() for r in caplog.records if "database hiccup" in r.getMessage()]
    assert hiccups, "the worker never noticed its connection was gone"

    assert terminated and all(terminated)
    task = Task.objects.get(pk=task.id)
    assert (task.status, task.output) == ("completed", {"dropped": len(terminated)})
    assert event_types(task.id)["task.completed"] == 1
    assert worker.stats.completed == 1


@pytest.mark.django_db(transaction=True)
def test_burst_does_not_stop_while_a_running_task_can_unlock_another():
    """The claimer looks for work while A runs and finds none (B waits for A). A burst worker
    must not conclude from that look that nothing is left: once A completes, B is claimable."""
    orch = Orchestrator()
    run = orch.create_run(namespace="units")
    first = orch.enqueue_task(run_id=run.id, kind="race.first")
    second = orch.enqueue_task(run_id=run.id, kind="race.next", depends_on=[first.id])
    empty_look = threading.Event()

    def run_first(ctx):
        assert empty_look.wait(20), "the claimer never looked while A ran"
        return "first"

    registry = HandlerRegistry()
    registry.register("race.first", run_first)
    registry.register("race.next", lambda ctx: "next")
    worker = Worker(orchestrator=orch, registry=registry, concurrency=2, burst=True, listen=False)
    real_claim = worker._claim

    def claim(limit, *, check_first):
        claims = real_claim(limit, check_first=check_first)
        if not claims and worker.stats.claimed:
            empty_look.set()  # A is claimed and still running (it waits for this)
        return claims

    worker._claim = claim
    assert run_in_thread(worker) == 0

    assert empty_look.is_set()
    assert Task.objects.get(pk=first.id).status == "completed"
    assert Task.objects.get(pk=second.id).status == "completed", (
        "the burst worker stopped although the task A unlocked was claimable"
    )


@pytest.mark.django_db(transaction=True)
def test_a_slot_keeps_its_handler_thread_and_replaces_one_it_gave_up_on():
    """Handlers run in a thread the slot keeps from task to task; a handler that outlives its
    timeout keeps its thread, and the slot's next task gets a new one."""
    orch = Orchestrator()
    run = orch.create_run(namespace="units")
    names = ["first", "second", "stuck", "after"]
    orch.enqueue_tasks(
        run_id=run.id,
        tasks=[
            {"kind": "unit.where", "input": name, "priority": 10 - position}
            | ({"timeout_ms": 200} if name == "stuck" else {})
            for position, name in enumerate(names)
        ],
    )
    threads: dict[str, threading.Thread] = {}
    release = threading.Event()

    def where(ctx):
        threads[ctx.input] = threading.current_thread()
        if ctx.input == "stuck":
            release.wait(20)  # ignores ctx.cancelled: outlives its timeout
        elif ctx.input == "after":
            threads["stuck-still-running"] = (
                threads["stuck"] if threads["stuck"].is_alive() else None
            )
        return ctx.input

    registry = HandlerRegistry()
    registry.register("unit.where", where)
    worker = Worker(orchestrator=orch, registry=registry, concurrency=1, burst=True, listen=False)
    try:
        assert run_in_thread(worker) == 0
    finally:
        release.set()
    assert threads["first"] is threads["second"] is threads["stuck"]
    assert threads["after"] is not threads["stuck"]
    assert threads["stuck-still-running"] is threads["stuck"]
    statuses = dict(Task.objects.filter(run_id=run.id).values_list("input", "status"))
    assert statuses == {"first": "completed", "second": "completed", "stuck": "failed",
                        "after": "completed"}  # fmt: skip
    for name in ("stuck", "after"):  # retired: once its handler returned, with the slot
        threads[name].join(5)
        assert not threads[name].is_alive(), name


def test_a_local_worker_expires_leases_every_interval_unless_told_not_to(settings):
    registry = unit_registry()
    assert Worker(registry=registry).lease_expiry_interval_ms == 5_000  # the setting's default
    assert Worker(registry=registry, lease_expiry_interval_ms=200).lease_expiry_interval_ms == 200
    assert Worker(registry=registry, expire_leases=False).lease_expiry_interval_ms is None
    settings.PARALLEL_MCP = {"WORKER_LEASE_EXPIRY_INTERVAL_MS": None}
    assert Worker(registry=registry).lease_expiry_interval_ms is None
    settings.PARALLEL_MCP = {"WORKER_LEASE_EXPIRY_INTERVAL_MS": 750}
    assert Worker(registry=registry).lease_expiry_interval_ms == 750
    with pytest.raises(ValidationError, match="lease_expiry_interval_ms"):
        Worker(registry=registry, lease_expiry_interval_ms=0)


def test_a_remote_worker_never_expires_leases():
    from parallel_mcp.worker.remote import RemoteOrchestrator

    remote = RemoteOrchestrator(base_url="http://127.0.0.1:9/api/pmcp/", token="t")
    worker = Worker(orchestrator=remote, registry=unit_registry(), lease_expiry_interval_ms=100)
    assert worker.lease_expiry_interval_ms is None


@pytest.mark.django_db(transaction=True)
def test_the_summary_counts_each_task_as_what_happened_to_it(caplog):
    """A result the orchestrator refuses (a pause blocked by nothing, an empty failure, an
    unstorable output) fails the task: the summary says failed, not paused or completed."""
    orch = Orchestrator()
    run = orch.create_run(namespace="units")
    registry = unit_registry()
    registry.register("unit.pause_on_nothing", lambda ctx: Paused("blocked", blocked_by=[]))
    registry.register("unit.fail_empty", lambda ctx: Failed(error=""))
    registry.register("unit.unstorable", lambda ctx: {"not json": object()})
    registry.register("unit.pause", lambda ctx: Paused("waiting_input", reason="ask"))
    kinds = ["unit.pause_on_nothing", "unit.fail_empty", "unit.unstorable", "unit.pause"]
    tasks = {kind: orch.enqueue_task(run_id=run.id, kind=kind) for kind in kinds}
    worker = Worker(orchestrator=orch, registry=registry, burst=True, listen=False)
    with caplog.at_level("INFO", logger="parallel_mcp.worker"):
        assert run_in_thread(worker) == 0
    statuses = {kind: Task.objects.get(pk=task.id).status for kind, task in tasks.items()}
    assert statuses == {
        "unit.pause_on_nothing": "failed",
        "unit.fail_empty": "failed",
        "unit.unstorable": "failed",
        "unit.pause": "waiting_input",
    }
    s = worker.stats
    assert (s.claimed, s.completed, s.failed, s.paused, s.released, s.lost) == (4, 0, 3, 1, 0, 0)
    assert "claimed 4, completed 0, failed 3, paused 1, released 0, lost 0" in caplog.text


# -- run counters left to fold (PostgreSQL) ----------------------------------------------------


def _run_counts(run_id) -> tuple[int, int]:
    run = Run.objects.get(pk=run_id)
    return run.tasks_active, run.tasks_completed


def _worker_on_a_held_run(
    monkeypatch, handle, *, tasks: int = 2, burst: bool = True
) -> tuple[Worker, object, Mock, object]:
    """A one-slot worker on a run of ``tasks`` ``unit.gate`` tasks (``input["second"]`` True
    for all but the first) whose run row another transaction holds (tests/run_lock_support)
    until ``handle(ctx, holder)`` lets it go, with ``fold_runs`` watched; returns the worker (to
    run), the run, the watch and the holder."""
    from parallel_mcp.services import write as write_module
    from tests.run_lock_support import RunLockHolder

    orch = Orchestrator()
    run = orch.create_run(namespace="units")
    for index in range(tasks):
        orch.enqueue_task(run_id=run.id, kind="unit.gate", input={"second": index > 0})
    holder = RunLockHolder(run.id)
    holder.start()
    assert holder.holding.wait(10)
    registry = HandlerRegistry()
    registry.register("unit.gate", lambda ctx: handle(ctx, holder))
    watch = Mock(wraps=write_module.fold_runs)
    monkeypatch.setattr(write_module, "fold_runs", watch)
    worker = quiet_worker(orch, registry, concurrency=1, burst=burst)
    return worker, run, watch, holder


@pytest.mark.django_db(transaction=True)
def test_a_cycle_counted_by_delta_row_is_absorbed_by_the_next_without_a_fold(monkeypatch):
    """The first completion finds its run row held: counted by delta row, its fold left to the
    claimer. The second task's handler lets the row go, so the next cycle counts the run in
    place, that delta row included: no fold transaction at all. (Folding right after the
    commit, as before, waited for the row that only the next task would let go.)"""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite counts in the write itself")
    monkeypatch.setattr(loop, "FOLD_GRACE_MS", 60_000)  # the next cycle always comes first

    def handle(ctx, holder):
        if ctx.input["second"]:
            holder.release.set()
            holder.join(10)

    worker, run, watch, _ = _worker_on_a_held_run(monkeypatch, handle)
    assert run_in_thread(worker) == 0

    watch.assert_not_called()
    assert worker.stats.completed == 2
    assert _run_counts(run.id) == (0, 2)
    assert Run.objects.get(pk=run.id).status == "completed"
    assert not RunDelta.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_counts_left_to_fold_are_folded_while_a_long_task_runs(monkeypatch):
    """A completion counted by delta row, then a task that runs longer than FOLD_GRACE_MS: the
    claimer folds the run meanwhile, so the run's counters do not wait for that task."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite counts in the write itself")
    seen: list = []

    def handle(ctx, holder):
        if ctx.input["second"]:
            holder.release.set()  # the first completion has committed (by delta row)
            deadline = time.monotonic() + 10
            while _run_counts(ctx.task.run_id) != (1, 1) and time.monotonic() < deadline:
                time.sleep(0.01)
            seen.append(_run_counts(ctx.task.run_id))

    worker, run, watch, _ = _worker_on_a_held_run(monkeypatch, handle)
    assert run_in_thread(worker) == 0

    assert seen == [(1, 1)]  # folded while the second task still ran
    assert [call.kwargs["run_ids"] for call in watch.call_args_list] == [[run.id]]
    assert _run_counts(run.id) == (0, 2)
    assert Run.objects.get(pk=run.id).status == "completed"
    assert not RunDelta.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_counts_left_to_fold_are_folded_before_the_worker_waits_for_work(monkeypatch):
    """The run's last completion is counted by delta row and nothing is left to claim: the
    idle worker folds the run before it waits, so the run completes while the worker runs."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite counts in the write itself")
    worker, run, watch, holder = _worker_on_a_held_run(
        monkeypatch, lambda ctx, holder: None, tasks=1, burst=False
    )
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while Task.objects.get(run_id=run.id).status != "completed":
            assert time.monotonic() < deadline, "the task was not completed"
            time.sleep(0.01)
        assert RunDelta.objects.filter(run_id=run.id).count() == 1  # counted by delta row
        holder.release.set()
        while Run.objects.get(pk=run.id).status != "completed":
            assert time.monotonic() < deadline, "the idle worker did not fold the run"
            time.sleep(0.01)
        assert thread.is_alive()  # folded while waiting for work, not when stopping
    finally:
        worker.request_stop()
        thread.join(10)
        connections.close_all()
    assert [call.kwargs["run_ids"] for call in watch.call_args_list] == [[run.id]]
    assert _run_counts(run.id) == (0, 1)
    assert not RunDelta.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_capped_runs_fold_is_due_at_once_while_the_worker_keeps_finding_work(monkeypatch):
    """A capped run (``max_parallel=1``) whose first completion is counted by delta row: the
    slot it freed is handed out by the run's fold, which the claimer does right after that
    cycle, not after ``FOLD_GRACE_MS`` (here a minute) or a short look (none comes while an
    uncapped run has work): the capped run's second task runs long before the other run's
    tasks are done."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite counts in the write itself")
    from tests.run_lock_support import run_row_held

    monkeypatch.setattr(loop, "FOLD_GRACE_MS", 60_000)
    orch = Orchestrator()
    capped = orch.create_run(namespace="units", max_parallel=1)
    first = orch.enqueue_task(run_id=capped.id, kind="unit.echo", input={"n": 1}, priority=9)
    second = orch.enqueue_task(run_id=capped.id, kind="unit.echo", input={"n": 2}, priority=9)
    plain = orch.create_run(namespace="units")
    orch.enqueue_tasks(run_id=plain.id, tasks=[{"kind": "unit.echo"}] * 300)
    worker = quiet_worker(orch, unit_registry(), concurrency=2)
    committed = Task.objects.filter(pk=first.id, status="completed").exists
    with run_row_held(capped.id, until=committed):  # the first completion counts by delta row
        assert run_in_thread(worker) == 0

    completions = Event.objects.filter(event_type="task.completed")
    second_done = completions.get(task_id=second.id).id
    after = completions.filter(run_id=plain.id, id__gt=second_done).count()
    assert after >= 100, f"the capped run's slot waited: {after} other tasks completed after it"
    assert worker.stats.completed == 302
    assert Run.objects.get(pk=capped.id).status == "completed"
    assert not RunDelta.objects.exists()


@pytest.mark.django_db(transaction=True)
def test_a_burst_worker_folds_before_its_last_look_so_a_capped_runs_slot_is_not_left(
    monkeypatch,
):
    """A run with ``max_parallel=1``: the first completion, counted by delta row, frees the slot
    that only its fold hands to the second task. A look that came up short folds first and
    looks again, so the burst worker takes the second task instead of stopping with it queued."""
    if connection.vendor != "postgresql":
        pytest.skip("SQLite counts in the write itself")
    from parallel_mcp.services import write as write_module
    from tests.run_lock_support import run_row_held

    orch = Orchestrator()
    run = orch.create_run(namespace="units", max_parallel=1)
    first = orch.enqueue_task(run_id=run.id, kind="unit.echo", input={"n": 1})
    orch.enqueue_task(run_id=run.id, kind="unit.echo", input={"n": 2})
    watch = Mock(wraps=write_module.fold_runs)
    monkeypatch.setattr(write_module, "fold_runs", watch)
    worker = quiet_worker(orch, unit_registry(), concurrency=1)
    committed = Task.objects.filter(pk=first.id, status="completed").exists
    with run_row_held(run.id, until=committed):  # the first completion counts by delta row
        assert run_in_thread(worker) == 0

    assert watch.call_count >= 1
    assert sorted(Task.objects.filter(run_id=run.id).values_list("status", flat=True)) == [
        "completed",
        "completed",
    ]
    assert worker.stats.completed == 2
    assert Run.objects.get(pk=run.id).status == "completed"
    assert not RunDelta.objects.exists()

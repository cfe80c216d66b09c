"""The SQLite write gate (services/gate.py): writers queue on it, across processes."""

from __future__ import annotations

import os
import threading
import time

import pytest
from django.db import connection, connections, transaction

from parallel_mcp import Orchestrator
from parallel_mcp.services import gate

pytestmark = pytest.mark.skipif(
    connection.vendor != "sqlite", reason="the gate exists for SQLite only"
)

fcntl = pytest.importorskip("fcntl")


@pytest.mark.django_db(transaction=True)
def test_a_write_waits_while_another_process_holds_the_gate():
    orch = Orchestrator()
    run = orch.create_run()
    lock_path = f"{os.path.abspath(connection.settings_dict['NAME'])}.pmcp-lock"
    assert os.path.exists(lock_path), "the first write should have created the gate file"
    # Another open file description conflicts like another process would.
    holder = os.open(lock_path, os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)
    done = threading.Event()

    def enqueue() -> None:
        try:
            Orchestrator().enqueue_task(run_id=run.id, kind="k")
        finally:
            connections.close_all()
            done.set()

    started = time.monotonic()
    threading.Thread(target=enqueue, daemon=True).start()
    assert not done.wait(0.5), "the write went through while the gate was held"
    fcntl.flock(holder, fcntl.LOCK_UN)
    os.close(holder)
    assert done.wait(10)
    assert time.monotonic() - started >= 0.5
    assert orch.get_run(run_id=run.id).tasks_total == 1


@pytest.mark.django_db(transaction=True)
def test_inside_a_callers_transaction_the_gate_is_not_taken():
    """The connection may already hold SQLite's lock: waiting for the gate could deadlock."""
    orch = Orchestrator()
    run = orch.create_run()
    lock_path = f"{os.path.abspath(connection.settings_dict['NAME'])}.pmcp-lock"
    holder = os.open(lock_path, os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        with transaction.atomic():
            orch.enqueue_task(run_id=run.id, kind="k")  # would hang if it took the gate
    finally:
        fcntl.flock(holder, fcntl.LOCK_UN)
        os.close(holder)
    assert orch.get_run(run_id=run.id).tasks_total == 1


def test_an_unwritable_directory_leaves_writes_to_sqlites_own_lock(tmp_path, caplog, monkeypatch):
    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(gate.os, "open", refuse)
    unit = gate.SqliteWriteGate(str(tmp_path / "db.sqlite3"))
    with unit.held():
        pass
    with unit.held():  # still usable, and it does not try (and warn) on every write
        pass
    assert caplog.text.count("no SQLite write gate") == 1

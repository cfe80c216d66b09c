"""``dumpdata`` and ``loaddata``: a backup loads back, and a SQLite database moves to
PostgreSQL (docs/upgrading.md, "Moving to PostgreSQL"). The lease view takes its own rows
back as no-ops (migration 0015) and refuses a lease its attempt does not show."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import DatabaseError, connection

from parallel_mcp import Orchestrator
from parallel_mcp.models import Attempt, Event, Lease, Run
from parallel_mcp.services.tokens import authenticate_token
from tests.subprocesses import REPO
from tests.workload import seed_every_kind_of_row

WORKLOAD = [sys.executable, "-m", "tests.workload"]
APPS = ["auth.user", "parallel_mcp"]  # what the seed writes (its API token has a user)


def _dump(path: Path, *exclude: str) -> list[dict[str, Any]]:
    call_command("dumpdata", *APPS, exclude=list(exclude), output=str(path))
    return _same_instants(json.loads(path.read_text()))


def _same_instants(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Dumped items with "…:07.000Z" read as "…:07Z": Django writes milliseconds, so a time
    dumped with under a millisecond's fraction loads back with none and dumps shorter."""
    for item in items:
        for name, value in item["fields"].items():
            if isinstance(value, str) and re.fullmatch(r"\d{4}-.*T.*\.000Z", value):
                item["fields"][name] = value.replace(".000Z", "Z")
    return items


def _go_on_working(orch: Orchestrator) -> None:
    """What a worker does next on the loaded database: its events follow the loaded ones."""
    last = Event.objects.order_by("-id").values_list("id", flat=True).first()
    claim = orch.claim_next_task(worker_id="after", kinds=["k"])
    assert claim is not None
    orch.complete_task(task_id=claim.task.id, lease_id=claim.lease.id, worker_id="after")
    page = orch.list_events_since(after_id=last)
    assert [event.event_type for event in page.events][:2] == ["task.claimed", "task.completed"]
    assert Lease.objects.get(pk=claim.lease.id).status == "released"
    token = Attempt.objects.get(client_token="claim-1")  # the seed's: replayed, not taken again
    replay = orch.claim_next_task(worker_id=token.worker_id, kinds=["k"], client_token="claim-1")
    assert replay is not None and replay.lease.id == token.id


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("exclude", [(), ("parallel_mcp.lease",)], ids=["plain", "no-leases"])
def test_a_dump_loads_back_into_an_emptied_database(tmp_path, exclude):
    seed_every_kind_of_row()
    leases = list(Lease.objects.order_by("id").values())
    dumped = _dump(tmp_path / "pmcp.json", *exclude)
    assert any(item["model"] == "parallel_mcp.lease" for item in dumped) == (not exclude)
    call_command("flush", interactive=False, verbosity=0)
    assert not Run.objects.exists()
    call_command("loaddata", str(tmp_path / "pmcp.json"), verbosity=0)
    assert _dump(tmp_path / "again.json", *exclude) == dumped
    # Dumped timestamps keep milliseconds; each lease reads its attempt's.
    assert [lease["id"] for lease in Lease.objects.order_by("id").values()] == [
        lease["id"] for lease in leases
    ]
    _go_on_working(Orchestrator())


@pytest.mark.django_db(transaction=True)
def test_loading_a_dump_over_its_own_rows_changes_nothing(tmp_path):
    seed_every_kind_of_row()
    dumped = _dump(tmp_path / "pmcp.json")
    call_command("loaddata", str(tmp_path / "pmcp.json"), verbosity=0)
    assert _dump(tmp_path / "again.json") == dumped


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("change", [{"worker_id": "intruder"}, {"status": "expired"}])
def test_a_lease_its_attempt_does_not_show_is_refused_and_nothing_is_loaded(tmp_path, change):
    seed_every_kind_of_row()
    dumped = _dump(tmp_path / "pmcp.json")
    lease = next(item for item in dumped if item["model"] == "parallel_mcp.lease")
    lease["fields"].update(change)
    (tmp_path / "tampered.json").write_text(json.dumps(dumped))
    call_command("flush", interactive=False, verbosity=0)
    refusal = "read-only view of pmcp_attempt. .* dump with every writer stopped"
    with pytest.raises(DatabaseError, match=refusal):
        call_command("loaddata", str(tmp_path / "tampered.json"), verbosity=0)
    assert not Attempt.objects.exists() and not Run.objects.exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("form", ["json", "jsonl"])
def test_a_sqlite_database_moves_to_postgresql(tmp_path, form):
    """The steps of docs/upgrading.md: migrate the new database, dump the old one, load it.
    Every row reads back as SQLite held it, and work goes on."""
    if connection.vendor != "postgresql":
        pytest.skip("the move's target is PostgreSQL")
    env = {
        **os.environ,
        "PMCP_TEST_DB": "sqlite",
        "PMCP_DB_NAME": str(tmp_path / "old.sqlite3"),
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    manage = [sys.executable, "-m", "django"]
    fixture = tmp_path / f"project.{form}"
    # The docs' dump of the whole project, and ours of what we compare.
    whole = [
        *manage, "dumpdata", "--natural-foreign", "--exclude", "contenttypes", "--exclude",
        "auth.permission", "--exclude", "sessions", "--format", form, "-o", str(fixture),
    ]  # fmt: skip
    compared = [*manage, "dumpdata", *APPS, "-o", str(tmp_path / "compared.json")]
    secret = ""
    for command in ([*manage, "migrate", "-v0"], [*WORKLOAD, "seed"], whole, compared):
        done = subprocess.run(
            command, cwd=REPO, env=env, check=True, capture_output=True, text=True, timeout=120
        )
        secret = secret or done.stdout.strip()
    from_sqlite = _same_instants(json.loads((tmp_path / "compared.json").read_text()))
    assert {item["model"] for item in from_sqlite} >= {
        "parallel_mcp.run", "parallel_mcp.task", "parallel_mcp.attempt", "parallel_mcp.lease",
        "parallel_mcp.event", "parallel_mcp.contextsnapshot", "parallel_mcp.clienttokenrecord",
        "parallel_mcp.toolcall", "parallel_mcp.apitoken", "auth.user",
    }  # fmt: skip
    call_command("flush", interactive=False, verbosity=0)
    call_command("loaddata", str(fixture), verbosity=0)
    assert _dump(tmp_path / "new.json") == from_sqlite
    token = authenticate_token(using="default", secret=secret)
    assert token is not None and token.user.username == "seed-user"
    _go_on_working(Orchestrator())

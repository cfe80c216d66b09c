"""schemathesis over every operation of the live OpenAPI schema, against a live server: every
phase (examples, coverage, fuzzing, stateful), every check (positive_data_acceptance and
negative_data_rejection included, plus the error envelope of tests/schemathesis_hooks.py), a
fixed seed and a bounded number of cases (tests/schemathesis.toml). It must find nothing: the
schema states every rule the API applies, and the API accepts everything the schema allows."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tomllib
from datetime import timedelta
from pathlib import Path

import pytest
from django.core.cache import cache

from parallel_mcp import Orchestrator
from tests.api_helpers import make_user, openapi_schema, token_for
from tests.schemathesis_hooks import documented_data_refusal
from tests.subprocesses import REPO

CONFIG = Path(__file__).with_name("schemathesis.toml")
SETTINGS = tomllib.loads(CONFIG.read_text())
RUN_IDS = SETTINGS["dictionaries"]["run_ids"]["values"]
TASK_IDS = SETTINGS["dictionaries"]["task_ids"]["values"]
WORKER_ID = "host-1:4242:0"  # the worker of the schema's examples


def seed_rows() -> None:
    """Runs and tasks with the ids the schemathesis config draws path parameters from, in
    the states the operations act on: queued, leased, dead, waiting for input, completed."""
    orch = Orchestrator()
    run = orch.create_run(id=RUN_IDS[0], namespace="fuzz", context={"seed": True})
    orch.create_run(id=RUN_IDS[1], namespace="fuzz")
    queued, leased, dead, waiting, completed = TASK_IDS
    orch.enqueue_task(run_id=run.pk, id=queued, kind="site.apply", input={"region": "eu"})
    for task_id, kind in ((leased, "fuzz.leased"), (waiting, "fuzz.waiting")):
        orch.enqueue_task(run_id=run.pk, id=task_id, kind=kind)
    orch.enqueue_task(run_id=run.pk, id=dead, kind="fuzz.dead", max_attempts=1)
    orch.enqueue_task(run_id=run.pk, id=completed, kind="fuzz.completed")
    hour = int(timedelta(hours=1).total_seconds() * 1000)

    def claim(kind: str):
        return orch.claim_next_task(worker_id=WORKER_ID, kinds=[kind], lease_ms=hour)

    claim("fuzz.leased")
    lease = claim("fuzz.dead")
    orch.fail_task(
        task_id=dead, lease_id=lease.lease.pk, worker_id=WORKER_ID, error="x", retry=True
    )
    lease = claim("fuzz.waiting")
    orch.pause_task(
        task_id=waiting, lease_id=lease.lease.pk, worker_id=WORKER_ID, status="waiting_input"
    )
    lease = claim("fuzz.completed")
    orch.complete_task(task_id=completed, lease_id=lease.lease.pk, worker_id=WORKER_ID)


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_schemathesis_finds_nothing(live_server, settings, tmp_path):
    # Short streams (the stream operation is called hundreds of times) and no rate limit.
    settings.PARALLEL_MCP_API = {
        "SSE_DEFAULT_SECONDS": 0,
        "SSE_MAX_SECONDS": 0.1,
        "SSE_POLL_SECONDS": 0.01,
    }
    settings.REST_FRAMEWORK = {
        **settings.REST_FRAMEWORK,
        "DEFAULT_THROTTLE_RATES": {"pmcp": None, "pmcp_worker": None},
    }
    cache.clear()
    seed_rows()
    token = token_for(make_user("fuzzer", superuser=True))
    report = tmp_path / "report.json"

    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "--config-file",
            str(CONFIG),
            "run",
            f"{live_server.url}/api/pmcp/schema/",
            "--no-color",
            "--report",
            "json",
            "--report-json-path",
            str(report),
            # More exploration by hand, e.g. PMCP_FUZZ_ARGS="--seed 7 --max-examples 100".
            *shlex.split(os.environ.get("PMCP_FUZZ_ARGS", "")),
        ],
        cwd=tmp_path,  # schemathesis and hypothesis keep caches in the working directory
        env={**os.environ, "PMCP_FUZZ_TOKEN": token, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=1200,
    )

    lines = (result.stdout + result.stderr).splitlines()
    output = "\n".join(line[:500] for line in lines[-400:])  # curl lines can be megabytes
    assert result.returncode == 0, output
    summary = json.loads(report.read_text())
    operations = sum(len(item) for item in openapi_schema()["paths"].values())
    assert summary["operations"] == {
        "total": operations,
        "selected": operations,
        "tested": operations,
        "errored": 0,
        "skipped": 0,
        "skip_reasons": [],
    }
    assert {name: phase["status"] for name, phase in summary["phases"].items()} == {
        "examples": "success",
        "coverage": "success",
        "fuzzing": "success",
        "stateful": "success",
    }
    assert summary["failures"] == [] and summary["errors"] == []


# -- the hook that accepts documented data-dependent refusals -----------------------------------


def _refused(code: str, field: str | None = None) -> dict:
    details = {} if field is None else {"field": field}
    return {"error": {"code": code, "message": "…", "details": details}}


def test_only_the_refusals_an_operation_documents_are_expected():
    schema = openapi_schema()
    runs = schema["paths"]["/api/pmcp/runs"]
    enqueue = schema["paths"]["/api/pmcp/runs/{run_id}/tasks"]["post"]
    assert documented_data_refusal(runs["get"], 400, _refused("validation_error", "cursor"))
    assert not documented_data_refusal(runs["get"], 400, _refused("validation_error", "limit"))
    assert not documented_data_refusal(runs["get"], 400, _refused("invalid_dependency"))
    assert not documented_data_refusal(runs["get"], 409, _refused("validation_error", "cursor"))
    assert not documented_data_refusal(runs["post"], 400, _refused("validation_error", "id"))
    assert documented_data_refusal(enqueue, 400, _refused("invalid_dependency"))
    assert documented_data_refusal(enqueue, 400, _refused("dependency_cycle"))
    assert documented_data_refusal(
        enqueue, 400, _refused("validation_error", "context_snapshot_id")
    )
    assert not documented_data_refusal(enqueue, 400, _refused("validation_error", "kind"))
    assert not documented_data_refusal(enqueue, 400, {"detail": "not the envelope"})

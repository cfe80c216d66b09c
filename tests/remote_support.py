"""Helpers of the remote-orchestrator tests: tokens, a client of the live server, a remote
``pmcp_worker --api`` subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from parallel_mcp.worker.remote import RemoteOrchestrator
from tests.api_helpers import VIEW_PERMS, WORKER_PERMS, make_user, token_for
from tests.subprocesses import REPO

# Nothing listens on the discard port: every request fails to connect.
UNREACHABLE = "http://127.0.0.1:9/api/pmcp/"


def worker_token(name: str = "remote-worker") -> str:
    """A ``worker`` token of a user holding only ``work_tasks``: the worker protocol only (its
    role would allow reads, its user may not)."""
    return token_for(make_user(name, WORKER_PERMS), role="worker")


def reading_worker_token(name: str = "reading-worker") -> str:
    """What docs/workers.md recommends for remote workers whose handlers read through
    ``ctx.orchestrator``: a ``worker`` token of a user holding ``work_tasks`` and the view
    permissions."""
    return token_for(make_user(name, [*WORKER_PERMS, *VIEW_PERMS]), role="worker")


def root_token(name: str = "remote-root") -> str:
    return token_for(make_user(name, superuser=True))


def remote_for(live_server: Any, token: str, **kwargs: Any) -> RemoteOrchestrator:
    return RemoteOrchestrator(base_url=f"{live_server.url}/api/pmcp/", token=token, **kwargs)


def remote_worker_env(token: str, settings: str = "tests.remote_worker_settings") -> dict:
    env = dict(os.environ)
    env["DJANGO_SETTINGS_MODULE"] = settings
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    env["PMCP_API_TOKEN"] = token
    return env


def worker_command(url: str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "django", "pmcp_worker", "--api", url, *extra]


def run_remote_worker(
    url: str, token: str, *extra: str, settings: str = "tests.remote_worker_settings"
) -> subprocess.CompletedProcess:
    """A burst remote worker (3 slots, 5 s leases) against the API at ``url``, to the end."""
    return subprocess.run(
        worker_command(url, "--burst", "--concurrency", "3", "--lease-ms", "5000", *extra),
        cwd=REPO,
        env=remote_worker_env(token, settings),
        capture_output=True,
        text=True,
        timeout=120,
    )

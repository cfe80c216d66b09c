"""Helpers to start test subprocesses against the current test database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from django.db import connection

REPO = Path(__file__).resolve().parent.parent


def subprocess_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PMCP_DB_NAME"] = str(connection.settings_dict["NAME"])
    env["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


def start(*args: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.workload", *args],
        cwd=REPO,
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_all(processes: list[subprocess.Popen], timeout: float = 180) -> list[str]:
    outputs = []
    for process in processes:
        out, err = process.communicate(timeout=timeout)
        assert process.returncode == 0, f"subprocess failed ({process.returncode}):\n{err}"
        outputs.append(out)
    return outputs

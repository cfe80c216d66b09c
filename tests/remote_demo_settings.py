"""A remote worker process with the example project's demo handlers (and no database)."""

import sys
from pathlib import Path

from tests.remote_worker_settings import *  # noqa: F403

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "example_project"))

INSTALLED_APPS = [*INSTALLED_APPS, "demo"]  # noqa: F405

"""The example project as a user of a checkout runs it (its own settings and SQLite file, a
real ``runserver``): DEBUG off unless asked, no page framable, static files served by
``make serve``, the production settings sample clean under ``check --deploy``, and the demo
running on Django alone, as ``make demo`` installs it."""

from __future__ import annotations

import os
import re
import secrets
import sqlite3
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.docs_support import REPO, example_env, live_server, manage

pytestmark = [
    pytest.mark.slow,
    pytest.mark.django_entry,
    pytest.mark.skipif(
        os.environ.get("PMCP_TEST_DB") == "postgres",
        reason="the example project runs on its own SQLite file",
    ),
]

VENV = Path(sys.executable).parent.parent


def get(url: str) -> tuple[int, dict[str, str], str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode()


@pytest.fixture
def env(tmp_path):
    env = example_env(tmp_path / "example.sqlite3")
    manage("migrate", "--noinput", env=env)
    return env


def make_dry_run(target: str, venv: Path = VENV) -> list[str]:
    """The commands ``make TARGET`` would run (``make -n``: nothing is run)."""
    result = subprocess.run(
        ["make", "-n", "-B", target, f"VENV={venv}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


def test_debug_is_off_unless_DJANGO_DEBUG_turns_it_on(env):
    with live_server(env) as url:
        status, _, body = get(f"{url}/no-such-page")
    assert status == 404
    assert "URLconf" not in body and "example_project" not in body  # not the debug page

    with live_server({**env, "DJANGO_DEBUG": "1"}) as url:
        status, _, body = get(f"{url}/no-such-page")
    assert status == 404 and "URLconf" in body  # the switch works


def test_no_page_can_be_framed(env):
    with live_server(env) as url:
        for path in ("/admin/login/", "/api/pmcp/docs/", "/no-such-page"):
            status, headers, _ = get(f"{url}{path}")
            assert headers.get("X-Frame-Options") == "DENY", (path, status, headers)


def test_make_serve_serves_the_admin_css_with_debug_off(env):
    (command,) = [line for line in make_dry_run("serve") if " runserver " in line]
    options = [word for word in command.split()[3:] if word.startswith("--")]
    assert "127.0.0.1:8000" in command
    with live_server(env) as url:  # without the Makefile's options, DEBUG off serves none
        assert get(f"{url}/static/admin/css/base.css")[0] == 404
    with live_server(env, *options) as url:
        status, headers, body = get(f"{url}/static/admin/css/base.css")
        assert status == 200 and "text/css" in headers["Content-Type"], (status, body[:200])
        login, _, page = get(f"{url}/admin/login/")
        assert login == 200 and "/static/admin/css/base.css" in page


def production_env(env: dict[str, str]) -> dict[str, str]:
    return {
        **env,
        "DJANGO_SETTINGS_MODULE": "example_project.settings_production",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_ALLOWED_HOSTS": "pmcp.example.com, www.pmcp.example.com",
    }


def test_the_production_sample_passes_check_deploy_without_a_warning(env):
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=production_env(env))
    assert result.stdout.strip() == "System check identified no issues (0 silenced).", (
        result.stdout + result.stderr
    )
    # and the laptop settings are what it guards against
    laptop = manage("check", "--deploy", env=env)
    assert "security.W009" in laptop.stderr  # the example's secret key


@pytest.mark.parametrize("variable", ["DJANGO_SECRET_KEY", "DJANGO_ALLOWED_HOSTS"])
def test_the_production_sample_refuses_to_start_without_its_environment(env, variable):
    missing = {key: value for key, value in production_env(env).items() if key != variable}
    result = manage("check", env=missing, check=False)
    assert result.returncode == 1
    assert f"ImproperlyConfigured: Set the environment variable {variable}" in result.stderr


def test_make_demo_installs_the_project_without_extras_and_make_test_with_them(tmp_path):
    fresh = tmp_path / "venv"  # nothing is installed: make -n only prints
    demo = [line for line in make_dry_run("demo", fresh) if " pip install " in line]
    assert demo == [f"{fresh}/bin/python -m pip install -e ."]
    test = [
        line
        for line in make_dry_run("test", fresh)
        if line.startswith(f"{fresh}/bin/python -m pip install ")  # not the Django 6 venv's
    ]
    assert test == [f"{fresh}/bin/python -m pip install -e '.[test,postgres,api,mcp]'"]
    serve = [line for line in make_dry_run("serve", fresh) if " pip install " in line]
    assert serve == [f"{fresh}/bin/python -m pip install -e '.[api]'"]


def test_the_demo_runs_end_to_end_on_django_alone(tmp_path):
    """``make demo`` as a new user gets it: Django only (Django REST framework and the MCP SDK
    hidden from every process), no terminal, the whole run to the end."""
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import sys\n"
        "for name in ('rest_framework', 'drf_spectacular', 'drf_spectacular_sidecar', 'mcp'):\n"
        "    sys.modules[name] = None  # import fails, find_spec finds nothing\n"
    )
    database = tmp_path / "demo.sqlite3"
    env = example_env(database)
    env["PYTHONPATH"] = os.pathsep.join([str(hide), env["PYTHONPATH"]])
    hidden = subprocess.run(
        [sys.executable, "-c", "import rest_framework"], env=env, capture_output=True, text=True
    )
    assert hidden.returncode == 1 and "ModuleNotFoundError" in hidden.stderr
    result = subprocess.run(
        [sys.executable, "example_project/demo.py", f"--log-dir={tmp_path / 'logs'}"],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    assert "\x1b" not in result.stdout  # no terminal: plain lines
    assert "tasks: 12 completed" in result.stdout
    assert "worker-1 exit 0, worker-2 exit 0, expire-leases exit 0" in result.stdout
    assert re.search(r"user admin, password \S+", result.stdout)
    with sqlite3.connect(database) as db:
        runs = db.execute("SELECT status, tasks_total, tasks_completed FROM pmcp_run").fetchall()
        retried = db.execute(
            "SELECT key, attempt_count FROM pmcp_task WHERE kind IN ('demo.flaky', 'demo.approve')"
            " ORDER BY key"
        ).fetchall()
    assert runs == [("completed", 12, 12)]
    assert retried == [("approve", 2), ("flaky", 2)]
    assert {path.name for path in (tmp_path / "logs").iterdir()} == {
        "worker-1.log",
        "worker-2.log",
        "expire-leases.log",
    }


def test_the_production_sample_behind_its_proxy(env):
    """Through the WSGI application: plain HTTP is redirected, HTTPS (as the proxy reports it)
    is served with HSTS and secure cookies, an unknown host is refused."""
    script = """
from django.test import Client
from example_project.wsgi import application  # noqa: F401 - the module a server loads
client = Client()
plain = client.get("/admin/login/", HTTP_HOST="pmcp.example.com")
print(plain.status_code, plain.headers.get("Location"))
secure = client.get(
    "/admin/login/", HTTP_HOST="pmcp.example.com", HTTP_X_FORWARDED_PROTO="https"
)
print(secure.status_code, secure.headers.get("Strict-Transport-Security"))
print(secure.cookies["csrftoken"]["secure"], secure.headers.get("X-Frame-Options"))
print(client.get("/admin/login/", HTTP_HOST="evil.example", HTTP_X_FORWARDED_PROTO="https")
      .status_code)
"""
    result = manage("shell", "--no-imports", "-c", script, env=production_env(env))
    assert result.stdout.splitlines() == [
        "301 https://pmcp.example.com/admin/login/",
        "200 max-age=31536000; includeSubDomains; preload",
        "True DENY",
        "400",
    ], result.stderr


def test_the_admin_shows_parallel_mcps_pages(env):
    """What the README's quick start says `make serve` shows at /admin/."""
    script = """
from django.contrib.auth import get_user_model
from django.test import Client
client = Client()
client.force_login(get_user_model().objects.create_superuser("admin", "a@example.com", "pw"))
page = client.get("/admin/", HTTP_HOST="127.0.0.1").content.decode()
for model in ("run", "task", "event", "contextsnapshot"):
    print(model, f"/admin/parallel_mcp/{model}/" in page)
"""
    result = manage("shell", "--no-imports", "-c", script, env=env)
    assert result.stdout.split() == [
        *("run", "True", "task", "True", "event", "True", "contextsnapshot", "True")
    ], result.stderr

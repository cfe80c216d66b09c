"""``manage.py pmcp_mcp``: option checks with one-line errors, and the refusal to serve a
non-loopback address without tokens."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError

from parallel_mcp.mcp.hosts import is_loopback
from parallel_mcp.services.tokens import create_token, revoke_token
from tests.mcp_support import SERVER, free_port
from tests.subprocesses import REPO, subprocess_env


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"transport": "carrier-pigeon"},
            "--transport must be stdio or http, got 'carrier-pigeon'",
        ),
        ({"transport": "stdio", "host": "127.0.0.1"}, "--host applies only to --transport http"),
        ({"port": "9000"}, "--port applies only to --transport http"),
        (
            {"allow_unauthenticated": True},
            "--allow-unauthenticated applies only to --transport http",
        ),
        ({"transport": "http", "port": "abc"}, "--port must be a whole number, got 'abc'"),
        ({"transport": "http", "port": "0"}, "--port must be > 0, got 0"),
        ({"transport": "http", "port": "70000"}, "--port must be <= 65535, got 70000"),
        ({"transport": "http", "host": "  "}, "--host must not be empty"),
        (
            {"transport": "http", "host": "0.0.0.0", "allow_unauthenticated": True},
            "--allow-unauthenticated is refused on the non-loopback host 0.0.0.0: "
            "bind 127.0.0.1 or use bearer tokens",
        ),
    ],
)
def test_bad_options_are_one_line_command_errors(options, message):
    with pytest.raises(CommandError) as error:
        call_command("pmcp_mcp", **options)
    assert str(error.value) == message
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.1.2.3", False),
        ("example.com", False),
    ],
)
def test_loopback_detection(host, loopback):
    assert is_loopback(host) is loopback


@pytest.mark.django_db
def test_a_non_loopback_host_needs_a_live_token():
    with pytest.raises(CommandError) as error:
        call_command("pmcp_mcp", transport="http", host="0.0.0.0", port="9")
    assert str(error.value).startswith(
        "refusing to serve on the non-loopback host 0.0.0.0 without API tokens"
    )
    user = User.objects.create_user("ops", password="pw")
    issued = create_token(using="default", user=user, name="t")
    revoke_token(using="default", prefix=issued.token.prefix)
    with pytest.raises(CommandError):  # a revoked token does not count
        call_command("pmcp_mcp", transport="http", host="10.0.0.1", port="9")


@pytest.mark.django_db(transaction=True)
def test_the_refusal_exits_non_zero_with_one_line_and_binds_nothing():
    port = free_port()
    result = subprocess.run(
        [*SERVER, "--transport", "http", "--host", "0.0.0.0", "--port", str(port)],
        cwd=REPO,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode != 0
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(
        "CommandError: refusing to serve on the non-loopback host 0.0.0.0 without API tokens"
    )


@pytest.mark.django_db
def test_a_busy_port_is_a_one_line_error():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        with pytest.raises(CommandError) as error:
            call_command("pmcp_mcp", transport="http", port=str(port))
    assert str(error.value).startswith(f"cannot listen on 127.0.0.1:{port}: ")


# Modules of the ``mcp`` extra (and what it pulls in) that the server imports.
MCP_EXTRA_MODULES = ("mcp", "mcp_types", "anyio", "starlette", "uvicorn")


@pytest.fixture
def without_the_mcp_extra(monkeypatch):
    """As if ``pip install 'parallel-mcp[mcp]'`` had not been run: importing those modules
    fails, and the server module is imported afresh."""
    for name in MCP_EXTRA_MODULES:
        monkeypatch.setitem(sys.modules, name, None)
    for name in ("parallel_mcp.mcp.server", "parallel_mcp.mcp.auth"):
        monkeypatch.delitem(sys.modules, name, raising=False)


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_without_the_mcp_extra_the_error_names_the_extra(without_the_mcp_extra, transport):
    with pytest.raises(CommandError) as error:
        call_command("pmcp_mcp", transport=transport)
    message = str(error.value)
    assert "\n" not in message
    assert message.startswith("pmcp_mcp needs the mcp extra (no module named ")
    assert "pip install 'parallel-mcp[mcp]'" in message


def test_a_missing_module_of_our_own_is_not_blamed_on_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "parallel_mcp.mcp.server", None)
    with pytest.raises(ModuleNotFoundError):
        call_command("pmcp_mcp")

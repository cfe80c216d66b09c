"""DNS-rebinding protection of the MCP HTTP transport: every spelling of a loopback bind host
protects alike (a foreign ``Host`` or ``Origin`` is refused, a legitimate one accepted), a
wildcard bind needs ``--allowed-host``, and the check runs before authentication."""

from __future__ import annotations

import socket

import anyio
import httpx2
import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError

from parallel_mcp.management.commands.pmcp_mcp import listen
from parallel_mcp.mcp.auth import HostOriginMiddleware
from parallel_mcp.mcp.hosts import (
    HostPolicy,
    host_policy,
    is_loopback,
    normalize_host,
    resolve_bind,
    split_host_port,
)
from parallel_mcp.services.tokens import create_token
from tests.mcp_support import INITIALIZE, LiveServer

ACCEPT = {"Accept": "application/json, text/event-stream"}

# Every way to say "the loopback interface" that the OS binds, and the address it binds.
LOOPBACK_SPELLINGS = {
    "127.0.0.1": "127.0.0.1",
    "localhost": "127.0.0.1",
    "LOCALHOST": "127.0.0.1",
    "Localhost": "127.0.0.1",
    "localhost.": "127.0.0.1",
    "127.0.0.2": "127.0.0.2",
    "127.1": "127.0.0.1",
    "2130706433": "127.0.0.1",
    "0x7f.0.0.1": "127.0.0.1",
    "::1": "::1",
    "[::1]": "::1",
    "0:0:0:0:0:0:0:1": "::1",
    "::ffff:127.0.0.1": "127.0.0.1",
}
FOREIGN_HOSTS = ("evil.example", "evil.example:{port}", "attacker.localhost:{port}", "10.9.8.7")
FOREIGN_ORIGINS = (
    "http://evil.example",
    "http://evil.example:{port}",
    "https://localhost.evil.example",
    "null",
    "file://",
    "http://user@evil.example",
)


# -- units ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "canonical"),
    [
        ("localhost", "localhost"),
        ("LOCALHOST", "localhost"),
        ("localhost.", "localhost"),
        ("Example.COM.", "example.com"),
        ("127.0.0.1", "127.0.0.1"),
        ("127.0.0.1.", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0x7f.0.0.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("::1", "::1"),
        ("[::1]", "::1"),
        ("0:0:0:0:0:0:0:1", "::1"),
        ("[0:0:0:0:0:0:0:1]", "::1"),
        ("::ffff:127.0.0.1", "127.0.0.1"),
        ("[::FFFF:7f00:1]", "127.0.0.1"),
        ("10.1.2.3", "10.1.2.3"),
        ("", None),
        (".", None),
        ("[localhost]", None),
        ("exa mple.com", None),
        ("127.0.0.1 evil", None),
        ("example.com:80", None),
        ("a..b", None),
    ],
)
def test_host_spellings_normalize(value, canonical):
    assert normalize_host(value) == canonical


@pytest.mark.parametrize("host", [*LOOPBACK_SPELLINGS, "127.255.255.254", "[::ffff:127.0.0.9]"])
def test_every_loopback_spelling_is_loopback(host):
    assert is_loopback(host)


@pytest.mark.parametrize(
    "host", ["0.0.0.0", "::", "10.1.2.3", "example.com", "localhost.example", "::ffff:10.0.0.1"]
)
def test_other_hosts_are_not_loopback(host):
    assert not is_loopback(host)


@pytest.mark.parametrize(("host", "address"), LOOPBACK_SPELLINGS.items())
def test_every_loopback_spelling_binds_loopback(host, address):
    bind = resolve_bind(host, 0)
    assert str(bind.address) == address
    assert bind.loopback and not bind.wildcard


@pytest.mark.parametrize(
    ("value", "parts"),
    [
        ("localhost", ("localhost", None)),
        ("localhost:8765", ("localhost", "8765")),
        ("[::1]:8765", ("[::1]", "8765")),
        ("[::1]", ("[::1]", None)),
        ("::1", None),
        ("::1:8765", None),
        ("[::1]x", None),
        ("[::1", None),
        ("localhost:", None),
        ("localhost:http", None),
        ("localhost:8765:1", None),
    ],
)
def test_host_headers_split(value, parts):
    assert split_host_port(value) == parts


@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS)
def test_the_policy_of_a_loopback_bind(host):
    policy = host_policy(resolve_bind(host, 0))
    for accepted in (
        "127.0.0.1:8765",
        "localhost:8765",
        "LOCALHOST:8765",
        "localhost.:8765",
        "[::1]:8765",
        "localhost",
    ):
        assert policy.allows_host(accepted), (host, accepted)
    for refused in (None, "", "evil.example", "evil.example:8765", "localhost.evil:1", "::1"):
        assert not policy.allows_host(refused), (host, refused)
    for accepted in (None, "http://localhost:3000", "http://127.0.0.1:8765", "https://[::1]"):
        assert policy.allows_origin(accepted), (host, accepted)
    for refused in [origin.format(port=8765) for origin in FOREIGN_ORIGINS] + [
        "ftp://localhost",
        "http://localhost/path",
        "",
    ]:
        assert not policy.allows_origin(refused), (host, refused)


def test_the_policy_of_a_bind_to_a_non_loopback_address():
    policy = host_policy(resolve_bind("10.1.2.3", 0))
    assert policy.names == {"10.1.2.3"}
    assert policy.allows_host("10.1.2.3:8765") and not policy.allows_host("localhost:8765")
    policy = host_policy(resolve_bind("10.1.2.3", 0), ["mcp.example.com"])
    assert policy.allows_host("MCP.example.com.:443")
    assert policy.allows_origin("https://mcp.example.com")
    assert not policy.allows_host("evil.example")


def test_the_policy_of_a_wildcard_bind_is_loopback_and_the_named_hosts():
    for host in ("0.0.0.0", "::"):
        bind = resolve_bind(host, 0)
        assert bind.wildcard and not bind.loopback
        policy = host_policy(bind, ["mcp.example.com"])
        assert policy.names == {"localhost", "127.0.0.1", "::1", "mcp.example.com"}


def test_a_policy_refuses_what_is_not_a_host():
    with pytest.raises(ValueError, match="'evil:80' is not a host name"):
        HostPolicy.of(["evil:80"])


def _asgi_status(policy: HostPolicy, headers: dict[str, str]) -> int:
    reached = []

    async def app(scope, receive, send):
        reached.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    async def request() -> int:
        transport = httpx2.ASGITransport(app=HostOriginMiddleware(app, policy=policy))
        async with httpx2.AsyncClient(transport=transport) as client:
            response = await client.post("http://127.0.0.1:8765/mcp", headers=headers)
        return response.status_code

    status = anyio.run(request)
    assert bool(reached) == (status == 200)  # a refusal never reaches the app
    return status


def test_the_middleware_refuses_before_the_app_sees_the_request():
    policy = host_policy(resolve_bind("LOCALHOST", 0))
    assert _asgi_status(policy, {"Host": "localhost:8765"}) == 200
    assert _asgi_status(policy, {"Host": "evil.example:8765"}) == 421
    assert _asgi_status(policy, {"Host": "localhost", "Origin": "http://evil.example"}) == 403
    assert _asgi_status(policy, {"Host": "localhost", "Origin": "http://localhost:1"}) == 200


# -- the command ------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("host", ["0.0.0.0", "::"])
def test_a_wildcard_bind_needs_allowed_hosts(host):
    user = User.objects.create_user("wildcard", password="pw")
    create_token(using="default", user=user, name="live")  # else the token check refuses first
    with pytest.raises(CommandError) as error:
        call_command("pmcp_mcp", transport="http", host=host, port="9")
    assert str(error.value) == (
        f"--host {host} listens on every address: name the host names clients use with "
        "--allowed-host NAME (the Host header is checked against DNS rebinding)"
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"transport": "http", "allowed_host": ["ok.example,evil:80"]},
            "--allowed-host must be a host name or IP address without a port, got 'evil:80'",
        ),
        (
            {"transport": "http", "allowed_host": ["a,,b"]},
            "--allowed-host must be a comma-separated list without empty items",
        ),
        ({"allowed_host": ["x.example"]}, "--allowed-host applies only to --transport http"),
    ],
)
def test_bad_allowed_hosts_are_one_line_errors(options, message):
    with pytest.raises(CommandError) as error:
        call_command("pmcp_mcp", **options)
    assert str(error.value) == message


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_the_listening_socket_is_tcp_so_replies_are_not_delayed(host):
    """asyncio turns Nagle's algorithm off (TCP_NODELAY) only on sockets created with
    IPPROTO_TCP; without it every keep-alive reply waited ~40 ms for a delayed ACK."""
    sock = listen(resolve_bind(host, 0), 0)
    try:
        assert sock.proto == socket.IPPROTO_TCP
    finally:
        sock.close()


# -- through a real server --------------------------------------------------------------------


def post(server: LiveServer, **headers: str) -> httpx2.Response:
    return httpx2.post(server.url, json=INITIALIZE, headers={**ACCEPT, **headers}, timeout=30)


@pytest.fixture(scope="module")
def loopback_servers(django_db_setup, django_db_blocker):
    """One unauthenticated read-only server per loopback spelling, started a few at a time."""
    servers: dict[str, LiveServer] = {}
    hosts = list(LOOPBACK_SPELLINGS)
    try:
        for start in range(0, len(hosts), 4):
            batch = {
                host: LiveServer("--allow-unauthenticated", "--read-only", host=host, wait=False)
                for host in hosts[start : start + 4]
            }
            servers.update(batch)
            for server in batch.values():
                server.wait_until_listening()
        yield servers
    finally:
        for server in servers.values():
            server.stop()


@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS)
def test_every_loopback_spelling_refuses_foreign_hosts_and_origins(loopback_servers, host):
    server = loopback_servers[host]
    port = server.port
    shown = f"[{server.address}]" if ":" in server.address else server.address
    for foreign in FOREIGN_HOSTS:
        response = post(server, Host=foreign.format(port=port))
        assert response.status_code == 421, (host, foreign, response.text)
        assert response.json()["error"] == "invalid_host"
    for foreign in FOREIGN_ORIGINS:
        response = post(server, Origin=foreign.format(port=port))
        assert response.status_code == 403, (host, foreign, response.text)
        assert response.json()["error"] == "invalid_origin"
    for legitimate in (f"{shown}:{port}", f"localhost:{port}", f"LOCALHOST.:{port}"):
        response = post(server, Host=legitimate, Origin=f"http://{legitimate}")
        assert response.status_code == 200, (host, legitimate, response.text)
        assert "mcp-session-id" in response.headers


@pytest.mark.django_db(transaction=True)
def test_the_host_check_comes_before_the_token_check():
    user = User.objects.create_superuser("hosts-admin", password="pw")
    secret = create_token(using="default", user=user, name="hosts").secret
    server = LiveServer(host="LOCALHOST")
    try:
        good = {"Authorization": f"Bearer {secret}"}
        assert post(server, Host="evil.example", **good).status_code == 421
        response = post(server, Host="evil.example", Authorization="Bearer pmcp_x_y")
        assert response.status_code == 421  # not 401: the token was never looked at
        assert post(server, Host=f"localhost:{server.port}", **good).status_code == 200
        assert post(server, Host=f"localhost:{server.port}").status_code == 401
    finally:
        server.stop()


@pytest.mark.django_db(transaction=True)
def test_a_wildcard_bind_answers_only_its_allowed_hosts():
    user = User.objects.create_superuser("wild-admin", password="pw")
    auth = {"Authorization": f"Bearer {create_token(using='default', user=user, name='w').secret}"}
    server = LiveServer("--allowed-host", "MCP.test.", host="0.0.0.0")
    try:
        for accepted in (f"mcp.test:{server.port}", f"127.0.0.1:{server.port}", "localhost"):
            response = post(server, Host=accepted, Origin="https://mcp.test", **auth)
            assert response.status_code == 200, (accepted, response.text)
        assert post(server, Host="evil.example", **auth).status_code == 421
        assert post(server, Origin="http://evil.example", **auth).status_code == 403
    finally:
        server.stop()

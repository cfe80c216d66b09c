"""The MCP server: ``manage.py pmcp_mcp [--transport stdio|http] [--host H] [--port P]``.

stdio (the default) serves one client on stdin/stdout, as MCP clients such as Claude Desktop
spawn it. http serves streamable HTTP on ``http://HOST:PORT/mcp``; every request needs a bearer
token (``manage.py pmcp_token create``) and a ``Host`` the server answers for (the loopback names
on loopback, the bound address, ``--allowed-host``: see ``mcp/hosts.py``). Logs go to stderr;
stdout carries only the protocol.
"""

from __future__ import annotations

import importlib
import logging
import socket

from django.core.management.base import CommandError
from django.db import connections
from django.utils import timezone

from ...conf import app_settings
from ...mcp.hosts import Bind, HostPolicy, host_policy, normalize_host, resolve_bind
from ..arguments import configure_logging, name_list, positive_int
from ..database import DatabaseCommand, require_migrated

logger = logging.getLogger("parallel_mcp.mcp")

TRANSPORTS = ("stdio", "http")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
MCP_EXTRA_INSTALL = "pip install 'parallel-mcp[mcp]' (from a checkout: pip install -e '.[mcp]')"


def require_mcp_extra() -> None:
    """The server's third-party modules (the ``mcp`` extra) must be installed: say which extra
    to install instead of dying on the first missing import."""
    for module in ("uvicorn", "parallel_mcp.mcp.server"):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] == "parallel_mcp":
                raise  # our own code is broken: not a missing extra
            raise CommandError(
                f"pmcp_mcp needs the mcp extra (no module named {exc.name!r}): {MCP_EXTRA_INSTALL}"
            ) from None


def bind_address(host: str, port: int) -> Bind:
    """Where ``--host`` listens; a one-line CommandError when it does not resolve."""
    try:
        return resolve_bind(host, port)
    except OSError as exc:
        raise CommandError(f"cannot listen on {host}:{port}: {exc.strerror or exc}") from None


def listen(bind: Bind, port: int) -> socket.socket:
    """A bound socket for ``bind``; a one-line CommandError when that is impossible."""
    try:
        sock = socket.socket(bind.family, socket.SOCK_STREAM, bind.proto)
    except OSError as exc:
        raise CommandError(f"cannot listen on {bind.host}:{port}: {exc.strerror or exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(bind.sockaddr)
    except OSError as exc:
        sock.close()
        raise CommandError(f"cannot listen on {bind.host}:{port}: {exc.strerror or exc}") from None
    return sock


def allowed_hosts(values: list[str] | None) -> list[str]:
    """The ``--allowed-host`` values (repeatable, comma-separated), each a host name or IP."""
    names = [name for value in values or () for name in name_list(value, "--allowed-host") or ()]
    for name in names:
        if normalize_host(name) is None:
            raise CommandError(
                f"--allowed-host must be a host name or IP address without a port, got {name!r}"
            )
    return names


def uvicorn_log_config(verbosity: int) -> dict:
    """uvicorn's loggers, all on stderr."""
    level = {0: "WARNING", 1: "INFO"}.get(verbosity, "DEBUG")
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "formatter": "plain",
                "stream": "ext://sys.stderr",
            }
        },
        "loggers": {
            "uvicorn": {"handlers": ["stderr"], "level": level, "propagate": False},
            "uvicorn.error": {"level": level},
            "uvicorn.access": {"handlers": ["stderr"], "level": level, "propagate": False},
        },
    }


class Command(DatabaseCommand):
    help = (
        "Serve the orchestrator to MCP clients: over stdio (default) or streamable HTTP with "
        "bearer-token authentication. --read-only exposes only the reading tools."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--transport", default="stdio", help="stdio (default) or http (streamable HTTP)."
        )
        parser.add_argument("--host", help=f"HTTP: address to bind (default {DEFAULT_HOST}).")
        parser.add_argument("--port", help=f"HTTP: port to listen on (default {DEFAULT_PORT}).")
        parser.add_argument(
            "--read-only",
            action="store_true",
            help="Expose only the reading tools (get_*, list_*, explain_task).",
        )
        parser.add_argument(
            "--tools-only",
            action="store_true",
            help="Serve only the project's @tool tools (docs/mcp-tasks.md), not the "
            "orchestrator's own tools and resources.",
        )
        parser.add_argument(
            "--allow-unauthenticated",
            action="store_true",
            help="HTTP on a loopback address only: accept requests without a bearer token.",
        )
        parser.add_argument(
            "--allowed-host",
            action="append",
            metavar="NAME",
            help="HTTP: a host name clients use to reach the server (the Host header), besides "
            "the loopback names and the bound address; repeatable or comma-separated. Required "
            "with a wildcard --host (0.0.0.0, ::).",
        )

    def handle(self, *args, **options):
        configure_logging(options["verbosity"])
        require_mcp_extra()
        transport = (options["transport"] or "").strip().lower()
        if transport not in TRANSPORTS:
            raise CommandError(f"--transport must be stdio or http, got {options['transport']!r}")
        read_only = options["read_only"]
        tools_only = options["tools_only"]
        if read_only and tools_only:
            raise CommandError(
                "--tools-only and --read-only exclude each other: calling a tool creates a run"
            )
        if transport == "stdio":
            for option in ("host", "port"):
                if options[option] is not None:
                    raise CommandError(f"--{option} applies only to --transport http")
            for option in ("allow_unauthenticated", "allowed_host"):
                if options[option]:
                    flag = "--" + option.replace("_", "-")
                    raise CommandError(f"{flag} applies only to --transport http")
            require_migrated(app_settings.DATABASE_ALIAS)
            self.serve_stdio(read_only=read_only, tools_only=tools_only)
            return
        host = (options["host"] if options["host"] is not None else DEFAULT_HOST).strip()
        if not host:
            raise CommandError("--host must not be empty")
        port = positive_int(
            options["port"] if options["port"] is not None else DEFAULT_PORT, "--port"
        )
        if port > 65535:
            raise CommandError(f"--port must be <= 65535, got {port}")
        extra_hosts = allowed_hosts(options["allowed_host"])
        bind = bind_address(host, port)
        unauthenticated = options["allow_unauthenticated"]
        if unauthenticated and not bind.loopback:
            raise CommandError(
                f"--allow-unauthenticated is refused on the non-loopback host {host}: "
                "bind 127.0.0.1 or use bearer tokens"
            )
        require_migrated(app_settings.DATABASE_ALIAS)
        if not unauthenticated and not bind.loopback and not self.tokens_exist():
            raise CommandError(
                f"refusing to serve on the non-loopback host {host} without API tokens: "
                "create one with `manage.py pmcp_token create --user USER --name NAME` first"
            )
        if bind.wildcard and not extra_hosts:
            raise CommandError(
                f"--host {host} listens on every address: name the host names clients use "
                "with --allowed-host NAME (the Host header is checked against DNS rebinding)"
            )
        self.serve_http(
            bind=bind,
            port=port,
            hosts=host_policy(bind, extra_hosts),
            read_only=read_only,
            tools_only=tools_only,
            auth_required=not unauthenticated,
            verbosity=options["verbosity"],
        )

    def tokens_exist(self) -> bool:
        from ...models import ApiToken

        return ApiToken.objects.using(app_settings.DATABASE_ALIAS).live(timezone.now()).exists()

    def serve_stdio(self, *, read_only: bool, tools_only: bool = False) -> None:
        import anyio

        from ...mcp.server import build_server, serve_stdio

        server = build_server(read_only=read_only, tools_only=tools_only)
        connections.close_all()  # tool calls open their own, in worker threads
        logger.info("MCP server on stdio%s", " (read-only)" if read_only else "")
        try:
            anyio.run(serve_stdio, server)
        except KeyboardInterrupt:  # pragma: no cover - interactive use
            pass

    def serve_http(
        self,
        *,
        bind: Bind,
        port: int,
        hosts: HostPolicy,
        read_only: bool,
        auth_required: bool,
        verbosity: int,
        tools_only: bool = False,
    ) -> None:
        import uvicorn

        from ...mcp.server import build_server, http_app

        sock = listen(bind, port)
        server = build_server(
            read_only=read_only, auth_required=auth_required, tools_only=tools_only
        )
        app = http_app(
            server, hosts=hosts, auth_required=auth_required, using=app_settings.DATABASE_ALIAS
        )
        connections.close_all()
        host = bind.host.strip().strip("[]")
        shown = f"[{host}]" if ":" in host else host
        logger.log(
            logging.INFO if auth_required else logging.WARNING,
            "MCP server on http://%s:%s/mcp (%s%s; Host: %s)",
            shown,
            port,
            "bearer tokens required" if auth_required else "NO authentication",
            ", read-only" if read_only else "",
            ", ".join(sorted(hosts.names)),
        )
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            log_config=uvicorn_log_config(verbosity),
            access_log=verbosity >= 2,
            lifespan="on",
        )
        runner = uvicorn.Server(config)
        try:
            runner.run(sockets=[sock])
        finally:
            sock.close()

"""Request guards of the streamable HTTP transport: the ``Host``/``Origin`` check against DNS
rebinding (``HostOriginMiddleware``, see ``hosts``), then bearer tokens (``BearerTokenMiddleware``).

Every HTTP request must carry ``Authorization: Bearer <token>`` with a live API token (see
``manage.py pmcp_token``); anything else gets ``401``. Tokens are stored hashed and compared in
constant time (``services.tokens.authenticate_token``). Refused tokens count against the client
address (``auth_throttle``, shared with the HTTP API): over the limit, ``429`` with
``Retry-After`` and the token is not checked.

What a token may call:

* its **role** picks tool groups: ``full`` → every tool; ``read`` → the reading tools only;
  ``worker`` → the worker protocol only (claim_next_task, claim_next_tasks, mark_task_running,
  heartbeat_lease, report_progress, pause_task, complete_task, fail_task, release_task);
* within those, its **user's Django permissions** decide: each tool names one permission
  (``ToolSpec.permission``: ``view_run``/``view_task``/``view_event``/``view_contextsnapshot``
  for reads, ``work_tasks`` for the worker protocol, ``operate_runs`` for creating and
  operating, as in the HTTP API). Superusers have every permission, but a token's role narrows
  even theirs.

The allowed tool names travel with the request as the access token's scopes, and the SDK binds
each MCP session to the token that opened it.
"""

from __future__ import annotations

import json
import logging
from functools import partial
from typing import Any

import anyio.to_thread
from django.db import close_old_connections, connections
from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from starlette.authentication import AuthCredentials
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from .. import auth_throttle
from ..actors import Actor, acting_as
from ..contract.roles import OPERATE
from ..services.tokens import authenticate_token
from .declare import tools as declared_tools
from .hosts import HostPolicy
from .tools import ROLE_GROUPS, tool_specs

logger = logging.getLogger("parallel_mcp.mcp")


# Calling a tool declared with @tool creates a run: operating access, as create_run.
DECLARED_TOOL_GROUP = OPERATE
DECLARED_TOOL_PERMISSION = "parallel_mcp.operate_runs"


def allowed_tools(*, role: str, user: Any) -> frozenset[str]:
    """The tools a token of ``role`` owned by ``user`` may list and call (the tools declared
    with ``@tool`` count as operating ones)."""
    groups = ROLE_GROUPS.get(role, frozenset())
    named = [(spec.name, spec.permission) for spec in tool_specs().values() if spec.group in groups]
    if DECLARED_TOOL_GROUP in groups:
        named += [(d.name, DECLARED_TOOL_PERMISSION) for d in declared_tools.all()]
    if getattr(user, "is_superuser", False):
        return frozenset(name for name, _ in named)
    granted = user.get_all_permissions() if user is not None else set()
    return frozenset(name for name, permission in named if permission in granted)


def in_db_thread(function: Any, *args: Any, actor: Actor | None = None, **kwargs: Any) -> Any:
    """Run ``function`` with fresh database connections, closing them afterwards, acting as
    ``actor`` (parallel_mcp.actors)."""
    close_old_connections()
    try:
        with acting_as(actor):
            return function(*args, **kwargs)
    finally:
        connections.close_all()


class DjangoTokenVerifier:
    """The SDK's ``TokenVerifier`` protocol over parallel_mcp's hashed API tokens."""

    def __init__(self, *, using: str = "default") -> None:
        self.using = using

    def verify_sync(self, secret: str) -> AccessToken | None:
        token = authenticate_token(using=self.using, secret=secret)
        if token is None:
            return None
        user = token.user
        return AccessToken(
            token=token.prefix,  # never keep the secret around
            client_id=f"pmcp_{token.prefix}",
            scopes=sorted(allowed_tools(role=token.role, user=user)),
            subject=str(user.pk),
            claims={
                "role": token.role,
                "user": user.get_username(),
                "prefix": token.prefix,
                "worker_prefix": token.worker_prefix,
            },
        )

    async def verify_token(self, token: str) -> AccessToken | None:
        return await anyio.to_thread.run_sync(in_db_thread, self.verify_sync, token)

    async def verify_from(self, address: str, token: str) -> AccessToken | None:
        """``verify_token`` for a request from ``address``, under its failed-authentication
        limit (``auth_throttle.AuthThrottled`` when over it)."""
        check = partial(self.verify_sync, token)
        return await anyio.to_thread.run_sync(in_db_thread, auth_throttle.attempt, address, check)


def client_address(scope: Scope) -> str:
    """The client's address as the ASGI server reports it (uvicorn trusts X-Forwarded-For only
    from the addresses in its ``forwarded_allow_ips``, 127.0.0.1 by default)."""
    client = scope.get("client")
    return str(client[0]) if client else "unknown"


class BearerTokenMiddleware:
    """ASGI middleware: HTTP requests need a valid bearer token, else ``401``.

    On success the scope carries the SDK's ``AuthenticatedUser`` (``scope["user"]``) and the
    allowed tool names (``scope["auth"].scopes``). Lifespan events pass through.
    """

    def __init__(self, app: ASGIApp, *, verifier: DjangoTokenVerifier) -> None:
        self.app = app
        self.verifier = verifier

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # not served: refuse before anything else
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":  # lifespan
            await self.app(scope, receive, send)
            return
        header = Headers(scope=scope).get("authorization", "")
        scheme, _, secret = header.partition(" ")
        access = None
        if scheme.lower() == "bearer" and secret.strip():
            try:
                access = await self.verifier.verify_from(client_address(scope), secret.strip())
            except auth_throttle.AuthThrottled as exc:
                await json_reply(
                    send,
                    429,
                    auth_throttle.CODE,
                    f"{auth_throttle.MESSAGE} Retry in {exc.wait} s.",
                    headers={"retry-after": str(exc.wait)},
                )
                return
            except Exception:  # a database outage must not look like a valid token
                logger.exception("token verification failed")
                await json_reply(send, 503, "unavailable", "Token verification is unavailable.")
                return
        if access is None:
            description = (
                "Invalid, expired or revoked bearer token."
                if header
                else "Authentication required: send Authorization: Bearer <token>."
            )
            await json_reply(send, 401, "invalid_token", description, authenticate=True)
            return
        scope["user"] = AuthenticatedUser(access)
        scope["auth"] = AuthCredentials(access.scopes)
        await self.app(scope, receive, send)


class HostOriginMiddleware:
    """ASGI middleware: refuses a ``Host`` the policy does not allow (``421``) and an
    ``Origin`` it does not allow (``403``) before anything else sees the request."""

    def __init__(self, app: ASGIApp, *, policy: HostPolicy) -> None:
        self.app = app
        self.policy = policy

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # not served
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":  # lifespan
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if not self.policy.allows_host(headers.get("host")):
            await json_reply(
                send, 421, "invalid_host", "This server does not answer for that Host header."
            )
            return
        if not self.policy.allows_origin(headers.get("origin")):
            await json_reply(send, 403, "invalid_origin", "Requests from that Origin are refused.")
            return
        await self.app(scope, receive, send)


async def json_reply(
    send: Send,
    status: int,
    error: str,
    description: str,
    *,
    authenticate: bool = False,
    headers: dict[str, str] | None = None,
) -> None:
    """A refusal of the HTTP transport: ``{"error", "error_description"}`` as in OAuth."""
    body = json.dumps({"error": error, "error_description": description}).encode()
    raw = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
    ]
    if authenticate:
        value = f'Bearer error="{error}", error_description="{description}"'
        raw.append((b"www-authenticate", value.encode()))
    raw.extend((name.encode(), value.encode()) for name, value in (headers or {}).items())
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": body})


def request_scopes(request: Any) -> frozenset[str] | None:
    """The tool names an HTTP request's token allows; None when the request carries no token."""
    if request is None:
        return None
    user = getattr(request, "scope", {}).get("user")
    if isinstance(user, AuthenticatedUser):
        return frozenset(user.scopes)
    return None


def request_actor(request: Any) -> Actor | None:
    """Who an HTTP request acts as (its token; see parallel_mcp.actors); None over stdio."""
    user = getattr(request, "scope", {}).get("user") if request is not None else None
    if not isinstance(user, AuthenticatedUser):
        return None
    claims = user.access_token.claims or {}
    return Actor(
        principal=f"token:{claims['prefix']}", worker_prefix=claims.get("worker_prefix") or None
    )


def request_role(request: Any) -> str | None:
    if request is None:
        return None
    user = getattr(request, "scope", {}).get("user")
    if isinstance(user, AuthenticatedUser):
        return (user.access_token.claims or {}).get("role")
    return None

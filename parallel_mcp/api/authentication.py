"""Bearer tokens: ``Authorization: Bearer pmcp_<prefix>_<secret>`` (see ``pmcp_token``), with
refused tokens counted per client address (``auth_throttle``, shared with the MCP transport)."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header

from .. import auth_throttle
from ..conf import app_settings
from ..services.tokens import TOKEN_PREFIX, authenticate_token
from .throttling import client_address

KEYWORD = "Bearer"


class BearerTokenAuthentication(BaseAuthentication):
    """Authenticates an :class:`~parallel_mcp.models.ApiToken` by its secret.

    ``request.user`` is the token's user and ``request.auth`` the token itself, so the
    permission classes can narrow what the user may do by the token's ``role``. A request
    without an ``Authorization: Bearer`` header is left to the next authentication class; a
    malformed, unknown, revoked or expired token is refused (401). After too many refused
    tokens from one client address, its tokens are not checked until the window ends (429
    ``auth_throttled`` with ``Retry-After``).
    """

    keyword = KEYWORD

    def authenticate(self, request: Any) -> tuple[Any, Any] | None:
        header = get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed(
                "Invalid Authorization header: expected 'Bearer <token>'."
            )
        try:
            secret = header[1].decode("ascii")
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Invalid token.") from None
        if not secret.startswith(f"{TOKEN_PREFIX}_"):
            return None  # another scheme's bearer token (JWT, OAuth): the next class may know it
        try:
            token = auth_throttle.attempt(
                client_address(request),
                lambda: authenticate_token(using=app_settings.DATABASE_ALIAS, secret=secret),
            )
        except auth_throttle.AuthThrottled as exc:
            raise exceptions.Throttled(
                wait=exc.wait, detail=auth_throttle.MESSAGE, code=auth_throttle.CODE
            ) from None
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked token.")
        return token.user, token

    def authenticate_header(self, request: Any) -> str:
        return f'{self.keyword} realm="parallel_mcp"'

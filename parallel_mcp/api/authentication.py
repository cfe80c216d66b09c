"""Bearer tokens: ``Authorization: Bearer pmcp_<prefix>_<secret>`` (see ``pmcp_token``)."""

from __future__ import annotations

from typing import Any

from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication, get_authorization_header

from ..conf import app_settings
from ..services.tokens import TOKEN_PREFIX, authenticate_token

KEYWORD = "Bearer"


class BearerTokenAuthentication(BaseAuthentication):
    """Authenticates an :class:`~parallel_mcp.models.ApiToken` by its secret.

    ``request.user`` is the token's user and ``request.auth`` the token itself, so the
    permission classes can narrow what the user may do by the token's ``role``. A request
    without an ``Authorization: Bearer`` header is left to the next authentication class; a
    malformed, unknown, revoked or expired token is refused (401).
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
        token = authenticate_token(using=app_settings.DATABASE_ALIAS, secret=secret)
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked token.")
        return token.user, token

    def authenticate_header(self, request: Any) -> str:
        return f'{self.keyword} realm="parallel_mcp"'

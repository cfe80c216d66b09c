"""API tokens: create (the secret is returned once), revoke, authenticate in constant time."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.contrib.auth import get_user_model
from django.db import transaction

from ..contract import validation as v
from ..contract.roles import ROLES
from ..exceptions import RecordNotFoundError, ValidationError
from ..models import ApiToken
from ..models.api_tokens import ACTIVE

TOKEN_PREFIX = "pmcp"


@dataclass(frozen=True)
class IssuedToken:
    token: ApiToken
    secret: str  # the full bearer value; shown once


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create_token(
    *,
    using: str,
    user: Any,
    name: str,
    role: str = "full",
    expires_in: timedelta | None = None,
    worker_prefix: str | None = None,
    now: datetime | None = None,
) -> IssuedToken:
    now = v.resolve_now(now)
    name = v.text(name, "name")
    worker_prefix = v.text(worker_prefix, "worker_prefix", allow_none=True)
    if role not in ROLES:
        raise ValidationError(
            f"role must be one of {', '.join(ROLES)}, got {role!r}.", field="role"
        )
    if isinstance(user, str):
        found = (
            get_user_model()
            ._default_manager.db_manager(using)
            .filter(**{get_user_model().USERNAME_FIELD: user})
            .first()
        )
        if found is None:
            raise RecordNotFoundError(f"No user {user!r}.", user=user)
        user = found
    prefix = secrets.token_hex(6)
    secret = f"{TOKEN_PREFIX}_{prefix}_{secrets.token_urlsafe(32)}"
    with transaction.atomic(using=using):
        token = ApiToken.objects.using(using).create(
            user=user,
            name=name,
            prefix=prefix,
            secret_hash=_hash(secret),
            role=role,
            created_at=now,
            expires_at=(now + expires_in) if expires_in else None,
            worker_prefix=worker_prefix or "",
        )
    return IssuedToken(token=token, secret=secret)


def revoke_token(*, using: str, prefix: str, now: datetime | None = None) -> ApiToken:
    now = v.resolve_now(now)
    token = ApiToken.objects.using(using).filter(prefix=prefix).first()
    if token is None:
        raise RecordNotFoundError(f"No API token with prefix {prefix!r}.", prefix=prefix)
    if token.revoked_at is None:
        ApiToken.objects.using(using).filter(pk=token.pk).update(revoked_at=now)
        token.revoked_at = now
    return token


def authenticate_token(*, using: str, secret: str, now: datetime | None = None) -> ApiToken | None:
    """The live token a bearer value belongs to, or None. The secret is compared by hash in
    constant time; unknown prefixes cost the same hash so timing tells nothing."""
    now = v.resolve_now(now)
    if not isinstance(secret, str):
        return None
    parts = secret.split("_")
    prefix = parts[1] if len(parts) >= 3 and parts[0] == TOKEN_PREFIX else ""
    token = (
        ApiToken.objects.using(using)
        .select_related("user")
        .with_state(now)
        .filter(prefix=prefix)
        .first()
        if prefix
        else None
    )
    expected = token.secret_hash if token is not None else _hash("no such token")
    # ACTIVE: not revoked, not expired, its user active (the model's one rule).
    if not hmac.compare_digest(expected, _hash(secret)) or token is None or token.state != ACTIVE:
        return None
    if token.last_used_at is None or now - token.last_used_at > timedelta(minutes=1):
        ApiToken.objects.using(using).filter(pk=token.pk).update(last_used_at=now)
    return token

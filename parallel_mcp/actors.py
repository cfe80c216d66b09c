"""Who is acting: the credential a request of the HTTP API, the MCP HTTP transport or the admin
authenticated as.

The doors wrap each call in ``acting_as(actor)``; the services read :func:`current` and

* record the actor's ``principal`` on every event they write (``Event.actor``), on the leases
  it takes (``Lease.principal``, mirrored on the task while leased) and on the client tokens it
  uses, so a lease, or a replay of a token, can only be used by the principal that took it;
* refuse worker ids outside the actor's ``worker_prefix`` (a token can be bound to one).

Code that calls the Orchestrator in-process (the local worker, scripts, the django.tasks
backend) acts as no one (``None``): it has the database already and is trusted with any lease.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Actor:
    principal: str  # "token:<prefix>" or "user:<pk>"
    worker_prefix: str | None = None  # worker ids must start with it, when set


_current: ContextVar[Actor | None] = ContextVar("parallel_mcp_actor", default=None)


def current() -> Actor | None:
    return _current.get()


def current_principal() -> str | None:
    actor = _current.get()
    return None if actor is None else actor.principal


def set_current(actor: Actor | None) -> None:
    """Set the actor until the enclosing ``acting_as`` block ends (a door that learns who is
    acting only midway, after authentication, opens the block first)."""
    _current.set(actor)


@contextmanager
def acting_as(actor: Actor | None) -> Iterator[None]:
    token = _current.set(actor)
    try:
        yield
    finally:
        _current.reset(token)


def for_token(token: Any) -> Actor:
    """An API token (``parallel_mcp.models.ApiToken``) acts as itself, by its public prefix."""
    return Actor(principal=f"token:{token.prefix}", worker_prefix=token.worker_prefix or None)


def for_user(user: Any) -> Actor:
    """A session (admin, browsable API) acts as its user."""
    return Actor(principal=f"user:{user.pk}")


def for_request(user: Any, auth: Any) -> Actor | None:
    """The actor of an authenticated request: its token when it has one, else its user."""
    from .models import ApiToken

    if isinstance(auth, ApiToken):
        return for_token(auth)
    if user is not None and getattr(user, "is_authenticated", False):
        return for_user(user)
    return None

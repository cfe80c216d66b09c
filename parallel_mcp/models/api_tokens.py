from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import models
from django.db.models import Case, Q, Value, When

from ..contract.limits import NAME_LENGTH
from ..contract.roles import ROLE_DESCRIPTIONS
from ..contract.roles import ROLES as ROLE_NAMES

ROLES = tuple((role, f"{role}: {ROLE_DESCRIPTIONS[role]}") for role in ROLE_NAMES)

# Why a token cannot authenticate, in the order they are reported; a token none applies to is
# "active". The one definition of a live token: listings and look-ups read it from here.
ACTIVE = "active"


def _dead_states(now: datetime) -> tuple[tuple[str, Q], ...]:
    return (
        ("revoked", Q(revoked_at__isnull=False)),
        ("expired", Q(expires_at__lte=now)),
        ("user inactive", Q(user__is_active=False)),
    )


if TYPE_CHECKING:
    from typing import TypedDict

    from django_stubs_ext import WithAnnotations

    class TokenState(TypedDict):
        state: str

    # A token read through ``with_state`` (django-stubs' type for an annotated instance).
    ApiTokenWithState = WithAnnotations["ApiToken", TokenState]


class ApiTokenQuerySet(models.QuerySet):
    def with_state(self, now: datetime) -> ApiTokenQuerySet:
        """Annotate ``state``: ``active``, or why the token no longer authenticates."""
        return self.annotate(
            state=Case(
                *(When(condition, then=Value(name)) for name, condition in _dead_states(now)),
                default=Value(ACTIVE),
                output_field=models.CharField(),
            )
        )

    def live(self, now: datetime) -> ApiTokenQuerySet:
        """Tokens that authenticate at ``now``."""
        return self.with_state(now).filter(state=ACTIVE)


class ApiToken(models.Model):
    """A bearer token for the HTTP API and the MCP HTTP transport.

    Only a SHA-256 of the secret is stored; the token is shown once, when it is created.
    Its ``role`` narrows what the owning user's permissions allow.
    """

    id = models.BigAutoField(primary_key=True)
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="pmcp_api_tokens"
    )
    name = models.CharField(max_length=NAME_LENGTH)
    prefix = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64)
    role = models.CharField(max_length=16, choices=ROLES, default="full")
    created_at = models.DateTimeField()
    last_used_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # When set, the worker ids this token may claim and report as must start with it.
    worker_prefix = models.CharField(max_length=NAME_LENGTH, blank=True, default="")

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        db_table = "pmcp_api_token"
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(role__in=list(ROLE_NAMES)), name="pmcp_api_token_role_valid"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…, {self.role})"

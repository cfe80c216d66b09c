from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from ..contract.limits import NAME_LENGTH

ROLES = (
    ("full", "full: whatever the user's permissions allow"),
    ("worker", "worker: the worker protocol only"),
    ("read", "read: reading only"),
)


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

    class Meta:
        db_table = "pmcp_api_token"
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(role__in=["full", "read", "worker"]), name="pmcp_api_token_role_valid"
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…, {self.role})"

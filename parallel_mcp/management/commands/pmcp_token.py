"""Create, list and revoke API tokens: ``manage.py pmcp_token``."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from ...exceptions import ParallelMcpError
from ...models import ApiToken
from ...services.tokens import ROLES, create_token, revoke_token
from .. import tables
from ..arguments import duration

if TYPE_CHECKING:
    from ...models.api_tokens import ApiTokenWithState

TOKEN_COLUMNS = (
    tables.Column("PREFIX"),
    tables.Column("USER", max_width=20),
    tables.Column("ROLE"),
    tables.Column("STATE"),
    tables.Column("EXPIRES"),
    tables.Column("LAST USED"),
    tables.Column("NAME", max_width=30),
)


def _moment(value: datetime | None, empty: str) -> str:
    return value.strftime("%Y-%m-%d %H:%M UTC") if value else empty


def token_lines(tokens: list[ApiTokenWithState], *, now: datetime) -> list[str]:
    """The ``pmcp_token list`` table; ``state`` comes from ``ApiToken.objects.with_state``."""
    if not tokens:
        return ["no tokens (create one with: pmcp_token create --user USER --name NAME)"]
    rows = [
        [
            token.prefix,
            str(token.user),
            token.role,
            token.state,
            _moment(token.expires_at, "never"),
            tables.age(token.last_used_at, now) if token.last_used_at else "never",
            token.name,
        ]
        for token in tokens
    ]
    return tables.render(TOKEN_COLUMNS, rows)


class Command(BaseCommand):
    help = (
        "Manage bearer tokens for the HTTP API and the MCP HTTP transport. The secret is "
        "printed once, at creation; only its hash is stored."
    )

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        create = sub.add_parser("create", help="Create a token and print it once.")
        create.add_argument("--user", required=True, help="Username of the owner.")
        create.add_argument("--name", required=True, help="What the token is for.")
        create.add_argument(
            "--role",
            default="full",
            help=f"One of {', '.join(ROLES)} "
            "(worker: the worker protocol only; read: reading only).",
        )
        create.add_argument("--expires-in", metavar="DURATION", help="e.g. 90d; default never.")
        create.add_argument(
            "--worker-prefix",
            metavar="PREFIX",
            help="Bind the token to worker ids that start with PREFIX (claims as any other "
            "worker id are refused).",
        )
        sub.add_parser(
            "list",
            help="List tokens: prefix, owner, role, state (active, revoked, expired or "
            "user inactive), expiry, last use, name.",
        )
        revoke = sub.add_parser("revoke", help="Revoke a token by its prefix.")
        revoke.add_argument("prefix")

    def handle(self, *args, **options):
        using = "default"
        try:
            if options["action"] == "create":
                expires = (
                    duration(options["expires_in"], "--expires-in")
                    if options["expires_in"]
                    else None
                )
                issued = create_token(
                    using=using,
                    user=options["user"],
                    name=options["name"],
                    role=options["role"],
                    expires_in=expires,
                    worker_prefix=options["worker_prefix"],
                )
                self.stdout.write(issued.secret)
                self.stderr.write(
                    f"token {issued.token.prefix} for {options['user']} ({issued.token.role}); "
                    "store it now: it is not shown again"
                )
            elif options["action"] == "list":
                now = timezone.now()
                tokens = list(ApiToken.objects.using(using).select_related("user").with_state(now))
                for line in token_lines(tokens, now=now):
                    self.stdout.write(line)
            else:
                token = revoke_token(using=using, prefix=options["prefix"])
                self.stdout.write(f"revoked {token.prefix}")
        except ParallelMcpError as exc:
            raise CommandError(str(exc)) from None

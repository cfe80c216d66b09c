"""Create, list and revoke API tokens: ``manage.py pmcp_token``."""

from __future__ import annotations

from django.core.management.base import BaseCommand, CommandError

from ...exceptions import ParallelMcpError
from ...models import ApiToken
from ...services.tokens import ROLES, create_token, revoke_token
from ..arguments import duration


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
        sub.add_parser("list", help="List tokens (prefix, owner, role, state).")
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
                for token in ApiToken.objects.using(using).select_related("user"):
                    state = "revoked" if token.revoked_at else "active"
                    self.stdout.write(
                        f"{token.prefix}  {token.user}  {token.role:6}  {state:7}  {token.name}"
                    )
            else:
                token = revoke_token(using=using, prefix=options["prefix"])
                self.stdout.write(f"revoked {token.prefix}")
        except ParallelMcpError as exc:
            raise CommandError(str(exc)) from None

"""API tokens: hashed at rest, shown once, constant-time checks, revocation, expiry."""

from __future__ import annotations

import io
from datetime import timedelta

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError

from parallel_mcp.exceptions import RecordNotFoundError, ValidationError
from parallel_mcp.models import ApiToken
from parallel_mcp.services.tokens import authenticate_token, create_token, revoke_token
from tests.conftest import at

pytestmark = pytest.mark.django_db


@pytest.fixture
def alice():
    return User.objects.create_user("alice", password="pw")


def test_only_a_hash_is_stored_and_the_secret_authenticates(alice):
    issued = create_token(using="default", user=alice, name="ci", role="worker", now=at(0))
    row = ApiToken.objects.get()
    assert issued.secret not in (row.secret_hash, row.prefix, row.name)
    assert issued.secret.startswith(f"pmcp_{row.prefix}_")
    token = authenticate_token(using="default", secret=issued.secret, now=at(1))
    assert token is not None and token.user == alice and token.role == "worker"
    assert ApiToken.objects.get().last_used_at == at(1)


@pytest.mark.parametrize("bad", ["", "pmcp", "pmcp_x_y", "Bearer x", "pmcp__", None, 42])
def test_garbage_does_not_authenticate(alice, bad):
    create_token(using="default", user=alice, name="ci")
    assert authenticate_token(using="default", secret=bad) is None


def test_a_wrong_secret_with_a_right_prefix_fails(alice):
    issued = create_token(using="default", user=alice, name="ci")
    assert authenticate_token(using="default", secret=issued.secret[:-1] + "x") is None


def test_revoked_expired_and_inactive_tokens_fail(alice):
    revoked = create_token(using="default", user=alice, name="a", now=at(0))
    revoke_token(using="default", prefix=revoked.token.prefix, now=at(1))
    assert authenticate_token(using="default", secret=revoked.secret, now=at(2)) is None

    expiring = create_token(
        using="default", user=alice, name="b", expires_in=timedelta(seconds=10), now=at(0)
    )
    assert authenticate_token(using="default", secret=expiring.secret, now=at(9)) is not None
    assert authenticate_token(using="default", secret=expiring.secret, now=at(10)) is None

    live = create_token(using="default", user=alice, name="c")
    alice.is_active = False
    alice.save()
    assert authenticate_token(using="default", secret=live.secret) is None


def test_bad_arguments(alice):
    with pytest.raises(ValidationError):
        create_token(using="default", user=alice, name="x", role="admin")
    with pytest.raises(ValidationError):
        create_token(using="default", user=alice, name="")
    with pytest.raises(RecordNotFoundError):
        create_token(using="default", user="nobody", name="x")
    with pytest.raises(RecordNotFoundError):
        revoke_token(using="default", prefix="nope")


def test_command_prints_the_secret_once_and_revokes(alice):
    out, err = io.StringIO(), io.StringIO()
    call_command(
        "pmcp_token",
        "create",
        "--user",
        "alice",
        "--name",
        "w",
        "--role",
        "worker",
        stdout=out,
        stderr=err,
    )
    secret = out.getvalue().strip()
    assert authenticate_token(using="default", secret=secret).role == "worker"
    assert "not shown again" in err.getvalue()
    listing = io.StringIO()
    call_command("pmcp_token", "list", stdout=listing)
    assert secret not in listing.getvalue() and "worker" in listing.getvalue()
    prefix = ApiToken.objects.get().prefix
    call_command("pmcp_token", "revoke", prefix, stdout=io.StringIO())
    assert authenticate_token(using="default", secret=secret) is None
    with pytest.raises(CommandError):
        call_command("pmcp_token", "create", "--user", "nobody", "--name", "w")


def listing() -> list[str]:
    out = io.StringIO()
    call_command("pmcp_token", "list", stdout=out)
    return out.getvalue().splitlines()


def test_list_without_tokens_says_so(db):
    assert listing() == ["no tokens (create one with: pmcp_token create --user USER --name NAME)"]


def test_list_shows_why_a_token_no_longer_authenticates_under_a_header(alice):
    bob = User.objects.create_user("bob", password="pw")
    live = create_token(using="default", user=alice, name="dashboard", role="read")
    create_token(using="default", user=alice, name="old", expires_in=timedelta(days=-1))
    revoked = create_token(using="default", user=alice, name="gone", role="worker")
    revoke_token(using="default", prefix=revoked.token.prefix)
    create_token(using="default", user=bob, name="bob's", expires_in=timedelta(days=30))
    bob.is_active = False
    bob.save()

    header, *rows = listing()
    titles = ["PREFIX", "USER", "ROLE", "STATE", "EXPIRES", "LAST USED", "NAME"]
    starts = [header.index(title) for title in titles]
    assert header.split("  ")[0] == "PREFIX" and starts == sorted(starts)

    def cell(row: str, title: str) -> str:
        index = titles.index(title)
        end = starts[index + 1] if index + 1 < len(titles) else None
        return row[starts[index] : end].strip()

    by_name = {cell(row, "NAME"): row for row in rows}
    assert len(by_name) == len(rows) == 4
    for row in rows:  # left-aligned cells start under their header
        assert all(row[at - 1] == " " and row[at] != " " for at in starts[1:5]), row
    assert {name: cell(row, "STATE") for name, row in by_name.items()} == {
        "dashboard": "active",
        "old": "expired",
        "gone": "revoked",
        "bob's": "user inactive",
    }
    dashboard = by_name["dashboard"]
    assert cell(dashboard, "PREFIX") == live.token.prefix
    assert (cell(dashboard, "USER"), cell(dashboard, "ROLE")) == ("alice", "read")
    assert (cell(dashboard, "EXPIRES"), cell(dashboard, "LAST USED")) == ("never", "never")
    assert cell(by_name["bob's"], "EXPIRES").endswith("UTC")
    assert live.secret not in "\n".join(rows)


def test_live_tokens_are_exactly_the_ones_that_authenticate(alice):
    """The listing's states and authenticate_token agree, at the expiry boundary too."""
    issued = {
        "live": create_token(using="default", user=alice, name="a", now=at(0)),
        "expiring": create_token(
            using="default", user=alice, name="b", expires_in=timedelta(seconds=10), now=at(0)
        ),
        "revoked": create_token(using="default", user=alice, name="c", now=at(0)),
    }
    revoke_token(using="default", prefix=issued["revoked"].token.prefix, now=at(1))
    for now in (at(9), at(10)):
        live = set(ApiToken.objects.live(now).values_list("prefix", flat=True))
        authenticates = {
            token.token.prefix
            for token in issued.values()
            if authenticate_token(using="default", secret=token.secret, now=now)
        }
        assert live == authenticates
    assert live == {issued["live"].token.prefix}

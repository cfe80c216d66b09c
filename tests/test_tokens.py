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

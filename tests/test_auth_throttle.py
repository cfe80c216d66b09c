"""Failed token authentications are throttled per client address, by one implementation
(``parallel_mcp.auth_throttle``) on the HTTP API and on the MCP HTTP transport: over the limit,
tokens are no longer checked (429 with Retry-After); successes are never counted."""

from __future__ import annotations

import logging
import time

import httpx2
import pytest
from django.contrib.auth.models import User
from django.test import Client, override_settings

from parallel_mcp import auth_throttle
from parallel_mcp.api import authentication
from parallel_mcp.services.tokens import create_token
from tests.api_helpers import VIEW_PERMS, Api, bearer, error_of, make_user, token_for
from tests.mcp_support import INITIALIZE, LiveServer
from tests.mcp_throttle_settings import AUTH_FAILURE_LIMIT, AUTH_FAILURE_WINDOW_SECONDS

pytest_plugins = ["tests.api_fixtures"]

LIMIT = 5
WINDOW = 60
SMALL = {"AUTH_FAILURE_LIMIT": LIMIT, "AUTH_FAILURE_WINDOW_SECONDS": WINDOW}
T = 1_000_000.0  # a fixed moment, 40 s into its window
BAD = "pmcp_000000000000_" + "x" * 43


@pytest.fixture
def small_limit(settings, monkeypatch):
    """The small limit, on a clock stopped at ``T``: windows are fixed, so a test's requests
    on the real clock could straddle a window's end and find their count reset."""
    settings.PARALLEL_MCP = {**settings.PARALLEL_MCP, **SMALL}
    monkeypatch.setattr(auth_throttle, "clock", lambda: T)


@pytest.fixture
def token_checks(monkeypatch) -> list[str]:
    """Every secret that reached the API's token check."""
    seen: list[str] = []
    real = authentication.authenticate_token

    def counting(*, using, secret):
        seen.append(secret)
        return real(using=using, secret=secret)

    monkeypatch.setattr(authentication, "authenticate_token", counting)
    return seen


# -- the shared implementation ----------------------------------------------------------------


def test_failures_over_the_limit_lock_the_address_until_the_window_ends(small_limit):
    for _ in range(LIMIT):
        assert auth_throttle.retry_after("10.0.0.1", now=T) is None
        auth_throttle.record_failure("10.0.0.1", now=T)
    window_end = (T // WINDOW + 1) * WINDOW
    assert auth_throttle.retry_after("10.0.0.1", now=T) == window_end - T
    assert auth_throttle.retry_after("10.0.0.1", now=window_end - 0.5) == 1
    assert auth_throttle.retry_after("10.0.0.2", now=T) is None  # per address
    assert auth_throttle.retry_after("10.0.0.1", now=window_end) is None  # a new window


def test_attempt_checks_counts_refusals_only_and_refuses_when_locked(small_limit):
    checked: list[str] = []

    def check(answer):
        def run():
            checked.append(answer)
            return answer

        return run

    for _ in range(50):
        assert auth_throttle.attempt("10.0.0.3", check("token"), now=T) == "token"
    for _ in range(LIMIT):
        assert auth_throttle.attempt("10.0.0.3", check(None), now=T) is None
    assert len(checked) == 50 + LIMIT  # successes were never counted against the address
    with pytest.raises(auth_throttle.AuthThrottled) as locked:
        auth_throttle.attempt("10.0.0.3", check("token"), now=T)
    assert locked.value.wait >= 1 and str(locked.value) == auth_throttle.MESSAGE
    assert len(checked) == 50 + LIMIT  # a locked address is not checked, even a good token


def test_the_limit_can_be_turned_off(settings):
    settings.PARALLEL_MCP = {**settings.PARALLEL_MCP, "AUTH_FAILURE_LIMIT": None}
    for _ in range(100):
        assert auth_throttle.attempt("10.0.0.4", lambda: None, now=T) is None
    assert auth_throttle.retry_after("10.0.0.4", now=T) is None


def test_any_address_string_makes_a_valid_cache_key(small_limit):
    weird = "::ffff:10.0.0.1, " + "x" * 500 + " \n\x00"
    for _ in range(LIMIT):
        auth_throttle.record_failure(weird, now=T)
    assert auth_throttle.retry_after(weird, now=T) is not None


# -- the HTTP API -----------------------------------------------------------------------------


@pytest.mark.django_db
def test_api_stops_checking_tokens_after_the_limit(small_limit, token_checks):
    responses = [bearer(BAD).get("runs") for _ in range(40)]
    assert [r.status_code for r in responses[:LIMIT]] == [401] * LIMIT
    assert {r.status_code for r in responses[LIMIT:]} == {429}
    assert len(token_checks) == LIMIT  # 35 requests never reached the token check
    error = error_of(responses[-1])
    assert error["code"] == "auth_throttled"
    assert error["message"].startswith(auth_throttle.MESSAGE)
    assert 1 <= error["details"]["wait"] <= WINDOW
    assert responses[-1]["Retry-After"] == str(error["details"]["wait"])

    # The address is locked, whatever the token; another address is not.
    good = token_for(make_user("throttled-viewer", VIEW_PERMS))
    assert bearer(good).get("runs").status_code == 429
    assert len(token_checks) == LIMIT
    other = Api(Client(headers={"Authorization": f"Bearer {good}"}, REMOTE_ADDR="10.1.1.1"))
    assert other.get("runs").status_code == 200
    # Sessions and requests without credentials are not token checks: not refused.
    assert Api(Client()).get("runs").status_code == 401


@pytest.mark.django_db
def test_api_successes_are_not_counted(small_limit, token_checks):
    good = bearer(token_for(make_user("busy-viewer", VIEW_PERMS)))
    for _ in range(3 * LIMIT):
        assert good.get("runs").status_code == 200
    for _ in range(LIMIT):
        assert bearer(BAD).get("runs").status_code == 401
    assert good.get("runs").status_code == 429


@pytest.mark.django_db
def test_api_window_ends_and_tokens_are_checked_again(small_limit, monkeypatch):
    now = [T]
    monkeypatch.setattr(auth_throttle, "clock", lambda: now[0])
    for _ in range(LIMIT):
        assert bearer(BAD).get("runs").status_code == 401
    assert bearer(BAD).get("runs").status_code == 429
    now[0] = (T // WINDOW + 1) * WINDOW
    assert bearer(BAD).get("runs").status_code == 401


@pytest.mark.django_db
def test_api_a_spoofed_forwarded_for_does_not_escape_the_limit(small_limit, token_checks):
    for index in range(3 * LIMIT):
        response = bearer(BAD).get("runs", HTTP_X_FORWARDED_FOR=f"10.2.0.{index}")
    assert response.status_code == 429
    assert len(token_checks) == LIMIT


@pytest.mark.django_db
def test_api_behind_trusted_proxies_counts_the_forwarded_address(small_limit, settings):
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    for _ in range(LIMIT):
        bearer(BAD).get("runs", HTTP_X_FORWARDED_FOR="10.3.0.1")
    assert bearer(BAD).get("runs", HTTP_X_FORWARDED_FOR="10.3.0.1").status_code == 429
    assert bearer(BAD).get("runs", HTTP_X_FORWARDED_FOR="10.3.0.2").status_code == 401


@pytest.mark.django_db
def test_api_other_bearer_schemes_are_not_counted(small_limit, token_checks):
    for _ in range(3 * LIMIT):
        assert bearer("eyJhbGciOi.jwt.like").get("runs").status_code == 401
    assert bearer(BAD).get("runs").status_code == 401
    assert len(token_checks) == 1


@pytest.mark.django_db
def test_api_throttling_logs_no_token(small_limit, caplog):
    caplog.set_level(logging.DEBUG)
    for _ in range(LIMIT + 3):
        bearer(BAD).get("runs")
    assert BAD not in caplog.text and BAD[5:17] not in caplog.text


# -- the MCP HTTP transport -------------------------------------------------------------------


def mcp_post(server: LiveServer, secret: str) -> httpx2.Response:
    return httpx2.post(
        server.url,
        json=INITIALIZE,
        headers={
            "Accept": "application/json, text/event-stream",
            "Authorization": f"Bearer {secret}",
        },
        timeout=30,
    )


@pytest.mark.django_db(transaction=True)
def test_mcp_stops_checking_tokens_after_the_limit():
    user = User.objects.create_superuser("mcp-throttled", password="pw")
    good = create_token(using="default", user=user, name="good").secret
    server = LiveServer(settings="tests.mcp_throttle_settings")
    try:
        # The server runs on the real clock: start well inside a window, never near its end.
        left = AUTH_FAILURE_WINDOW_SECONDS - time.time() % AUTH_FAILURE_WINDOW_SECONDS
        if left < 300:
            time.sleep(left + 1)
        assert mcp_post(server, good).status_code == 200  # successes are not counted ...
        responses = [mcp_post(server, BAD) for _ in range(30)]
        statuses = [response.status_code for response in responses]
        assert statuses == [401] * AUTH_FAILURE_LIMIT + [429] * (30 - AUTH_FAILURE_LIMIT)
        refused = responses[-1]
        assert refused.json()["error"] == auth_throttle.CODE
        assert refused.json()["error_description"].startswith(auth_throttle.MESSAGE)
        assert 1 <= int(refused.headers["retry-after"]) <= AUTH_FAILURE_WINDOW_SECONDS
        assert mcp_post(server, good).status_code == 429  # ... but a locked address is locked
        log = server.log()
    finally:
        server.stop()
    assert BAD not in log and good not in log


def test_bad_limit_settings_are_check_errors():
    from parallel_mcp import checks

    for value in (0, -1, "20", True, 2.5):
        with override_settings(PARALLEL_MCP={"AUTH_FAILURE_LIMIT": value}):
            assert [m.id for m in checks.check_settings()] == ["parallel_mcp.E003"], value
    for value in (0, None, "60"):
        with override_settings(PARALLEL_MCP={"AUTH_FAILURE_WINDOW_SECONDS": value}):
            assert [m.id for m in checks.check_settings()] == ["parallel_mcp.E003"], value
    with override_settings(
        PARALLEL_MCP={"AUTH_FAILURE_LIMIT": None, "AUTH_FAILURE_WINDOW_SECONDS": 300}
    ):
        assert checks.check_settings() == []

"""Fixtures of the HTTP API tests: ``pytest_plugins = ["tests.api_fixtures"]`` in a test
module (helpers are in ``tests.api_helpers``)."""

from __future__ import annotations

import pytest
from django.contrib.auth.models import User
from django.core.cache import cache
from django.test import Client

from tests.api_helpers import (
    OPERATOR_PERMS,
    VIEW_PERMS,
    WORKER_PERMS,
    Api,
    bearer,
    make_user,
    token_for,
)


@pytest.fixture(autouse=True)
def _fresh_throttle_cache():
    cache.clear()
    yield
    cache.clear()


@pytest.fixture
def anon(db) -> Api:
    return Api(Client())


@pytest.fixture
def plain_user(db) -> User:
    return make_user("plain")


@pytest.fixture
def viewer_user(db) -> User:
    return make_user("viewer", VIEW_PERMS)


@pytest.fixture
def operator_user(db) -> User:
    return make_user("operator", OPERATOR_PERMS)


@pytest.fixture
def worker_user(db) -> User:
    return make_user("worker", WORKER_PERMS)


@pytest.fixture
def root_user(db) -> User:
    return make_user("root", superuser=True)


@pytest.fixture
def plain(plain_user) -> Api:
    return bearer(token_for(plain_user))


@pytest.fixture
def viewer(viewer_user) -> Api:
    return bearer(token_for(viewer_user))


@pytest.fixture
def operator(operator_user) -> Api:
    return bearer(token_for(operator_user))


@pytest.fixture
def worker(worker_user) -> Api:
    return bearer(token_for(worker_user))


@pytest.fixture
def root(root_user) -> Api:
    return bearer(token_for(root_user))


@pytest.fixture
def root_worker_token(root_user) -> Api:
    """A superuser's token with the worker role: the worker protocol and reads."""
    return bearer(token_for(root_user, "worker"))


@pytest.fixture
def root_read_token(root_user) -> Api:
    """A superuser's token with the read role: reads only."""
    return bearer(token_for(root_user, "read"))

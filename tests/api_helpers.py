"""Helpers of the HTTP API tests: a JSON client, users with permissions, tokens."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

from django.contrib.auth.models import Permission, User
from django.test import Client

from parallel_mcp.actors import Actor, acting_as
from parallel_mcp.services.tokens import create_token

PREFIX = "/api/pmcp/"

VIEW_PERMS = ["view_run", "view_task", "view_event", "view_contextsnapshot", "view_attempt"]
OPERATOR_PERMS = [*VIEW_PERMS, "operate_runs"]
WORKER_PERMS = ["work_tasks"]

# PARALLEL_MCP_API for event-stream tests: polls and heartbeats every few milliseconds.
FAST_SSE = {"SSE_POLL_SECONDS": 0.02, "SSE_HEARTBEAT_SECONDS": 0.05, "SSE_RETRY_MS": 500}


class Api:
    """A test client speaking JSON to the API under ``/api/pmcp/``."""

    def __init__(self, client: Client, secret: str | None = None) -> None:
        self.client = client
        self.secret = secret

    def acting(self):
        """In-process calls made as this client's token: what the services record (and fence
        leases by) when the call comes through the API with it."""
        assert self.secret is not None, "a bearer-token client"
        return acting_as(Actor(principal=f"token:{self.secret.split('_')[1]}"))

    def _url(self, path: str) -> str:
        return path if path.startswith("/") else PREFIX + path

    def get(self, path: str, params: Any = None, **extra: Any):
        return self.client.get(self._url(path), params or {}, **extra)

    def post(self, path: str, body: Any = None, **extra: Any):
        if body is None:
            data: Any = b""
        elif isinstance(body, (bytes, str)):
            data = body  # sent as is
        else:
            data = json.dumps(body)
        return self.client.post(
            self._url(path), data=data, content_type="application/json", **extra
        )

    def request(self, method: str, path: str, **extra: Any):
        return self.client.generic(method, self._url(path), **extra)


def make_user(name: str, perms: list[str] = (), *, superuser: bool = False) -> User:
    if superuser:
        user = User.objects.create_superuser(name, password="pw")
    else:
        user = User.objects.create_user(name, password="pw")
    if perms:
        user.user_permissions.add(
            *Permission.objects.filter(content_type__app_label="parallel_mcp", codename__in=perms)
        )
    return User.objects.get(pk=user.pk)  # fresh permission cache


def token_for(user: User, role: str = "full", **kwargs: Any) -> str:
    return create_token(
        using="default", user=user, name=f"{user.username}-{role}", role=role, **kwargs
    ).secret


def bearer(secret: str) -> Api:
    return Api(Client(headers={"Authorization": f"Bearer {secret}"}), secret)


def error_of(response) -> dict[str, Any]:
    body = response.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"code", "message", "details"}, body
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert isinstance(body["error"]["details"], dict)
    return body["error"]


class AsgiServer:
    """Django's ASGI application under uvicorn, in a thread of the test process (so it sees
    the test's settings and database), on a free loopback port."""

    def __init__(self) -> None:
        import uvicorn
        from django.core.asgi import get_asgi_application

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        config = uvicorn.Config(
            get_asgi_application(), host="127.0.0.1", port=port, lifespan="off", log_level="error"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> AsgiServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def schema_accepts(openapi: dict[str, Any], component: str, instance: Any) -> bool:
    """Whether the API's OpenAPI 3.1 schema (JSON Schema 2020-12, formats asserted, patterns
    read as ECMA-262 regexes, as clients and schemathesis read them) calls ``instance`` a valid
    ``component``."""
    import jsonschema_rs

    root = {"$ref": f"#/components/schemas/{component}", "components": openapi["components"]}
    return jsonschema_rs.Draft202012Validator(root, validate_formats=True).is_valid(instance)


def openapi_schema() -> dict[str, Any]:
    """The API's OpenAPI schema as ``GET schema/`` serves it (with the settings in force)."""
    from drf_spectacular.generators import SchemaGenerator
    from drf_spectacular.renderers import OpenApiJsonRenderer
    from drf_spectacular.settings import patched_settings

    from parallel_mcp.api.schema import SCHEMA_SETTINGS

    with patched_settings(SCHEMA_SETTINGS):
        schema = SchemaGenerator().get_schema(request=None, public=True)
    return json.loads(OpenApiJsonRenderer().render(schema, renderer_context={}))

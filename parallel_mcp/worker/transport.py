"""HTTP transport of the remote orchestrator: JSON requests to ``parallel_mcp.api`` with a bearer
token, and its error envelope mapped back to the orchestrator's exceptions.

One ``httpx2.Client`` serves every thread of the worker (slots, handler threads): httpx2
clients are thread-safe, and a shared connection pool lets a handler thread reuse the
keep-alive connection a slot thread opened, where a client per thread would open a new
connection for every task (each handler runs in a thread of its own). Needs the ``remote``
extra (``pip install 'parallel-mcp[remote]'``).
"""

from __future__ import annotations

import json
from typing import Any

import httpx2

from .. import exceptions

# The orchestrator errors the API reports by their stable ``code``.
ERRORS_BY_CODE = exceptions.ERRORS_BY_CODE
# Idle keep-alive connections kept per worker process (more are opened when needed).
KEEPALIVE_CONNECTIONS = 32
# A Retry-After longer than this is capped: the worker's own retry loop decides after that.
MAX_RETRY_AFTER_SECONDS = 30.0


class RemoteError(exceptions.ParallelMcpError):
    """The API answered with something that is not one of the orchestrator's errors
    (``details["status"]`` and ``details["code"]`` say what): a refused token (401), a missing
    permission (403), an unknown endpoint, a redirect."""

    code = "remote_error"


class RemoteTransientError(RemoteError):
    """A timeout, a connection error, a 5xx or throttling (429): worth retrying, after
    ``retry_after`` seconds when the server said so."""

    code = "remote_unavailable"

    def __init__(self, message: str, *, retry_after: float | None = None, **details: Any) -> None:
        super().__init__(message, **details)
        self.retry_after = retry_after


def _json(value: Any) -> str:
    """Strict JSON, as the local orchestrator stores it: no NaN, nothing unserialisable."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False)


def _is_json(value: Any) -> bool:
    try:
        _json(value)
    except (TypeError, ValueError):
        return False
    return True


def _retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header (the API sends whole seconds; an HTTP date is
    ignored: the retry loop's own backoff applies)."""
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    if seconds != seconds or seconds < 0:  # NaN or negative
        return None
    return min(seconds, MAX_RETRY_AFTER_SECONDS)


def _envelope_says(response: httpx2.Response) -> str:
    """`` (code: message)`` of the API's error envelope, so a log line says why (a throttled
    address, say); empty for any other body (a proxy's page)."""
    try:
        error = response.json().get("error")
        return f" ({error['code']}: {error['message']})" if isinstance(error, dict) else ""
    except (ValueError, AttributeError, KeyError):
        return ""


class ApiTransport:
    """GET and POST JSON under the API's base URL; answers ``(status, data)``."""

    def __init__(
        self,
        *,
        base_url: str,
        token: str,
        timeout: float,
        transport: httpx2.BaseTransport | None = None,
    ) -> None:
        try:
            url = httpx2.URL(base_url)
        except httpx2.InvalidURL:
            url = None
        if url is None or url.scheme not in ("http", "https") or not url.host:
            raise exceptions.ValidationError(
                f"--api must be an http(s) URL such as http://host:8000/api/pmcp/, "
                f"got {base_url!r}.",
                field="api",
            )
        if not token:
            raise exceptions.ValidationError("A token is required for the API.", field="token")
        self.base_url = str(url.copy_with(query=None, fragment=None)).rstrip("/") + "/"
        # The token lives only in the client's headers, which httpx2 masks in every repr.
        self._client = httpx2.Client(
            base_url=self.base_url,
            headers={
                "Authorization": f"Bearer {token}",
                "Accept": "application/json",
                "User-Agent": "parallel-mcp-remote-worker",
            },
            timeout=httpx2.Timeout(timeout),
            limits=httpx2.Limits(
                max_connections=None, max_keepalive_connections=KEEPALIVE_CONNECTIONS
            ),
            follow_redirects=False,  # a POST must not turn into a GET elsewhere
            transport=transport,
        )

    def __repr__(self) -> str:
        return f"ApiTransport({self.base_url})"

    def close(self) -> None:
        self._client.close()

    def get(self, path: str, params: dict[str, Any] | None = None) -> tuple[int, Any]:
        query = {key: value for key, value in (params or {}).items() if value is not None}
        return self._send("GET", path, params=query)

    def post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        try:
            content = _json(body)
        except (TypeError, ValueError) as exc:
            name = next(key for key in body if not _is_json(body[key]))
            raise exceptions.ValidationError(
                f"{name} must be JSON-serialisable: {exc}.", field=name
            ) from None
        return self._send(
            "POST", path, content=content, headers={"Content-Type": "application/json"}
        )

    def _send(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx2.TransportError as exc:  # connect, read, write and pool timeouts included
            raise RemoteTransientError(
                f"API unreachable: {type(exc).__name__}: {exc or 'no answer'}"
            ) from None
        status = response.status_code
        if status >= 500 or status == 429:
            raise RemoteTransientError(
                f"API answered {status}{_envelope_says(response)}.",
                status=status,
                retry_after=_retry_after(response.headers.get("Retry-After")),
            )
        if 300 <= status < 400:
            raise RemoteError(
                f"API answered {status} (a redirect to {response.headers.get('Location')!r}): "
                "check the --api URL.",
                status=status,
            )
        data = None
        if response.content:
            try:
                data = response.json()
            except ValueError:
                raise RemoteError(
                    f"API answered {status} with a body that is not JSON.", status=status
                ) from None
        if status >= 400:
            raise self._error(status, data)
        return status, data

    @staticmethod
    def _error(status: int, data: Any) -> exceptions.ParallelMcpError:
        error = data.get("error") if isinstance(data, dict) else None
        if not isinstance(error, dict):
            return RemoteError(f"API answered {status}.", status=status)
        code = str(error.get("code") or "")
        message = str(error.get("message") or f"API answered {status}.")
        raw = error.get("details")
        details: dict[str, Any] = dict(raw) if isinstance(raw, dict) else {}
        cls: type[exceptions.ParallelMcpError] = ERRORS_BY_CODE.get(code, RemoteError)
        if cls is exceptions.RecordNotFoundError and not details:
            # No record named: the path itself is unknown (a wrong --api URL, an older server).
            cls = RemoteError
        exc = cls(message)
        exc.details = details
        if cls is RemoteError:
            exc.details.setdefault("status", status)
            exc.details.setdefault("code", code)
        return exc

"""The worker protocol over HTTP: an Orchestrator look-alike for workers without database
access (``pmcp_worker --api URL --token TOKEN``). It speaks to ``parallel_mcp.api`` and maps
its error envelope back to the same exceptions the local Orchestrator raises, so the Worker
loop and handlers cannot tell the difference."""

from __future__ import annotations

import dataclasses
import http.client
import json
import threading
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

from .. import exceptions
from ..models import Attempt, Lease, Run, Task
from ..results import Claim

ERRORS_BY_CODE = {
    cls.code: cls
    for cls in (
        exceptions.RecordNotFoundError,
        exceptions.InvalidTransitionError,
        exceptions.LeaseConflictError,
        exceptions.LeaseExpiredError,
        exceptions.RunTerminalError,
        exceptions.DuplicateTaskKeyError,
        exceptions.DependencyCycleError,
        exceptions.InvalidDependencyError,
        exceptions.IdempotencyConflictError,
        exceptions.ValidationError,
    )
}


class RemoteError(exceptions.ParallelMcpError):
    """The API answered with something that is not one of the orchestrator's errors."""

    code = "remote_error"


class RemoteTransientError(RemoteError):
    """Connection trouble, a 5xx, or throttling: worth retrying."""

    code = "remote_unavailable"


@dataclass(frozen=True)
class RemoteClaim(Claim):
    context: Any = None


def _datetime(value: Any) -> datetime | None:
    return None if value in (None, "") else datetime.fromisoformat(value)


def _uuid(value: Any) -> uuid.UUID | None:
    return None if value in (None, "") else uuid.UUID(str(value))


def _claim(data: dict[str, Any]) -> RemoteClaim:
    return RemoteClaim(
        run=_instance(Run, data["run"]),
        task=_instance(Task, data["task"]),
        attempt=_instance(Attempt, data["attempt"]),
        lease=_instance(Lease, data["lease"]),
        context=data.get("context"),
    )


def _instance(model: type, data: dict[str, Any]) -> Any:
    """An unsaved model instance from its API representation (read-only use)."""
    values: dict[str, Any] = {}
    for field in model._meta.concrete_fields:
        key = field.attname if field.attname in data else field.name
        if key not in data:
            continue
        value = data[key]
        target = field.target_field if field.is_relation else field
        if target.get_internal_type() == "DateTimeField":
            value = _datetime(value)
        elif target.get_internal_type() == "UUIDField":
            value = _uuid(value)
        values[field.attname] = value
    instance = model(**values)
    if model is Task and "depends_on_task_ids" in data:
        instance._depends_on_cache = [_uuid(item) for item in data["depends_on_task_ids"]]
    return instance


class RemoteOrchestrator:
    """The worker-protocol subset of ``Orchestrator``, over HTTP with a bearer token."""

    def __init__(
        self, *, base_url: str, token: str, default_lease_ms: int = 30_000, timeout: float = 30.0
    ) -> None:
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise exceptions.ValidationError(
                f"--api must be an http(s) URL such as http://host:8000/api/pmcp/, "
                f"got {base_url!r}.",
                field="api",
            )
        if not token:
            raise exceptions.ValidationError("A token is required for the API.", field="token")
        self.scheme = parts.scheme
        self.host = parts.hostname
        self.port = parts.port
        self.prefix = parts.path.rstrip("/") + "/"
        self.token = token
        self.timeout = timeout
        self.default_lease_ms = default_lease_ms
        self.using = None  # no database here
        self._local = threading.local()

    def __repr__(self) -> str:  # never show the token
        return f"RemoteOrchestrator({self.scheme}://{self.host}:{self.port}{self.prefix})"

    # -- transport --------------------------------------------------------------------------
    def _connection(self) -> http.client.HTTPConnection:
        connection = getattr(self._local, "connection", None)
        if connection is None:
            cls = (
                http.client.HTTPSConnection
                if self.scheme == "https"
                else http.client.HTTPConnection
            )
            connection = cls(self.host, self.port, timeout=self.timeout)
            self._local.connection = connection
        return connection

    def close_thread(self) -> None:
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

    def _post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        payload = json.dumps(body, separators=(",", ":")).encode()
        headers = {
            "Authorization": f"Bearer {self.token}",
            "Content-Type": "application/json",
            "Accept": "application/json",
        }
        try:
            connection = self._connection()
            connection.request("POST", self.prefix + path, body=payload, headers=headers)
            response = connection.getresponse()
            raw = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self.close_thread()
            raise RemoteTransientError(f"API unreachable: {type(exc).__name__}: {exc}") from None
        status = response.status
        if status >= 500 or status == 429:
            raise RemoteTransientError(f"API answered {status}.", status=status)
        data = None
        if raw:
            try:
                data = json.loads(raw)
            except ValueError:
                raise RemoteError(
                    f"API answered {status} with a body that is not JSON.", status=status
                ) from None
        if status >= 400:
            raise self._error(status, data)
        return status, data

    def _error(self, status: int, data: Any) -> exceptions.ParallelMcpError:
        error = (data or {}).get("error") if isinstance(data, dict) else None
        if not isinstance(error, dict):
            return RemoteError(f"API answered {status}.", status=status)
        cls = ERRORS_BY_CODE.get(error.get("code"), RemoteError)
        exc = cls(str(error.get("message") or f"API answered {status}."))
        exc.details = dict(error.get("details") or {})
        if cls is RemoteError:
            exc.details.setdefault("status", status)
            exc.details.setdefault("code", error.get("code"))
        return exc

    def _task(self, path: str, body: dict[str, Any]) -> Task:
        _, data = self._post(path, body)
        return _instance(Task, data)

    # -- the worker protocol ------------------------------------------------------------------
    def claim_next_task(
        self,
        *,
        worker_id: str,
        lease_ms: int | None = None,
        kinds: Any = None,
        client_token: str | None = None,
        start: bool = False,
        now: Any = None,
    ) -> RemoteClaim | None:
        body = self._claim_body(worker_id, lease_ms, kinds, client_token, start)
        status, data = self._post("worker/claim", body)
        if status == 204 or not data:
            return None
        return self._started(_claim(data), worker_id, start)

    def claim_next_tasks(
        self,
        *,
        worker_id: str,
        limit: int,
        lease_ms: int | None = None,
        kinds: Any = None,
        client_token: str | None = None,
        start: bool = False,
        now: Any = None,
    ) -> list[RemoteClaim]:
        """Up to ``limit`` claims in one request (``POST worker/claim/batch``), in claim order."""
        body = self._claim_body(worker_id, lease_ms, kinds, client_token, start)
        body["limit"] = limit
        _, data = self._post("worker/claim/batch", body)
        claims = (data or {}).get("claims") or []
        return [self._started(_claim(item), worker_id, start) for item in claims]

    @staticmethod
    def _claim_body(
        worker_id: str, lease_ms: int | None, kinds: Any, client_token: str | None, start: bool
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "worker_id": worker_id,
            "lease_ms": lease_ms,
            "kinds": list(kinds) if kinds else None,
            "client_token": client_token,
        }
        if start is not False:
            body["start"] = start  # left out by default: the body older servers know
        return body

    def _started(self, claim: RemoteClaim, worker_id: str, start: bool) -> RemoteClaim:
        """With ``start``, a claim still ``leased`` came from a server that ignores the field
        (worker bodies ignore unknown fields): start it with a second call."""
        if start is not True or claim.task.status != "leased":
            return claim
        task = self.mark_task_running(
            task_id=claim.task.pk, lease_id=claim.lease.pk, worker_id=worker_id
        )
        claim.attempt.status = "running"
        claim.attempt.started_at = task.started_at
        return dataclasses.replace(claim, task=task)

    def mark_task_running(
        self, *, task_id: Any, lease_id: Any, worker_id: str, now: Any = None
    ) -> Task:
        return self._task(
            f"tasks/{task_id}/running", {"lease_id": str(lease_id), "worker_id": worker_id}
        )

    def heartbeat_lease(
        self,
        *,
        task_id: Any,
        lease_id: Any,
        worker_id: str,
        lease_ms: int | None = None,
        now: Any = None,
    ) -> Lease:
        _, data = self._post(
            f"tasks/{task_id}/heartbeat",
            {
                "lease_id": str(lease_id),
                "worker_id": worker_id,
                "lease_ms": lease_ms,
            },
        )
        return _instance(Lease, data["lease"])

    def report_progress(
        self,
        *,
        task_id: Any,
        lease_id: Any,
        worker_id: str,
        progress: float,
        message: str | None = None,
        now: Any = None,
    ) -> Task:
        return self._task(
            f"tasks/{task_id}/progress",
            {
                "lease_id": str(lease_id),
                "worker_id": worker_id,
                "progress": progress,
                "message": message,
            },
        )

    def pause_task(
        self,
        *,
        task_id: Any,
        lease_id: Any,
        worker_id: str,
        status: str,
        reason: str | None = None,
        blocked_by: Any = None,
        now: Any = None,
    ) -> Task:
        return self._task(
            f"tasks/{task_id}/pause",
            {
                "lease_id": str(lease_id),
                "worker_id": worker_id,
                "status": status,
                "reason": reason,
                "blocked_by": [str(item) for item in blocked_by] if blocked_by else None,
            },
        )

    def complete_task(
        self,
        *,
        task_id: Any,
        lease_id: Any,
        worker_id: str,
        output: Any = None,
        metadata: Any = None,
        next_context: Any = None,
        next_context_label: str | None = None,
        client_token: str | None = None,
        now: Any = None,
    ) -> Task:
        return self._task(
            f"tasks/{task_id}/complete",
            {
                "lease_id": str(lease_id),
                "worker_id": worker_id,
                "output": output,
                "metadata": metadata,
                "next_context": next_context,
                "next_context_label": next_context_label,
                "client_token": client_token,
            },
        )

    def fail_task(
        self,
        *,
        task_id: Any,
        lease_id: Any,
        worker_id: str,
        error: str,
        metadata: Any = None,
        retry: bool = False,
        client_token: str | None = None,
        now: Any = None,
    ) -> Task:
        return self._task(
            f"tasks/{task_id}/fail",
            {
                "lease_id": str(lease_id),
                "worker_id": worker_id,
                "error": error,
                "metadata": metadata,
                "retry": retry,
                "client_token": client_token,
            },
        )

    def release_task(
        self,
        *,
        task_id: Any,
        lease_id: Any,
        worker_id: str,
        reason: str | None = None,
        now: Any = None,
    ) -> Task:
        return self._task(
            f"tasks/{task_id}/release",
            {
                "lease_id": str(lease_id),
                "worker_id": worker_id,
                "reason": reason,
            },
        )

    # -- worker presence ------------------------------------------------------------------------
    def record_worker_presence(
        self,
        *,
        process_id: Any,
        worker_id: str,
        hostname: str,
        kinds: Any,
        interval_ms: int,
        pid: int | None = None,
        concurrency: int = 1,
    ) -> dict[str, Any]:
        """``POST worker/presence``: this process runs and handles ``kinds``; the server records
        it (as a remote worker) until three ``interval_ms`` after the last report."""
        _, data = self._post(
            "worker/presence",
            {
                "process_id": str(process_id),
                "worker_id": worker_id,
                "hostname": hostname,
                "pid": pid,
                "kinds": list(kinds),
                "concurrency": concurrency,
                "interval_ms": interval_ms,
            },
        )
        return data

    def remove_worker_presence(self, *, process_id: Any) -> None:
        """``POST worker/presence/stop``: this process stopped cleanly."""
        self._post("worker/presence/stop", {"process_id": str(process_id)})

"""The orchestrator over HTTP, for workers without database access
(``pmcp_worker --api URL --token TOKEN``) and any other Python client of ``parallel_mcp.api``.

``RemoteOrchestrator`` implements the whole
:class:`~parallel_mcp.contract.protocol.OrchestratorProtocol`: the worker protocol, the reads and
the operator calls, with the same signatures as ``Orchestrator``. Results are unsaved model
instances (and the same result dataclasses) built from the one serialized shape of each object
(:mod:`parallel_mcp.contract.shapes`); errors are the same exception classes, mapped back from
the API's error envelope by their ``code``. What differs, because a client cannot do it:

* ``now`` must be ``None`` (the server's clock decides): any other value is a
  ``ValidationError``;
* ``transaction()`` raises (each call is its own transaction on the server);
* ``offset`` is honoured by walking the API's keyset pages, up to ``MAX_REMOTE_OFFSET``;
* transport trouble (timeouts, connection errors, 5xx, 429) is a ``RemoteTransientError``; a
  refused token or permission a ``RemoteError`` (401, 403).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from .. import exceptions
from ..conf import app_settings
from ..contract import limits, shapes
from ..contract import validation as v
from ..contract.protocol import UNSET, Dependency, Id, Json, OrchestratorProtocol
from ..ids import parse_id
from ..models import ContextSnapshot, Event, Lease, Run, Task
from ..results import Blocker, Claim, EventPage, ExpireResult, PruneResult, RemoteClaim
from ..states import RunStatus
from . import wire
from .transport import ApiTransport, RemoteError, RemoteTransientError

__all__ = ["RemoteClaim", "RemoteError", "RemoteOrchestrator", "RemoteTransientError"]


class RemoteOrchestrator(OrchestratorProtocol):
    """The orchestrator over ``parallel_mcp.api`` with a bearer token (see the module
    docstring). Safe to share between threads: one connection pool serves them all.

    What the token reaches is what its role and its user's permissions allow: a ``worker``
    token only the worker protocol; reads (``get_task``, ``list_run_tasks``, …) need a token
    whose user holds the matching ``view_*`` permissions, operator calls ``operate_runs``.
    """

    def __init__(
        self,
        *,
        base_url: str,
        token: str,
        default_lease_ms: int = 30_000,
        timeout: float = 30.0,
        page_size: int | None = None,
        transport: Any = None,
    ) -> None:
        """``timeout``: seconds per request (connect, read, write, pool). ``page_size``: rows
        per request when a list is read in pages (default ``PARALLEL_MCP["MAX_LIST_LIMIT"]``;
        lower it for a server whose ceiling is lower). ``transport``: an
        ``httpx2.BaseTransport`` (custom TLS, proxies, tests)."""
        self.default_lease_ms = v.positive_ms(default_lease_ms, "default_lease_ms")
        self.page_size = None if page_size is None else v.limit(page_size, name="page_size")
        self.using = None  # no database here
        self._http = ApiTransport(
            base_url=base_url, token=token, timeout=timeout, transport=transport
        )

    def __repr__(self) -> str:  # never the token
        return f"RemoteOrchestrator({self._http.base_url})"

    def __enter__(self) -> RemoteOrchestrator:
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the pooled connections."""
        self._http.close()

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Not available remotely: see the module docstring."""
        raise RemoteError(
            "transaction() needs database access: through the HTTP API every call is its own "
            "transaction on the server. Enqueue a graph all at once with enqueue_tasks."
        )
        yield  # pragma: no cover  (makes this a generator, like Orchestrator.transaction)

    # -- transport ----------------------------------------------------------------------------
    def _get(self, path: str, params: dict[str, Any] | None = None) -> tuple[int, Any]:
        return self._http.get(path, params)

    def _post(self, path: str, body: dict[str, Any]) -> tuple[int, Any]:
        return self._http.post(path, body)

    def _walk(
        self, path: str, params: dict[str, Any], *, skip: int = 0, take: int | None = None
    ) -> list[dict[str, Any]]:
        """The rows of a keyset-paginated list: the first ``skip`` left out, then ``take`` rows
        (None: all of them)."""
        wanted = None if take is None else skip + take
        rows: list[dict[str, Any]] = []
        cursor = None
        while wanted is None or len(rows) < wanted:
            size = self._page_size()
            if wanted is not None:
                size = min(size, wanted - len(rows))
            _, data = self._get(path, {**params, "limit": size, "cursor": cursor})
            rows.extend(data["results"])
            if data.get("next_cursor") in (None, cursor):
                break
            cursor = data["next_cursor"]
        return rows[skip:wanted]

    def _page_size(self) -> int:
        return self.page_size or app_settings.MAX_LIST_LIMIT

    def _task(self, path: str, body: dict[str, Any]) -> Task:
        _, data = self._post(path, body)
        return wire.task_from(data)

    def _lease_call(self, task_id: Any, action: str, body: dict[str, Any]) -> Task:
        return self._task(wire.task_path(task_id, action), body)

    @staticmethod
    def _offset(offset: Any) -> int:
        start = v.offset(offset)
        if start > limits.MAX_REMOTE_OFFSET:
            raise exceptions.ValidationError(
                f"offset is at most {limits.MAX_REMOTE_OFFSET} through the API (each skipped "
                "row is read); page with the API's cursors instead.",
                field="offset",
            )
        return start

    # -- runs -------------------------------------------------------------------------------
    def create_run(
        self,
        *,
        namespace: str = "default",
        external_id: str | None = None,
        metadata: Json = None,
        context: Json = None,
        id: Id | None = None,
        max_parallel: int | None = None,
        now: datetime | None = None,
    ) -> Run:
        wire.refuse_now(now)
        _, data = self._post(
            "runs",
            {
                "namespace": namespace,
                "external_id": external_id,
                "metadata": metadata,
                "context": context,
                "id": wire.id_text(id),
                "max_parallel": max_parallel,
            },
        )
        return wire.run_from(data)

    def get_run(self, *, run_id: Id) -> Run | None:
        parsed = parse_id(run_id)
        if parsed is None:
            return None
        try:
            _, data = self._get(wire.run_path(parsed))
        except exceptions.RecordNotFoundError:
            return None
        return wire.run_from(data)

    def cancel_run(
        self, *, run_id: Id, reason: str | None = None, now: datetime | None = None
    ) -> Run:
        wire.refuse_now(now)
        _, data = self._post(wire.run_path(run_id, "cancel"), {"reason": reason})
        return wire.run_from(data)

    def list_runs(
        self,
        *,
        namespace: str | None = None,
        statuses: Iterable[str] | None = None,
        external_id: str | None = None,
        updated_after: datetime | None = None,
        updated_before: datetime | None = None,
        limit: int | None = None,
        offset: int = 0,
        order_by: str = "updated_at",
        order_dir: str = "desc",
    ) -> list[Run]:
        params = {
            "namespace": namespace,
            "status": v.choice_list(statuses, "statuses", RunStatus),
            "external_id": external_id,
            "updated_after": wire.when(updated_after, "updated_after"),
            "updated_before": wire.when(updated_before, "updated_before"),
            "order_by": order_by,
            "order_dir": order_dir,
        }
        rows = self._walk("runs", params, skip=self._offset(offset), take=v.limit(limit))
        return [wire.run_from(row) for row in rows]

    def prune_runs(
        self,
        *,
        older_than: datetime | timedelta,
        statuses: Iterable[str] | None = None,
        limit: int | None = None,
        now: datetime | None = None,
    ) -> PruneResult:
        wire.refuse_now(now)
        body: dict[str, Any] = {
            "statuses": v.choice_list(statuses, "statuses", RunStatus),
            "limit": limit,
        }
        if isinstance(older_than, timedelta):
            body["older_than_ms"] = older_than // timedelta(milliseconds=1)
        else:
            body["older_than"] = wire.when(older_than, "older_than")
        _, data = self._post("maintenance/prune", body)
        return PruneResult(**shapes.PRUNE_RESULT.load(data))

    def copy_run(
        self, *, run_id: Id, reason: str | None = None, now: datetime | None = None
    ) -> Run:
        wire.refuse_now(now)
        _, data = self._post(wire.run_path(run_id, "copy"), {"reason": reason})
        return wire.run_from(data)

    # -- tasks ------------------------------------------------------------------------------
    def enqueue_task(
        self,
        *,
        run_id: Id,
        kind: str,
        key: str | None = None,
        priority: int = 0,
        max_attempts: int | None = None,
        retry: Mapping[str, Any] | None = None,
        timeout_ms: int | None = None,
        input: Json = None,
        metadata: Json = None,
        depends_on: Iterable[Dependency] = (),
        not_before: datetime | None = None,
        context_snapshot_id: Id | None = None,
        id: Id | None = None,
        now: datetime | None = None,
    ) -> Task:
        wire.refuse_now(now)
        body = wire.task_body(
            {
                "kind": kind,
                "key": key,
                "priority": priority,
                "max_attempts": max_attempts,
                "retry": retry,
                "timeout_ms": timeout_ms,
                "input": input,
                "metadata": metadata,
                "depends_on": depends_on,
                "not_before": not_before,
                "context_snapshot_id": context_snapshot_id,
                "id": id,
            }
        )
        return self._task(wire.run_path(run_id, "tasks"), body)

    def enqueue_tasks(
        self, *, run_id: Id, tasks: Iterable[Mapping[str, Any]], now: datetime | None = None
    ) -> list[Task]:
        wire.refuse_now(now)
        items = wire.as_list(tasks)
        if not isinstance(items, list):
            raise exceptions.ValidationError(
                "tasks must be a list of enqueue_task argument dicts.", field="tasks"
            )
        body = {"tasks": [wire.task_body(item) for item in items]}
        _, data = self._post(wire.run_path(run_id, "tasks", "batch"), body)
        return [wire.task_from(item) for item in data["tasks"]]

    def claim_next_task(
        self,
        *,
        worker_id: str,
        lease_ms: int | None = None,
        kinds: Iterable[str] | None = None,
        client_token: str | None = None,
        start: bool = False,
        now: datetime | None = None,
    ) -> RemoteClaim | None:
        wire.refuse_now(now)
        body = self._claim_body(worker_id, lease_ms, kinds, client_token, start)
        status, data = self._post("worker/claim", body)
        if status == 204 or not data:
            return None
        return self._started(wire.claim_from(data), worker_id, start)

    def claim_next_tasks(
        self,
        *,
        worker_id: str,
        limit: int,
        lease_ms: int | None = None,
        kinds: Iterable[str] | None = None,
        client_token: str | None = None,
        start: bool = False,
        now: datetime | None = None,
    ) -> list[Claim]:
        """Up to ``limit`` claims in one request (``POST worker/claim/batch``), in claim order;
        each a ``RemoteClaim``."""
        wire.refuse_now(now)
        body = self._claim_body(worker_id, lease_ms, kinds, client_token, start)
        body["limit"] = limit
        _, data = self._post("worker/claim/batch", body)
        claims = (data or {}).get("claims") or []
        return [self._started(wire.claim_from(item), worker_id, start) for item in claims]

    def _claim_body(
        self,
        worker_id: str,
        lease_ms: int | None,
        kinds: Any,
        client_token: str | None,
        start: bool,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "worker_id": worker_id,
            "lease_ms": self.default_lease_ms if lease_ms is None else lease_ms,
            "kinds": v.kinds(kinds),
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
        self, *, task_id: Id, lease_id: Id, worker_id: str, now: datetime | None = None
    ) -> Task:
        wire.refuse_now(now)
        return self._lease_call(
            task_id, "running", {"lease_id": wire.id_text(lease_id), "worker_id": worker_id}
        )

    def heartbeat_lease(
        self,
        *,
        task_id: Id,
        lease_id: Id,
        worker_id: str,
        lease_ms: int | None = None,
        now: datetime | None = None,
    ) -> Lease:
        wire.refuse_now(now)
        _, data = self._post(
            wire.task_path(task_id, "heartbeat"),
            {
                "lease_id": wire.id_text(lease_id),
                "worker_id": worker_id,
                "lease_ms": self.default_lease_ms if lease_ms is None else lease_ms,
            },
        )
        return wire.lease_from(data["lease"])

    def report_progress(
        self,
        *,
        task_id: Id,
        lease_id: Id,
        worker_id: str,
        progress: float,
        message: str | None = None,
        now: datetime | None = None,
    ) -> Task:
        wire.refuse_now(now)
        return self._lease_call(
            task_id,
            "progress",
            {
                "lease_id": wire.id_text(lease_id),
                "worker_id": worker_id,
                "progress": progress,
                "message": message,
            },
        )

    def pause_task(
        self,
        *,
        task_id: Id,
        lease_id: Id,
        worker_id: str,
        status: str,
        reason: str | None = None,
        blocked_by: Iterable[Id] | None = None,
        input_requests: Mapping[str, Any] | None = None,
        now: datetime | None = None,
    ) -> Task:
        wire.refuse_now(now)
        return self._lease_call(
            task_id,
            "pause",
            {
                "lease_id": wire.id_text(lease_id),
                "worker_id": worker_id,
                "status": status,
                "reason": reason,
                "blocked_by": wire.id_list(blocked_by),
                "input_requests": input_requests,
            },
        )

    def resume_task(
        self,
        *,
        task_id: Id,
        input: Json = UNSET,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Task:
        wire.refuse_now(now)
        body: dict[str, Any] = {"reason": reason}
        if input is not UNSET:
            body["input"] = input  # present, even null: replaces the task's input
        return self._task(wire.task_path(task_id, "resume"), body)

    def complete_task(
        self,
        *,
        task_id: Id,
        lease_id: Id,
        worker_id: str,
        output: Json = None,
        metadata: Json = None,
        next_context: Json = None,
        next_context_label: str | None = None,
        client_token: str | None = None,
        now: datetime | None = None,
    ) -> Task:
        wire.refuse_now(now)
        return self._lease_call(
            task_id,
            "complete",
            {
                "lease_id": wire.id_text(lease_id),
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
        task_id: Id,
        lease_id: Id,
        worker_id: str,
        error: str,
        metadata: Json = None,
        retry: bool = False,
        client_token: str | None = None,
        now: datetime | None = None,
    ) -> Task:
        wire.refuse_now(now)
        return self._lease_call(
            task_id,
            "fail",
            {
                "lease_id": wire.id_text(lease_id),
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
        task_id: Id,
        lease_id: Id,
        worker_id: str,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Task:
        wire.refuse_now(now)
        return self._lease_call(
            task_id,
            "release",
            {"lease_id": wire.id_text(lease_id), "worker_id": worker_id, "reason": reason},
        )

    def cancel_task(
        self, *, task_id: Id, reason: str | None = None, now: datetime | None = None
    ) -> Task:
        wire.refuse_now(now)
        return self._task(wire.task_path(task_id, "cancel"), {"reason": reason})

    def retry_task(
        self,
        *,
        task_id: Id,
        cascade: bool = True,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Task:
        wire.refuse_now(now)
        return self._task(
            wire.task_path(task_id, "retry"),
            {"cascade": cascade, "reason": reason},
        )

    def requeue_dead_task(
        self,
        *,
        task_id: Id,
        reset_attempts: bool = True,
        not_before: datetime | None = None,
        reason: str | None = None,
        now: datetime | None = None,
    ) -> Task:
        wire.refuse_now(now)
        return self._task(
            wire.task_path(task_id, "requeue"),
            {
                "reset_attempts": reset_attempts,
                "not_before": wire.when(not_before, "not_before"),
                "reason": reason,
            },
        )

    def expire_leases(self, *, now: datetime | None = None) -> ExpireResult:
        wire.refuse_now(now)
        _, data = self._post("maintenance/expire-leases", {})
        return ExpireResult(**shapes.EXPIRE_RESULT.load(data))

    # -- reads ------------------------------------------------------------------------------
    def get_task(self, *, task_id: Id) -> Task | None:
        parsed = parse_id(task_id)
        if parsed is None:
            return None
        try:
            _, data = self._get(wire.task_path(parsed))
        except exceptions.RecordNotFoundError:
            return None
        # The detail's attempts and blockers are left out; its input_responses are kept.
        return wire.task_from(data, shapes.TASK_DETAIL)

    def list_run_tasks(self, *, run_id: Id) -> list[Task]:
        try:
            rows = self._walk(wire.run_path(run_id, "tasks"), {})
        except exceptions.RecordNotFoundError:
            return []  # no such run: no tasks, as locally
        return [wire.task_from(row) for row in rows]

    def list_pending_tasks(
        self,
        *,
        run_id: Id | None = None,
        kinds: Iterable[str] | None = None,
        ready_by: datetime | None = None,
        limit: int | None = None,
    ) -> list[Task]:
        params = {
            "run_id": wire.id_text(run_id),
            "kind": v.kinds(kinds),
            "ready_by": wire.when(ready_by, "ready_by"),
        }
        rows = self._walk("tasks/pending", params, take=v.limit(limit))
        return [wire.task_from(row) for row in rows]

    def list_dead_tasks(
        self,
        *,
        run_id: Id | None = None,
        kinds: Iterable[str] | None = None,
        limit: int | None = None,
        offset: int = 0,
    ) -> list[Task]:
        params = {"run_id": wire.id_text(run_id), "kind": v.kinds(kinds)}
        rows = self._walk("tasks/dead", params, skip=self._offset(offset), take=v.limit(limit))
        return [wire.task_from(row) for row in rows]

    def list_stuck_tasks(
        self, *, running_longer_than_ms: int | None = None, now: datetime | None = None
    ) -> list[Task]:
        wire.refuse_now(now)
        _, data = self._get("tasks/stuck", {"running_longer_than_ms": running_longer_than_ms})
        return [wire.task_from(row) for row in data["results"]]

    def explain_task(self, *, task_id: Id, now: datetime | None = None) -> list[Blocker]:
        wire.refuse_now(now)
        _, data = self._get(wire.task_path(task_id))
        return [wire.blocker_from(item) for item in data["blockers"]]

    # -- context and events -----------------------------------------------------------------
    def append_context_snapshot(
        self,
        *,
        run_id: Id,
        payload: Json,
        scope: str = "run",
        label: str | None = None,
        task_id: Id | None = None,
        parent_snapshot_id: Id | None = None,
        id: Id | None = None,
        now: datetime | None = None,
    ) -> ContextSnapshot:
        wire.refuse_now(now)
        _, data = self._post(
            wire.run_path(run_id, "context"),
            {
                "payload": payload,
                "scope": scope,
                "label": label,
                "task_id": wire.id_text(task_id),
                "parent_snapshot_id": wire.id_text(parent_snapshot_id),
                "id": wire.id_text(id),
            },
        )
        return wire.snapshot_from(data)

    def get_current_context_snapshot(self, *, run_id: Id) -> ContextSnapshot | None:
        parsed = parse_id(run_id)
        if parsed is None:
            return None
        try:
            _, data = self._get(wire.run_path(parsed, "context"))
        except exceptions.RecordNotFoundError:
            return None
        snapshot = data.get("snapshot")
        return None if snapshot is None else wire.snapshot_from(snapshot)

    def list_run_events(self, *, run_id: Id) -> list[Event]:
        path = wire.run_path(run_id, "events")
        events: list[Event] = []
        after = None
        while True:
            try:
                _, data = self._get(path, {"after_id": after, "limit": self._page_size()})
            except exceptions.RecordNotFoundError:
                return []  # no such run: no events, as locally
            events.extend(wire.event_from(row) for row in data["results"])
            if not data.get("has_more") or data.get("next_cursor") in (None, after):
                return events
            after = data["next_cursor"]

    def list_events_since(
        self,
        *,
        after_id: int | None = None,
        run_id: Id | None = None,
        event_types: Iterable[str] | None = None,
        limit: int | None = None,
    ) -> EventPage:
        params = {
            "after_id": after_id,
            "run_id": wire.id_text(run_id),
            "type": v.event_types(event_types),
            "limit": limit,
        }
        try:
            _, data = self._get("events", params)
        except exceptions.RecordNotFoundError:
            # An unknown run has no events; the cursor stays where it was, as locally.
            return EventPage(events=[], next_cursor=after_id)
        return EventPage(
            events=[wire.event_from(row) for row in data["results"]],
            next_cursor=data["next_cursor"],
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

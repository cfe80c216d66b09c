"""``notifications/tasks`` for clients that listen (io.modelcontextprotocol/tasks, 2026-07-28).

A client opens a ``subscriptions/listen`` stream naming ``notifications.taskIds``. The server
acknowledges the ids of the tasks the caller may see (the others are left out, as ``tasks/get``
answers "not found" for them), sends each task's ``DetailedTask`` at once, then again whenever
what ``tasks/get`` would answer changes, until every one of them is completed or cancelled; then
it ends the stream gracefully (the listen result).

Changes come from the event log, so that workers, other replicas and this server's own writes
are all seen: one :class:`EventFeed` per server reads ``list_events_since`` every
``MCP_TASK_NOTIFY_POLL_MS`` for all its streams (one read, however many listen; whichever
stream waits when a read is due makes it), and wakes the streams whose runs had events. A woken
stream reads its task as ``tasks/get`` does and sends it when it differs from what it sent last
(``lastUpdatedAt`` aside: heartbeats move it). The feed starts at the end of the log behind the
event fence, and each stream registers before it reads its tasks, so no change is missed.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, Literal
from uuid import UUID

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp.shared.subscriptions import SUBSCRIPTION_ID_META_KEY
from pydantic import BaseModel

from .. import selectors
from ..conf import app_settings
from ..contract import limits
from ..ids import parse_id
from .task_state import CANCELLED, COMPLETED, FAILED

NOTIFICATION: Literal["notifications/tasks"] = "notifications/tasks"
TASK_IDS = "taskIds"  # the extension's key in the listen filter and its acknowledgement
FINAL_STATUSES = (COMPLETED, FAILED, CANCELLED)
# Events read per poll; a full page is followed by another read at once.
FEED_BATCH = 500

# A run id -> what tasks/get answers for its task, or None when the caller may not see it.
ReadTask = Callable[[UUID], Awaitable[dict[str, Any] | None]]
# Runs a function in a database thread and awaits it.
DbCall = Callable[..., Awaitable[Any]]


class TaskStatusNotification(BaseModel):
    """``notifications/tasks``: ``params`` is the ``DetailedTask`` (and the stream's
    ``_meta``)."""

    method: Literal["notifications/tasks"] = NOTIFICATION
    params: dict[str, Any]


class Listener:
    """One listen stream's interest: its runs, and those that had events since it looked."""

    def __init__(self, runs: set[UUID]) -> None:
        self.runs = runs
        self.changed: set[UUID] = set()
        self.wake = anyio.Event()

    def notice(self, runs: set[UUID]) -> None:
        hit = runs & self.runs
        if hit:
            self.changed |= hit
            self.wake.set()


class EventFeed:
    """The event log as seen by one server's listen streams (see the module docstring)."""

    def __init__(self, *, orchestrator: Any, db: DbCall) -> None:
        self.orchestrator = orchestrator
        self.db = db
        self.cursor: int | None = None
        self.listeners: list[Listener] = []
        self.lock = anyio.Lock()
        self.next_poll = 0.0

    @property
    def interval(self) -> float:
        return app_settings.MCP_TASK_NOTIFY_POLL_MS / 1000

    @asynccontextmanager
    async def listen(self, runs: set[UUID]) -> AsyncIterator[Listener]:
        async with self.lock:
            if self.cursor is None:  # the first listener: from the end of the log on
                self.cursor = await self.db(selectors.last_event_id, using=self.orchestrator.using)
            listener = Listener(runs)
            self.listeners.append(listener)
        try:
            yield listener
        finally:
            self.listeners.remove(listener)
            if not self.listeners:
                self.cursor = None  # nobody listens: the next listener starts afresh

    async def changed(self, listener: Listener) -> set[UUID]:
        """Wait until some of ``listener``'s runs had events; those runs."""
        while not listener.changed:
            now = time.monotonic()
            if now >= self.next_poll and not self.lock.locked():
                async with self.lock:
                    if time.monotonic() >= self.next_poll:
                        await self._poll()
                        self.next_poll = time.monotonic() + self.interval
                continue
            # Another stream is reading (its result wakes us), or the next read is not due.
            wait = self.interval if self.lock.locked() else self.next_poll - now
            with anyio.move_on_after(max(0.0, wait)):
                await listener.wake.wait()
        runs, listener.changed = listener.changed, set()
        listener.wake = anyio.Event()
        return runs

    async def _poll(self) -> None:
        read = self.orchestrator.list_events_since
        while self.listeners:
            page = await self.db(read, after_id=self.cursor, limit=FEED_BATCH)
            self.cursor = page.next_cursor
            runs = {event.run_id for event in page.events}
            for listener in list(self.listeners):
                listener.notice(runs)
            if len(page.events) < FEED_BATCH:
                return


class TaskListenStreams:
    """Serves ``subscriptions/listen`` streams of task ids, at most
    ``MAX_TASK_LISTEN_STREAMS`` at once."""

    def __init__(self, feed: EventFeed) -> None:
        self.feed = feed
        self.open = 0

    @staticmethod
    def requested_ids(params: types.SubscriptionsListenRequestParams) -> list[str] | None:
        """The ``taskIds`` of the filter (None when it names none); -32602 when malformed."""
        ids = (params.notifications.model_extra or {}).get(TASK_IDS)
        if ids is None:
            return None
        if not isinstance(ids, list) or not all(isinstance(item, str) for item in ids):
            raise MCPError(types.INVALID_PARAMS, f"notifications.{TASK_IDS} must be a list of ids.")
        if len(ids) > limits.MAX_LISTEN_TASK_IDS:
            raise MCPError(
                types.INVALID_PARAMS,
                f"notifications.{TASK_IDS} names more than {limits.MAX_LISTEN_TASK_IDS} tasks.",
                {"limit": limits.MAX_LISTEN_TASK_IDS},
            )
        return list(dict.fromkeys(ids))

    async def serve(
        self,
        ctx: Any,
        requested: list[str],
        visible: Callable[[list[UUID]], Awaitable[set[UUID]]],
        read_task: ReadTask,
    ) -> types.SubscriptionsListenResult:
        """One stream: ``visible(ids)`` says which of the runs the caller may see,
        ``read_task(run_id)`` reads what tasks/get answers."""
        subscription_id = ctx.request_id
        if subscription_id is None:
            raise MCPError(types.INVALID_REQUEST, "subscriptions/listen requires a request id")
        if self.open >= limits.MAX_TASK_LISTEN_STREAMS:
            raise MCPError(types.INTERNAL_ERROR, "Subscription limit reached")
        meta: dict[str, Any] = {SUBSCRIPTION_ID_META_KEY: subscription_id}
        parsed: dict[str, UUID] = {}
        for text in requested:
            uuid = parse_id(text)
            if uuid is not None:  # not an id: no such task
                parsed[text] = uuid
        seen = await visible(list(parsed.values())) if parsed else set()
        honored = [text for text, uuid in parsed.items() if uuid in seen]
        runs = {parsed[text] for text in honored}
        self.open += 1
        try:
            async with self.feed.listen(runs) as listener:  # before the first read
                await self._send(
                    ctx,
                    types.SubscriptionsAcknowledgedNotification(
                        params=types.SubscriptionsAcknowledgedNotificationParams(
                            notifications=types.SubscriptionFilter.model_validate(
                                {TASK_IDS: honored} if honored else {}
                            ),
                            _meta=meta,
                        )
                    ),
                )
                last: dict[UUID, dict[str, Any]] = {}
                pending = set(runs)
                changed = set(runs)  # each task as it is now, first
                while pending:
                    for run_id in sorted(changed & pending):
                        task = await read_task(run_id)
                        if task is None:  # expired or pruned meanwhile
                            pending.discard(run_id)
                            continue
                        seen_now = {k: v for k, v in task.items() if k != "lastUpdatedAt"}
                        if last.get(run_id) != seen_now:
                            last[run_id] = seen_now
                            await self._send(
                                ctx, TaskStatusNotification(params={**task, "_meta": meta})
                            )
                        if task["status"] in FINAL_STATUSES:
                            pending.discard(run_id)
                    if pending:
                        changed = await self.feed.changed(listener)
        finally:
            self.open -= 1
        return types.SubscriptionsListenResult(_meta=meta)

    @staticmethod
    async def _send(ctx: Any, notification: Any) -> None:
        await ctx.session.send_notification(notification, related_request_id=ctx.request_id)

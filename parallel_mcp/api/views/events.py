"""The event log: pages (``list_events_since``) and a Server-Sent Events stream."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIRequest
from django.db import connections
from django.http import StreamingHttpResponse
from drf_spectacular.utils import OpenApiExample, OpenApiParameter, OpenApiResponse
from rest_framework.exceptions import ValidationError
from rest_framework.renderers import BaseRenderer, JSONRenderer
from rest_framework.response import Response
from rest_framework.utils.encoders import JSONEncoder

from ...conf import app_settings
from ...contract import shapes
from ...contract.arguments import EVENT_ID
from ...orchestrator import Orchestrator
from ...selectors import last_event_id
from ..permissions import READ
from ..schema import api_schema
from ..serializers import inputs, outputs
from ..serializers.fields import Arg
from ..settings import api_settings
from ..streams import AsyncHeldStream, HeldStream, open_streams, stream_owner
from .base import ApiView, JsonErrorsMixin
from .common import event_page, require_run

EVENT_PAGE_EXAMPLE = {
    "results": [
        {
            "id": 1041,
            "run_id": "0195f3a1-8c1e-7a11-9c3e-2b1f0d7e4a01",
            "task_id": "0195f3a1-8c20-7d11-a2b3-c4d5e6f70803",
            "attempt_id": "0195f3a1-9d00-7e00-8a00-0a0b0c0d0e0f",
            "event_type": "task.completed",
            "payload": {"worker_id": "host-1:4242"},
            "created_at": "2026-01-01T12:00:07Z",
        }
    ],
    "next_cursor": 1041,
    "has_more": False,
}


class EventsView(ApiView):
    access = READ
    view_permissions = ("parallel_mcp.view_event",)
    error_statuses = (404,)  # run_id names no run
    tags = ("events",)

    @api_schema(
        operation_id="events_list",
        summary="Events after a cursor",
        description="list_events_since: events in id order after after_id; pass next_cursor "
        "back as after_id. Never skips a committed event, even with concurrent writers on "
        "PostgreSQL.",
        parameters=[inputs.EventsQuery],
        responses={200: outputs.EventPageOut},
        examples=[OpenApiExample("A page", value=EVENT_PAGE_EXAMPLE)],
    )
    def get(self, request: Any) -> Response:
        params = self.query(inputs.EventsQuery)
        if params.get("run_id") is not None:
            require_run(self.using, params["run_id"])
        return Response(event_page(self, params))


# -- Server-Sent Events ---------------------------------------------------------------------


class EventStreamRenderer(BaseRenderer):
    """Lets ``Accept: text/event-stream`` through content negotiation (the view streams)."""

    media_type = "text/event-stream"
    format = "sse"
    charset = "utf-8"

    def render(self, data: Any, accepted_media_type: Any = None, renderer_context: Any = None):
        return b"" if data is None else json.dumps(data, cls=JSONEncoder).encode()


def release_connection(using: str) -> None:
    """Close the database connection between polls (outside a transaction only: a test
    transaction or an enclosing atomic block keeps it)."""
    connection = connections[using]
    if not connection.in_atomic_block:
        connection.close()


class EventStream:
    """Polls ``list_events_since`` and formats SSE frames; every poll is its own short
    read, after which the connection is closed, so an idle stream holds no transaction and
    no connection."""

    def __init__(
        self,
        orchestrator: Orchestrator,
        *,
        after: int | None,
        run_id: Any,
        event_types: list[str] | None,
        timeout: float,
    ) -> None:
        self.orchestrator = orchestrator
        self.cursor = after
        self.run_id = run_id
        self.event_types = event_types
        self.timeout = timeout
        self.poll_seconds = max(0.01, float(api_settings.SSE_POLL_SECONDS))
        self.heartbeat_seconds = max(0.01, float(api_settings.SSE_HEARTBEAT_SECONDS))
        self.batch = max(1, min(int(api_settings.SSE_BATCH), app_settings.MAX_LIST_LIMIT))
        self.retry_ms = int(api_settings.SSE_RETRY_MS)
        self.full = False

    def opening(self) -> str:
        return f"retry: {self.retry_ms}\n: parallel_mcp event stream\n\n"

    def closing(self) -> str:
        return f"event: end\ndata: {json.dumps({'next_cursor': self.cursor})}\n\n"

    def poll(self) -> str:
        try:
            page = self.orchestrator.list_events_since(
                after_id=self.cursor,
                run_id=self.run_id,
                event_types=self.event_types,
                limit=self.batch,
            )
            frames = [
                f"id: {data['id']}\ndata: {json.dumps(data, cls=JSONEncoder)}\n\n"
                for data in shapes.events(page.events)
            ]
        finally:
            release_connection(self.orchestrator.using)
        self.cursor = page.next_cursor
        self.full = len(page.events) >= self.batch
        return "".join(frames)

    def _wait(self, now: float, deadline: float, last_write: float) -> float:
        return max(
            0.0, min(self.poll_seconds, deadline - now, last_write + self.heartbeat_seconds - now)
        )

    def __iter__(self) -> Iterator[str]:
        deadline = time.monotonic() + self.timeout
        try:
            yield self.opening()
            last_write = time.monotonic()
            while True:
                chunk = self.poll()
                now = time.monotonic()
                if chunk:
                    yield chunk
                    last_write = now
                    if self.full and now < deadline:
                        continue
                if now >= deadline:
                    break
                if now - last_write >= self.heartbeat_seconds:
                    yield ": heartbeat\n\n"
                    last_write = now
                time.sleep(self._wait(now, deadline, last_write))
            yield self.closing()
        finally:
            release_connection(self.orchestrator.using)

    async def aiter(self) -> AsyncIterator[str]:
        """The same loop for ASGI servers: polls run in a worker thread, waits are async."""
        poll = sync_to_async(self.poll, thread_sensitive=True)
        deadline = time.monotonic() + self.timeout
        yield self.opening()
        last_write = time.monotonic()
        while True:
            chunk = await poll()
            now = time.monotonic()
            if chunk:
                yield chunk
                last_write = now
                if self.full and now < deadline:
                    continue
            if now >= deadline:
                break
            if now - last_write >= self.heartbeat_seconds:
                yield ": heartbeat\n\n"
                last_write = now
            await asyncio.sleep(self._wait(now, deadline, last_write))
        yield self.closing()


# One event of the stream (OpenAPI 3.1 describes a text/event-stream by the schema of one event).
SSE_EVENT_SCHEMA = {
    "type": "object",
    "properties": {
        "id": {"type": "string", "description": "The event's id (what Last-Event-ID resumes)."},
        "event": {
            "type": "string",
            "enum": ["message", "end"],
            "description": "message (the default) for events; end on the last frame.",
        },
        "data": {
            "type": "string",
            "description": 'JSON: the event (as in GET events), or {"next_cursor": id} for end.',
        },
        "retry": {"type": "integer", "description": "Reconnect delay advised (ms)."},
    },
    "required": ["data"],
}


LAST_EVENT_ID = "Last-Event-ID"


def parse_last_event_id(value: str | None) -> int | None:
    """The ``Last-Event-ID`` header: absent, or an event id (as its schema says; EventSource
    never sends an empty one). Spaces and tabs around it are not part of the value (RFC 9110),
    whether or not the HTTP server removed them."""
    if value is None:
        return None
    field = Arg(EVENT_ID, query=True)  # header text is parsed like a query string's
    field.field_name = LAST_EVENT_ID
    try:
        return field.to_internal_value(value.strip(" \t"))
    except ValidationError as exc:
        raise ValidationError({LAST_EVENT_ID: exc.detail}) from None


class EventStreamView(JsonErrorsMixin, ApiView):
    access = READ
    view_permissions = ("parallel_mcp.view_event",)
    renderer_classes = [JSONRenderer, EventStreamRenderer]
    error_statuses = (404, 503)  # run_id names no run; too many open streams
    tags = ("events",)

    @api_schema(
        operation_id="events_stream",
        summary="Server-Sent Events: new events as they are written",
        description=(
            "A `text/event-stream` of events in id order, each as `id: <event id>` and "
            "`data: <the event as JSON>`. Resumes after the `Last-Event-ID` header (sent by "
            "EventSource on reconnect) or `?after_id=`; without either it starts at the current "
            "end of the log. Sends `: heartbeat` comments when idle and closes after `timeout` "
            "seconds with `event: end` (EventSource reconnects by itself). A token (or session "
            "user) may hold `SSE_MAX_STREAMS_PER_TOKEN` streams at once (then 429 "
            "`too_many_streams`), a server process `SSE_MAX_STREAMS` (then 503)."
        ),
        parameters=[
            inputs.StreamQuery,
            OpenApiParameter(
                LAST_EVENT_ID,
                EVENT_ID.schema(),
                OpenApiParameter.HEADER,
                required=False,
                description="Resume after this event id (wins over after_id).",
            ),
        ],
        responses={
            (200, "text/event-stream"): OpenApiResponse(
                response=SSE_EVENT_SCHEMA,
                description="One frame per event (the schema describes one event, as OpenAPI "
                "3.1 does for text/event-stream).",
            )
        },
    )
    def get(self, request: Any) -> StreamingHttpResponse:
        params = self.query(inputs.StreamQuery)
        after = parse_last_event_id(request.META.get("HTTP_LAST_EVENT_ID"))
        if after is None:
            after = params.get("after_id")
        run_id = params.get("run_id")
        if run_id is not None:
            require_run(self.using, run_id)
        if after is None:  # start at the current end of the log (no later event of the run)
            after = last_event_id(using=self.using)
        ceiling = float(api_settings.SSE_MAX_SECONDS)
        timeout = params.get("timeout")
        timeout = float(api_settings.SSE_DEFAULT_SECONDS) if timeout is None else timeout
        stream = EventStream(
            self.orchestrator,
            after=after,
            run_id=run_id,
            event_types=params.get("type") or None,
            timeout=max(0.0, min(timeout, ceiling)),
        )
        slot = open_streams.acquire(stream_owner(request))  # last: a refusal holds nothing
        is_asgi = isinstance(getattr(request, "_request", request), ASGIRequest)
        content = (
            AsyncHeldStream(stream.aiter(), slot) if is_asgi else HeldStream(iter(stream), slot)
        )
        response = StreamingHttpResponse(content, content_type="text/event-stream; charset=utf-8")
        response["Cache-Control"] = "no-cache"
        response["X-Accel-Buffering"] = "no"  # nginx: do not buffer the stream
        return response

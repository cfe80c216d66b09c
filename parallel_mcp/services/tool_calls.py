"""Runs created by MCP tool calls, and the input their tasks ask the client for.

- ``start_tool_call``: one transaction creates the run (labelled with the tool and the
  caller), its one task of the tool's kind and the ``ToolCall`` row; the MCP task id is the
  run id, and it exists for ``tasks/get`` as soon as this returns.
- ``request_input``: a leased task records what it asks (``inputRequests``) before it pauses
  ``waiting_input``; keys are unique in the run over its whole life.
- ``answer_input``: a client's ``inputResponses`` are recorded for the keys that are
  outstanding (others are ignored, as the extension says); a task whose every request is
  answered is resumed in the same transaction.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any
from uuid import UUID

from ..contract import limits
from ..contract import validation as v
from ..exceptions import ValidationError
from ..models import InputRequest, Task, ToolCall
from ..states import TaskStatus
from . import enqueue, outcomes, runs
from .gate import write_transaction
from .leases import lease_args, leased_task
from .write import write

# The namespace of runs created by tool calls.
TOOL_CALL_NAMESPACE = "mcp.tool"
# The principal of callers that are not authenticated (stdio, an unauthenticated loopback
# HTTP server): they all see each other's tasks.
LOCAL_PRINCIPAL = "local"
# The server-to-client requests a task may ask for (the extension's InputRequest).
INPUT_METHODS = ("elicitation/create", "sampling/createMessage", "roots/list")
# The key of the tool's own task in its run.
TOOL_TASK_KEY = "tool"


def start_tool_call(
    *,
    using: str,
    tool: str,
    kind: str,
    input: Any,
    principal: str,
    ttl_ms: int | None,
    now: datetime | None = None,
) -> ToolCall:
    """Create the run of one tool call, holding one task of ``kind`` with ``input``."""
    now = v.resolve_now(now)
    tool = v.text(tool, "tool")
    principal = v.text(principal, "principal")
    ttl_ms = v.integer(ttl_ms, "ttl_ms", minimum=1, maximum=limits.MAX_MS, allow_none=True)
    with write_transaction(using):
        run = runs.create_run(
            using=using,
            namespace=TOOL_CALL_NAMESPACE,
            metadata={"mcp_tool": tool, "mcp_caller": principal},
            now=now,
        )
        task = enqueue.enqueue_task(
            using=using, run_id=run.pk, kind=kind, key=TOOL_TASK_KEY, input=input, now=now
        )
        call = ToolCall(
            run=run, tool=tool, principal=principal, task=task, ttl_ms=ttl_ms, created_at=now
        )
        call.save(using=using, force_insert=True)
    return call


def _input_requests(requests: Any) -> dict[str, Any]:
    if not isinstance(requests, dict) or not requests:
        raise ValidationError(
            "input_requests must be a non-empty object of {key: request}.", field="input_requests"
        )
    if len(requests) > limits.MAX_INPUT_KEYS:
        raise ValidationError(
            f"input_requests has more than {limits.MAX_INPUT_KEYS} keys.", field="input_requests"
        )
    for key, request in requests.items():
        v.text(key, "input_requests key")
        where = f"input_requests[{key!r}]"
        if not isinstance(request, dict) or request.get("method") not in INPUT_METHODS:
            raise ValidationError(
                f"{where} must be an object whose method is one of {', '.join(INPUT_METHODS)}.",
                field="input_requests",
            )
        if not isinstance(request.get("params", {}), dict):
            raise ValidationError(f"{where}.params must be an object.", field="input_requests")
    return v.json_value(requests, "input_requests")


def request_input(
    *,
    using: str,
    task_id: Any,
    lease_id: Any,
    worker_id: Any,
    requests: Any,
    now: datetime | None = None,
) -> list[InputRequest]:
    """Record what the leased task asks the client (before it pauses ``waiting_input``).

    Asking again for a key still outstanding with the same request changes nothing (a task
    re-run after a crash asks the same); a key answered already, asked with another request or
    used by another task of the run is refused (``ValidationError``).
    """
    now = v.resolve_now(now)
    task_uuid, lease_uuid, worker = lease_args(task_id, lease_id, worker_id)
    requests = _input_requests(requests)
    with write(using=using, now=now) as w:
        run, task = leased_task(w, task_uuid, lease_uuid, worker)
        existing = {
            row.key: row
            for row in InputRequest.objects.using(using).filter(run_id=run.pk, key__in=requests)
        }
        rows = []
        for key, request in requests.items():
            row = existing.get(key)
            if row is None:
                rows.append(
                    InputRequest(
                        run_id=run.pk, task_id=task.pk, key=key, request=request, requested_at=now
                    )
                )
                continue
            if row.task_id != task.pk:
                raise ValidationError(
                    f"Input request key {key!r} is used by another task of run {run.pk}: keys "
                    "are unique in a run.",
                    field="input_requests",
                    key=key,
                )
            if row.answered_at is not None:
                raise ValidationError(
                    f"Input request {key!r} was answered already (see ctx.input_responses); "
                    "ask for more with a new key.",
                    field="input_requests",
                    key=key,
                )
            if row.request != request:
                raise ValidationError(
                    f"Input request {key!r} was asked with another request: a key names one "
                    "request over the task's life.",
                    field="input_requests",
                    key=key,
                )
        InputRequest.objects.using(using).bulk_create(rows)
    return rows


def _input_responses(responses: Any) -> dict[str, Any]:
    if not isinstance(responses, dict):
        raise ValidationError(
            "inputResponses must be an object of {key: response}.", field="inputResponses"
        )
    if len(responses) > limits.MAX_INPUT_KEYS:
        raise ValidationError(
            f"inputResponses has more than {limits.MAX_INPUT_KEYS} keys.",
            field="inputResponses",
            limit=limits.MAX_INPUT_KEYS,
        )
    try:
        size = len(json.dumps(responses, allow_nan=False, separators=(",", ":")).encode())
    except (TypeError, ValueError) as exc:
        raise ValidationError(
            f"inputResponses is not JSON: {exc}.", field="inputResponses"
        ) from None
    if size > limits.MAX_INPUT_RESPONSES_BYTES:
        raise ValidationError(
            f"inputResponses is larger than {limits.MAX_INPUT_RESPONSES_BYTES} bytes of JSON.",
            field="inputResponses",
            limit=limits.MAX_INPUT_RESPONSES_BYTES,
        )
    for key, response in responses.items():
        if not isinstance(response, dict):
            raise ValidationError(
                f"inputResponses[{key!r}] must be an object (the client's result).",
                field="inputResponses",
            )
    return v.json_value(responses, "inputResponses")


def answer_input(
    *,
    using: str,
    run_id: Any,
    responses: Any,
    principal: str | None = None,
    now: datetime | None = None,
) -> int:
    """Record ``responses`` for the run's outstanding input requests (those of its tasks that
    wait for input, not answered yet); other keys are ignored. Each task whose requests are
    all answered goes back to the queue. Returns how many answers were recorded."""
    now = v.resolve_now(now)
    run_uuid = v.require_id(run_id, "run_id")
    responses = _input_responses(responses)
    keys = [key for key in responses if isinstance(key, str)]
    if not keys:
        return 0
    with write_transaction(using):  # the answers and the resumptions commit together
        with write(using=using, now=now) as w:
            run = w.lock_run(run_uuid)
            outstanding = list(
                InputRequest.objects.using(using).filter(
                    run_id=run.pk,
                    key__in=keys,
                    answered_at__isnull=True,
                    task__status=TaskStatus.WAITING_INPUT,
                )
            )
            answered: set[UUID] = set()
            for row in outstanding:
                InputRequest.objects.using(using).filter(pk=row.pk).update(
                    response=responses[row.key], answered_at=now, answered_by=principal
                )
                answered.add(row.task_id)
            w.touch(run.pk)
        for task_id in sorted(answered):
            _resume_if_answered(using, task_id, now)
    return len(outstanding)


def _resume_if_answered(using: str, task_id: UUID, now: datetime) -> None:
    """Resume a waiting task once nothing it asked is unanswered."""
    still_open = InputRequest.objects.using(using).filter(task_id=task_id, answered_at__isnull=True)
    waiting = Task.objects.using(using).filter(pk=task_id, status=TaskStatus.WAITING_INPUT)
    if waiting.exists() and not still_open.exists():
        outcomes.resume_task(using=using, task_id=task_id, reason="input received", now=now)

"""Runs created by MCP tool calls, and the client's answers to the input their tasks ask for
(docs/internals.md, "MCP tool calls and input requests")."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from ..contract import arguments as a
from ..contract import limits
from ..contract import validation as v
from ..exceptions import ValidationError
from ..models import InputRequest, ToolCall
from ..models.tool_calls import outstanding_input
from . import enqueue, outcomes, runs
from .gate import write_transaction
from .write import write

# The namespace of runs created by tool calls.
TOOL_CALL_NAMESPACE = "mcp.tool"
# The principal of callers that are not authenticated (stdio, an unauthenticated loopback
# HTTP server): they all see each other's tasks.
LOCAL_PRINCIPAL = "local"
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
    """Create the run of one tool call, holding one task of ``kind`` with ``input``, and its
    ``ToolCall`` row, in one transaction: the MCP task id is the run id."""
    now = v.resolve_now(now)
    tool = v.text(tool, "tool")
    principal = v.text(principal, "principal")
    ttl_ms = None if ttl_ms is None else a.DURATION_MS.check(ttl_ms, "ttl_ms")
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
            run=run,
            tool=tool,
            principal=principal,
            task=task,
            ttl_ms=ttl_ms,
            created_at=now,
            expires_at=None if ttl_ms is None else now + timedelta(milliseconds=ttl_ms),
        )
        call.save(using=using, force_insert=True)
    return call


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
    for key, response in responses.items():
        if not isinstance(response, dict):
            raise ValidationError(
                f"inputResponses[{key!r}] must be an object (the client's result).",
                field="inputResponses",
            )
    # Depth first (measured without recursion): encoding a document nested thousands of
    # levels deep would exhaust the stack.
    responses = v.json_value(responses, "inputResponses")
    size = len(json.dumps(responses, separators=(",", ":")).encode())
    if size > limits.MAX_INPUT_RESPONSES_BYTES:
        raise ValidationError(
            f"inputResponses is larger than {limits.MAX_INPUT_RESPONSES_BYTES} bytes of JSON.",
            field="inputResponses",
            limit=limits.MAX_INPUT_RESPONSES_BYTES,
        )
    return responses


def answer_input(
    *,
    using: str,
    run_id: Any,
    responses: Any,
    principal: str | None = None,
    now: datetime | None = None,
) -> int:
    """Record ``responses`` for the run's outstanding input requests (other keys are ignored)
    and resume each task left with none, in one transaction. Returns how many answers were
    recorded."""
    now = v.resolve_now(now)
    run_uuid = v.require_id(run_id, "run_id")
    responses = _input_responses(responses)
    keys = [key for key in responses if isinstance(key, str)]
    if not keys:
        return 0
    answered: dict[UUID, list[str]] = defaultdict(list)
    with write_transaction(using):  # the answers and the resumptions commit together
        with write(using=using, now=now) as w:
            run = w.lock_run(run_uuid)
            outstanding = InputRequest.objects.using(using).filter(outstanding_input(run.pk))
            for row in outstanding.filter(key__in=keys).only("pk", "key", "task_id"):
                unanswered = InputRequest.objects.using(using).filter(
                    pk=row.pk, answered_at__isnull=True
                )
                recorded = unanswered.update(
                    response=responses[row.key], answered_at=now, answered_by=principal
                )
                if recorded:
                    answered[row.task_id].append(row.key)
            still_open = _open_keys(outstanding.filter(task_id__in=list(answered)))
            for task_id in sorted(answered):
                w.event(
                    "task.input_received",
                    run_id=run.pk,
                    task_id=task_id,
                    payload={
                        "keys": sorted(answered[task_id]),
                        "outstanding": still_open.get(task_id, []),
                    },
                )
            if answered:
                w.touch(run.pk)
        for task_id in sorted(answered):
            if task_id not in still_open:
                outcomes.resume_task(using=using, task_id=task_id, reason="input received", now=now)
    return sum(len(answered_keys) for answered_keys in answered.values())


def _open_keys(requests: Any) -> dict[UUID, list[str]]:
    """The keys still unanswered of each task, in key order."""
    open_keys: dict[UUID, list[str]] = defaultdict(list)
    for task_id, key in requests.order_by("task_id", "key").values_list("task_id", "key"):
        open_keys[task_id].append(key)
    return dict(open_keys)

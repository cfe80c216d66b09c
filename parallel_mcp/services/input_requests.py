"""The input a task of a tool call's run asks the MCP client for, recorded in the write that
pauses it ``waiting_input``; a key names one request over the run's life (docs/internals.md)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from ..exceptions import ValidationError
from ..models import InputRequest, ToolCall
from .write import Write

FIELD = "input_requests"


def record(w: Write, run_id: UUID, task_id: UUID, requests: dict[str, Any]) -> None:
    """Record ``requests`` (validated by ``arguments.INPUT_REQUESTS``) for the task, whose run
    ``w`` has locked."""
    if not ToolCall.objects.using(w.using).filter(pk=run_id).exists():
        raise ValidationError(
            f"Run {run_id} was not created by an MCP tool call: no client can answer "
            "input_requests. Pause waiting_input without them (resume_task answers).",
            field=FIELD,
        )
    existing = {
        row.key: row
        for row in InputRequest.objects.using(w.using).filter(run_id=run_id, key__in=requests)
    }
    new = []
    for key, request in requests.items():
        row = existing.get(key)
        if row is None:
            new.append(
                InputRequest(
                    run_id=run_id, task_id=task_id, key=key, request=request, requested_at=w.now
                )
            )
            continue
        if row.task_id != task_id:
            why = f"key {key!r} is used by another task of run {run_id}: keys are unique in a run."
        elif row.answered_at is not None:
            why = (
                f"{key!r} was answered already (see ctx.input_responses); ask for more with a "
                "new key."
            )
        elif row.request != request:
            why = (
                f"{key!r} was asked with another request: a key names one request over the "
                "run's life."
            )
        else:
            continue  # asked again, unanswered, alike: a handler re-run after a crash
        raise ValidationError(f"Input request {why}", field=FIELD, key=key)
    InputRequest.objects.using(w.using).bulk_create(new)

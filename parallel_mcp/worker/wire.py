"""Between the orchestrator's Python values and the HTTP API's JSON, for ``RemoteOrchestrator``:
results built from the one serialized shape of each object (:mod:`parallel_mcp.contract.shapes`)
as unsaved, read-only model instances, and arguments in their wire form, checked by the
contract's own rules where the wire cannot carry them as given."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

from django.db import models

from .. import exceptions
from ..contract import shapes
from ..contract import validation as v
from ..models import Attempt, ContextSnapshot, Event, Lease, Run, Task
from ..results import Blocker, RemoteClaim

M = TypeVar("M", bound=models.Model)


# -- results from their serialized shapes --------------------------------------------------------
def instance(model: type[M], shape: shapes.Shape, data: dict[str, Any]) -> tuple[M, dict]:
    """An unsaved, read-only instance of ``model`` from ``shape``'s JSON, and the loaded values
    (for the fields that are not columns)."""
    values = shape.load(data)
    attnames = {field.attname for field in model._meta.concrete_fields}
    instance = model(**{name: value for name, value in values.items() if name in attnames})
    instance._state.adding = False
    return instance, values


def run_from(data: dict[str, Any]) -> Run:
    return instance(Run, shapes.RUN, data)[0]  # progress is derived from the counters


def task_from(data: dict[str, Any], shape: shapes.Shape = shapes.TASK) -> Task:
    """A task from ``shape``'s JSON (``TASK_DETAIL`` for ``get_task``)."""
    task, values = instance(Task, shape, data)
    if "depends_on_task_ids" in values:
        task._depends_on_cache = values["depends_on_task_ids"]
    if "running_for_ms" in values:  # list_stuck_tasks only
        task.running_for_ms = values["running_for_ms"]
    if "input_responses" in values:  # the task's detail (get_task) only
        task._input_responses_cache = values["input_responses"]
    return task


def attempt_from(data: dict[str, Any]) -> Attempt:
    return instance(Attempt, shapes.ATTEMPT, data)[0]


def lease_from(data: dict[str, Any]) -> Lease:
    return instance(Lease, shapes.LEASE, data)[0]


def snapshot_from(data: dict[str, Any]) -> ContextSnapshot:
    return instance(ContextSnapshot, shapes.SNAPSHOT, data)[0]


def event_from(data: dict[str, Any]) -> Event:
    return instance(Event, shapes.EVENT, data)[0]


def blocker_from(data: dict[str, Any]) -> Blocker:
    return Blocker(**shapes.BLOCKER.load(data))


def claim_from(data: dict[str, Any]) -> RemoteClaim:
    return RemoteClaim(
        run=run_from(data["run"]),
        task=task_from(data["task"]),
        attempt=attempt_from(data["attempt"]),
        lease=lease_from(data["lease"]),
        context=data.get("context"),
    )


# -- arguments to their wire form ----------------------------------------------------------------
def refuse_now(now: datetime | None) -> None:
    if now is not None:
        raise exceptions.ValidationError(
            "now cannot be honoured by a remote orchestrator: the server's clock decides. "
            "Leave it None.",
            field="now",
        )


def run_path(run_id: Any, *rest: str) -> str:
    """``runs/<run_id>/…``: the id checked here, as the local services check it (a malformed
    id is a ValidationError, not an unknown URL)."""
    return "/".join(("runs", str(v.require_id(run_id, "run_id")), *rest))


def task_path(task_id: Any, *rest: str) -> str:
    """``tasks/<task_id>/…``, checked as :func:`run_path` checks its id."""
    return "/".join(("tasks", str(v.require_id(task_id, "task_id")), *rest))


def id_text(value: Any) -> Any:
    """An id in a body or a query: a UUID as text; anything else as given, for the server to
    accept or refuse as the services would."""
    return str(value) if isinstance(value, UUID) else value


def when(value: Any, name: str) -> str | None:
    """A datetime argument (the contract's rule: aware, in range) as RFC 3339."""
    checked = v.optional_datetime(value, name)
    return None if checked is None else checked.isoformat()


def as_list(values: Any) -> Any:
    """Iterables (tuples, generators) as JSON lists; anything else as given."""
    return list(values) if v.is_list_like(values) else values


def _dependency(entry: Any) -> Any:
    if isinstance(entry, Mapping):
        return {key: id_text(value) if key == "task_id" else value for key, value in entry.items()}
    return id_text(entry)


def task_body(item: Any) -> Any:
    """One task's ``enqueue_task`` arguments as the API's TaskIn. Unknown keys, and items that
    are not dicts, go through unchanged: the server refuses them, as the services do."""
    if not isinstance(item, Mapping):
        return item
    body = dict(item)
    if "depends_on" in body:
        depends_on = as_list(body.pop("depends_on"))
        if depends_on is not None:  # None is "no dependencies" locally; the API wants a list
            body["depends_on"] = (
                [_dependency(entry) for entry in depends_on]
                if isinstance(depends_on, list)
                else depends_on
            )
    if "not_before" in body:
        body["not_before"] = when(body["not_before"], "not_before")
    for name in ("id", "context_snapshot_id"):
        if name in body:
            body[name] = id_text(body[name])
    if isinstance(body.get("retry"), Mapping):
        body["retry"] = dict(body["retry"])
    return body


def id_list(values: Any) -> Any:
    """A list of ids (``blocked_by``) in its wire form."""
    items = as_list(values)
    return [id_text(item) for item in items] if isinstance(items, list) else items

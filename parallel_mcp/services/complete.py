"""Completing leased tasks: ``complete_task`` and ``complete_tasks`` (a batch in one
transaction), one implementation; its phases are in docs/internals.md ("Completing tasks")."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any
from uuid import UUID

from ..actors import current_principal
from ..contract import arguments as a
from ..contract import validation as v
from ..exceptions import ParallelMcpError, ValidationError
from ..models import Task
from ..states import AttemptStatus, TaskStatus
from . import client_tokens
from .context import add_snapshot
from .dag import release_dependents
from .dialect import columns, instances, json_param
from .guard import explain_lease, lease_fence, sources
from .leases import CLEAR_LEASE, close_attempts, lease_args, merge_metadata
from .outcomes import recount_waiters
from .write import RunLocks, Write, write

OUTCOME = "completed"


@dataclass(frozen=True)
class Completion:
    task_id: UUID
    lease_id: UUID
    output: Any = None
    metadata: Any = None
    next_context: Any = None
    next_context_label: str | None = None
    client_token: str | None = None


# An item's keys: a Completion's fields, and the batch's worker_id when an item names it.
ITEM_KEYS = {field.name for field in fields(Completion)} | {"worker_id"}
# What ``_finish`` reads of a completed task: all that a caller that needs no task back (the
# worker's cycle) has the guard return (bench/FINDINGS.md, "CPU per task with 8 slots").
FINISHED = ("id", "run_id", "kind", "attempt_count", "metadata", "blocks_others")


def completion(item: Mapping[str, Any], worker_id: str) -> Completion:
    """One validated item (the keyword arguments of ``complete_task``)."""
    unknown = set(item) - ITEM_KEYS
    if unknown:
        raise ValidationError(f"unknown argument(s): {', '.join(sorted(map(str, unknown)))}.")
    task_id, lease_id, _ = lease_args(
        item.get("task_id"), item.get("lease_id"), item.get("worker_id", worker_id)
    )
    if item.get("worker_id", worker_id) != worker_id:
        raise ValidationError(
            f"worker_id {item['worker_id']!r} is not the batch's {worker_id!r}.", field="worker_id"
        )
    return Completion(
        task_id=task_id,
        lease_id=lease_id,
        output=v.json_value(item.get("output"), "output"),
        metadata=v.json_value(item.get("metadata"), "metadata"),
        next_context=v.json_value(item.get("next_context"), "next_context"),
        next_context_label=v.text(
            item.get("next_context_label"), "next_context_label", allow_none=True
        ),
        client_token=v.text(item.get("client_token"), "client_token", allow_none=True),
    )


def complete_task(
    *,
    using: str,
    task_id: Any,
    lease_id: Any,
    worker_id: Any,
    output: Any = None,
    metadata: Any = None,
    next_context: Any = None,
    next_context_label: str | None = None,
    client_token: str | None = None,
    now: datetime | None = None,
) -> Task:
    now = v.resolve_now(now)
    worker = a.NAME.check(worker_id, "worker_id")
    item = completion(
        {
            "task_id": task_id,
            "lease_id": lease_id,
            "output": output,
            "metadata": metadata,
            "next_context": next_context,
            "next_context_label": next_context_label,
            "client_token": client_token,
        },
        worker,
    )
    result = _complete(using, worker, [item], now)[0]
    if isinstance(result, ParallelMcpError):
        raise result
    return result


def complete_tasks(
    *, using: str, worker_id: Any, items: Sequence[Mapping[str, Any]], now: datetime | None = None
) -> list[Task | ParallelMcpError]:
    """Complete several tasks leased by ``worker_id`` in one transaction. Returns, per item
    and in order, the completed task or the error ``complete_task`` would have raised for it:
    one refused item never holds back the others."""
    now = v.resolve_now(now)
    worker = a.NAME.check(worker_id, "worker_id")
    parsed = completions(items, worker)
    prepared = [item for item in parsed if isinstance(item, Completion)]
    return in_order(parsed, _complete(using, worker, prepared, now) if prepared else [])


def completions(
    items: Sequence[Mapping[str, Any]], worker: str
) -> list[Completion | ParallelMcpError]:
    """Each item validated, or its error (with its ``position``)."""
    results: list[Completion | ParallelMcpError] = []
    seen: set[UUID] = set()
    for position, item in enumerate(items):
        try:
            if not isinstance(item, Mapping):
                raise ValidationError("each item must be a dict of complete_task arguments.")
            parsed = completion(item, worker)
            if parsed.task_id in seen:
                raise ValidationError(f"task {parsed.task_id} appears twice in the batch.")
        except ParallelMcpError as exc:
            exc.details.setdefault("position", position)
            results.append(exc)
            continue
        seen.add(parsed.task_id)
        results.append(parsed)
    return results


def in_order(
    parsed: list[Completion | ParallelMcpError], written: Sequence[Task | ParallelMcpError]
) -> list[Task | ParallelMcpError]:
    """The written results of the valid items, in their places among the refused ones."""
    done = iter(written)
    return [next(done) if isinstance(item, Completion) else item for item in parsed]


def _complete(
    using: str, worker: str, items: list[Completion], now: datetime
) -> list[Task | ParallelMcpError]:
    with write(using=using, now=now) as w:
        with w.db.batch():
            sent = send_completions(w, worker, items)
        return settle_completions(w, worker, items, sent)


@dataclass(frozen=True)
class SentCompletions:
    runs: Any
    recorded: set[str]  # the tokens this write recorded, when their insert went on its own
    updated: Any  # the guard's rows (+ the token each recorded, when the insert is its CTE)
    principal: str | None
    only: tuple[str, ...] | None  # the task's fields the guard returns (None: all)


def send_completions(
    w: Write, worker: str, items: list[Completion], *, read_back: bool = True
) -> SentCompletions:
    """Queue phase 1 (in the caller's batch, before any other statement of the write: runs
    are locked before tasks). Without ``read_back`` the completed tasks come back with the
    ``FINISHED`` fields only (the others deferred)."""
    principal, only = current_principal(), None if read_back else FINISHED
    runs = w.send_lock_runs(
        of_tasks=[item.task_id for item in items],
        counters_only=True,
        moves_context=any(item.next_context is not None for item in items),
    )
    if w.d.chains:
        # The tokens' insert is a CTE of the guard's statement (see _send_guard).
        updated = _send_guard(w, runs, items, worker, principal, None, only)
        return SentCompletions(runs, set(), updated, principal, only)
    # Statements run one by one here (SQLite): what the insert recorded is known at once.
    pairs = [(item.client_token, item.task_id) for item in items if item.client_token]
    recorded = client_tokens.recorded(client_tokens.send_record(w, pairs, OUTCOME, principal))
    updated = _send_guard(w, runs, items, worker, principal, recorded, only)
    return SentCompletions(runs, recorded, updated, principal, only)


def settle_completions(
    w: Write, worker: str, items: list[Completion], sent: SentCompletions
) -> list[Task | ParallelMcpError]:
    """Per item, the completed task or why not (phase 2 is recorded on the write)."""
    w.adopt_runs(sent.runs)
    rows = sent.updated.fetchall()
    if w.d.chains and any(item.client_token for item in items):
        # (the task's columns if it was completed, the token recorded for it if any)
        recorded = {row[-1] for row in rows if row[-1] is not None}
        rows = [row[:-1] for row in rows if row[0] is not None]
    else:
        recorded = sent.recorded
    done = {task.pk: task for task in instances(Task, w.using, rows, sent.only)}
    results = [
        done[item.task_id] if item.task_id in done else _refused(w, item, worker, sent, recorded)
        for item in items
    ]
    applied = [(item, done[item.task_id]) for item in items if item.task_id in done]
    if applied:
        w.lock_late_runs()
        _finish(w, worker, applied)
    return results


def _send_guard(
    w: Write,
    runs: RunLocks,
    items: list[Completion],
    worker: str,
    principal: str | None,
    recorded: set[str] | None,
    only: tuple[str, ...] | None,
) -> Any:
    """``leased/running -> completed`` for every item, each fenced by its lease, a tokened
    item only if this write recorded its token (``recorded``: those tokens; None: the insert
    is a CTE of this statement; see docs/internals.md)."""
    d = w.d
    held = w.held(runs)
    output_sql, output_params = d.by_id(
        [item.task_id for item in items], [json_param(item.output) for item in items], d.json_cast
    )
    pairs, pair_params = d.uuid_pairs(
        "id", "lease_id", [(item.task_id, item.lease_id) for item in items]
    )
    fence, fence_params = lease_fence(
        d,
        statuses=sources(TaskStatus.COMPLETED),
        worker_id=worker,
        now=w.now,
        principal=principal,
    )
    tokened = [item for item in items if item.client_token is not None]
    token_sql, token_params, recorded_sql = "", [], ""
    recorded_params: list[Any] = []
    if tokened:
        # A tokened item goes through only if this write recorded its token.
        if recorded is not None:
            mine_sql, mine = d.uuids(
                [item.task_id for item in tokened if item.client_token in recorded]
            )
        else:
            recorded_sql, recorded_params = client_tokens.record_sql(
                w,
                [(item.client_token, item.task_id) for item in tokened if item.client_token],
                OUTCOME,
                principal,
                returning="token, task_id",
                held=held,
            )
            mine_sql, mine = "IN (SELECT task_id FROM recorded)", []
        ids_sql, ids = d.uuids([item.task_id for item in tokened])
        token_sql = f" AND (NOT (id {ids_sql}) OR id {mine_sql})"
        token_params = [*ids, *mine]
    when = d.when(w.now)
    update = (
        f"UPDATE pmcp_task SET status = 'completed', output = {output_sql}, error = NULL, "
        f"progress = 1.0, completed_at = %s, {CLEAR_LEASE}, updated_at = %s "
        f"WHERE {held}{pairs} AND {fence}{token_sql} RETURNING {columns(Task, only=only)}"
    )
    params = [*output_params, when, when, *pair_params, *fence_params, *token_params]
    if not recorded_sql:
        return w.send_guard(runs, [("u", update)], params, "SELECT * FROM u")
    return w.send_guard(
        runs,
        [("recorded", recorded_sql), ("u", update)],
        [*recorded_params, *params],
        "SELECT u.*, recorded.token FROM u FULL JOIN recorded ON recorded.task_id = u.id",
    )


def _refused(
    w: Write, item: Completion, worker: str, sent: SentCompletions, recorded: set[str]
) -> ParallelMcpError | Task:
    """An item the transition did not apply: a replay of its client token, or why not."""
    if item.client_token is not None:
        if item.client_token in recorded:
            client_tokens.take_back(w, item.client_token)
        else:
            replayed = client_tokens.replay(
                w.using, item.client_token, item.task_id, OUTCOME, sent.principal
            )
            if replayed is not None:
                return replayed
    return explain_lease(w.using, item.task_id, item.lease_id, worker, w.now)


def _finish(w: Write, worker: str, applied: list[tuple[Completion, Task]]) -> None:
    """Everything the completed tasks change besides themselves."""
    d = w.d
    merged = []
    for item, task in applied:
        if item.metadata is not None:
            task.metadata = merge_metadata(task.metadata, item.metadata)
            merged.append(task)
        if item.next_context is not None:
            # The original records the new context before the completion.
            add_snapshot(
                w,
                w.locked_runs[task.run_id],
                payload=item.next_context,
                scope="run",
                label=item.next_context_label or f"{task.kind}.completed",
                task_id=task.pk,
            )
        w.event(
            "task.completed",
            run_id=task.run_id,
            task_id=task.pk,
            attempt_id=item.lease_id,
            payload={"worker_id": worker, "attempt": task.attempt_count},
        )
    if merged:
        ids = [task.pk for task in merged]
        value_sql, value_params = d.by_id(
            ids, [json_param(task.metadata) for task in merged], d.json_cast
        )
        in_sql, in_params = d.uuids(ids)
        w.defer(
            f"UPDATE pmcp_task SET metadata = {value_sql} WHERE id {in_sql}",
            [*value_params, *in_params],
        )
    close_attempts(
        w,
        [item.lease_id for item, _ in applied],
        status=AttemptStatus.COMPLETED,
        outputs=[item.output for item, _ in applied],
        metadata=[item.metadata for item, _ in applied],
    )
    for run_id, count in Counter(task.run_id for _, task in applied).items():
        w.move(run_id, "active", "completed", count)
    release_dependents(w, [task.pk for _, task in applied])
    for _, task in applied:
        if task.blocks_others:
            recount_waiters(w, task.run_id, task.pk, release=True)

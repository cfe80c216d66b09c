"""Adding tasks to a run, one (``enqueue_task``) or a whole graph (``enqueue_tasks``), by one
batch path, all or nothing (docs/internals.md, "Enqueue")."""

from __future__ import annotations

import gc
import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from ..contract import arguments as a
from ..contract import limits, protocol
from ..contract import validation as v
from ..exceptions import (
    DependencyCycleError,
    DuplicateIdError,
    DuplicateTaskKeyError,
    InvalidDependencyError,
    ParallelMcpError,
    RecordNotFoundError,
    RunTerminalError,
    ValidationError,
)
from ..ids import new_id, parse_id
from ..models import ContextSnapshot, Run, Task, TaskDependency
from ..states import TERMINAL_RUN_STATUSES, TaskStatus
from .dag import State, edge_counts, is_stuck, states_in_run
from .dialect import Dialect, columns, dialect_for, json_param, saved_instance, typed_columns
from .write import Write, write

# retry's keys and the kinds of their values (each may be None), as every door checks them.
RETRY_ARGUMENTS = {
    "delay_ms": a.RETRY_DELAY_MS,
    "backoff": a.BACKOFF,
    "max_delay_ms": a.RETRY_DELAY_MS,
}
# The arguments of one task: enqueue_task's, but for its run and the time.
TASK_FIELDS = set(protocol.signature("enqueue_task").parameters) - {"self", "run_id", "now"}


def parse_retry(retry: Any) -> tuple[int | None, str | None, int | None]:
    if retry is None:
        return None, None, None
    if not isinstance(retry, dict):
        raise ValidationError(
            "retry must be a dict with delay_ms, backoff, max_delay_ms.", field="retry"
        )
    unknown = set(retry) - set(RETRY_ARGUMENTS)
    if unknown:
        raise ValidationError(
            f"retry has unknown keys: {', '.join(sorted(map(str, unknown)))}; "
            f"allowed: {', '.join(sorted(RETRY_ARGUMENTS))}.",
            field="retry",
        )
    delay, backoff, max_delay = (
        _optional(kind, retry, key, f"retry.{key}") for key, kind in RETRY_ARGUMENTS.items()
    )
    return delay, backoff, max_delay


def _optional(kind: a.Kind, values: dict[str, Any], key: str, name: str | None = None) -> Any:
    """``values[key]`` checked as ``kind``, or None when it is None or absent."""
    value = values.get(key)
    return None if value is None else kind.check(value, name or key)


def task_id_entries(value: Any, field: str) -> Iterator[Any]:
    """The entries of a list of task ids (``depends_on``, ``blocked_by``): a list
    (``is_list_like``), at most ``MAX_DEPENDENCIES`` long."""
    if not v.is_list_like(value):
        raise ValidationError(f"{field} must be a list of task ids.", field=field)
    for index, entry in enumerate(value):
        if index == limits.MAX_DEPENDENCIES:  # the same limit for both (docs/errors.md)
            raise ValidationError(
                f"{field} has more than {limits.MAX_DEPENDENCIES} entries.", field=field
            )
        yield entry


def parse_depends_on(depends_on: Any, *, batch_keys: set[str]) -> list[tuple[Any, bool]]:
    """``depends_on`` as (task id or batch key, required) pairs; duplicates are an error."""
    if depends_on is None:
        return []
    parsed: list[tuple[Any, bool]] = []
    seen: set[Any] = set()
    for entry in task_id_entries(depends_on, "depends_on"):
        required = True
        raw = entry
        if isinstance(entry, dict):
            unknown = set(entry) - {"task_id", "required"}
            if unknown or "task_id" not in entry:
                raise ValidationError(
                    'depends_on entries are task ids or {"task_id": …, "required": bool}.',
                    field="depends_on",
                )
            raw = entry["task_id"]
            required = entry.get("required", True)
            if not isinstance(required, bool):
                raise ValidationError(
                    "depends_on[].required must be true or false.", field="depends_on"
                )
        target: Any
        if isinstance(raw, str) and raw in batch_keys:
            target = raw
        else:
            target = parse_id(raw)
            if target is None:
                raise InvalidDependencyError(
                    f"depends_on entry {raw!r} is neither a task id nor a key of this batch.",
                    dependency=raw,
                )
        if target in seen:
            raise InvalidDependencyError(
                f"{target} is listed twice in depends_on.", dependency=target
            )
        seen.add(target)
        parsed.append((target, required))
    return parsed


def task_spec(item: Any, *, position: int | None = None) -> dict[str, Any]:
    """Validated fields of one task: the ``Task`` fields of the same names, and ``depends_on``
    (``position`` names the batch item in messages)."""
    try:
        if not isinstance(item, dict):
            raise ValidationError("must be a dict of enqueue_task arguments.")
        unknown = set(item) - TASK_FIELDS
        if unknown:
            raise ValidationError(f"unknown argument(s): {', '.join(sorted(map(str, unknown)))}.")
        delay, backoff, max_delay = parse_retry(item.get("retry"))
        return {
            "id": v.optional_id(item.get("id"), "id"),
            "kind": v.text(item.get("kind"), "kind"),
            "key": v.text(item.get("key"), "key", allow_none=True),
            "priority": a.PRIORITY.check(item.get("priority", 0), "priority"),
            "max_attempts": _optional(a.MAX_ATTEMPTS, item, "max_attempts"),
            "retry_delay_ms": delay,
            "retry_backoff": backoff,
            "retry_max_delay_ms": max_delay,
            "timeout_ms": _optional(a.DURATION_MS, item, "timeout_ms"),
            "input": v.json_value(item.get("input"), "input"),
            "metadata": v.json_value(item.get("metadata"), "metadata"),
            "not_before": v.optional_datetime(item.get("not_before"), "not_before"),
            "context_snapshot_id": v.optional_id(
                item.get("context_snapshot_id"), "context_snapshot_id"
            ),
            "depends_on": item.get("depends_on", ()),
        }
    except ValidationError as exc:
        if position is not None:
            _locate(exc, position)
        raise


def _locate(exc: ValidationError, position: int) -> None:
    """Name the batch item an error is about."""
    exc.message = f"tasks[{position}]: {exc.message}"
    exc.args = (exc.message,)
    exc.details["position"] = position


def enqueue_task(*, using: str, run_id: Any, now: datetime | None = None, **fields: Any) -> Task:
    now = v.resolve_now(now)
    run_uuid = v.require_id(run_id, "run_id")
    spec = task_spec(fields)
    spec["depends_on"] = parse_depends_on(spec["depends_on"], batch_keys=set())
    with write(using=using, now=now) as w:
        run = w.lock_run(run_uuid)
        return insert_tasks(w, run, prepare_batch([spec], using=using, run_id=run_uuid, now=now))[0]


def enqueue_tasks(
    *, using: str, run_id: Any, tasks: Any, now: datetime | None = None
) -> list[Task]:
    now = v.resolve_now(now)
    run_uuid = v.require_id(run_id, "run_id")
    if not v.is_list_like(tasks):
        raise ValidationError("tasks must be a list of enqueue_task argument dicts.", field="tasks")
    items = list(tasks)
    if not items:
        if not Run.objects.using(using).filter(pk=run_uuid).exists():
            raise RecordNotFoundError(f"Run {run_uuid} does not exist.", run_id=run_uuid)
        return []
    if len(items) > limits.MAX_BATCH:
        raise ValidationError(
            f"tasks has {len(items)} items; at most {limits.MAX_BATCH} per batch.", field="tasks"
        )
    # The cyclic garbage collector off while the batch is built and written (it would free
    # nothing; docs/internals.md), back on after only if it was on: the switch is process-wide.
    enabled = gc.isenabled()
    gc.disable()
    try:
        return _enqueue_batch(using, run_uuid, items, now)
    finally:
        if enabled:
            gc.enable()


def _enqueue_batch(using: str, run_uuid: UUID, items: list[Any], now: datetime) -> list[Task]:
    specs = [task_spec(item, position=index) for index, item in enumerate(items)]
    keys = [spec["key"] for spec in specs if spec["key"] is not None]
    batch_keys = set(keys)
    duplicated = sorted(key for key, n in Counter(keys).items() if n > 1)
    if duplicated:
        raise DuplicateTaskKeyError(
            f"Key(s) {', '.join(map(repr, duplicated))} appear more than once in the batch.",
            keys=duplicated,
        )
    for index, spec in enumerate(specs):
        try:
            spec["depends_on"] = parse_depends_on(spec["depends_on"], batch_keys=batch_keys)
        except InvalidDependencyError as exc:
            exc.details["position"] = index
            raise
        except ValidationError as exc:
            _locate(exc, index)
            raise
        own = {spec["key"], spec["id"]} - {None}
        if any(target in own for target, _ in spec["depends_on"]):
            raise DependencyCycleError(
                f"Task {_name(spec)} depends on itself.", cycle=[_name(spec), _name(spec)]
            )
    batch = prepare_batch(specs, using=using, run_id=run_uuid, now=now)  # before the write lock
    with write(using=using, now=now) as w:
        return insert_tasks(w, w.lock_run(run_uuid), batch)


def _name(spec: dict[str, Any]) -> str:
    return str(spec["key"] if spec["key"] is not None else spec["id"])


def _dependency_order(specs: list[dict[str, Any]], refs: dict[Any, int]) -> list[int]:
    """Indexes of ``specs`` with every batch dependency before its dependents; a cycle raises
    DependencyCycleError naming it (by key, or id)."""
    upstream = [
        [refs[target] for target, _ in spec["depends_on"] if target in refs] for spec in specs
    ]
    state = [0] * len(specs)  # 0 new, 1 on the current path, 2 done
    order: list[int] = []
    for start in range(len(specs)):
        if state[start]:
            continue
        path: list[int] = []
        stack: list[tuple[int, int]] = [(start, 0)]
        while stack:
            node, next_child = stack.pop()
            if next_child == 0:
                state[node] = 1
                path.append(node)
            children = upstream[node]
            if next_child < len(children):
                stack.append((node, next_child + 1))
                child = children[next_child]
                if state[child] == 1:
                    cycle = [*path[path.index(child) :], child]
                    names = [_name(specs[i]) for i in cycle]
                    raise DependencyCycleError(
                        "Dependency cycle: " + " -> ".join(names) + " (each waits for the next).",
                        cycle=names,
                    )
                if state[child] == 0:
                    stack.append((child, 0))
            else:
                state[node] = 2
                path.pop()
                order.append(node)
    return order


# What a new task holds besides its spec (every column not written from the spec).
NEW_TASK: dict[str, Any] = {
    field.attname: None if field.null else field.get_default()
    for field in Task._meta.concrete_fields
}
NEW_TASK["status"] = str(TaskStatus.QUEUED)
# Each task column: (attname, column, its PostgreSQL type).
TASK_COLUMNS: tuple[tuple[str, str, str], ...] = tuple(
    (field.attname, column, kind)
    for field, (column, kind) in zip(Task._meta.concrete_fields, typed_columns(Task), strict=True)
)
COLUMN_KINDS = {attname: kind for attname, _, kind in TASK_COLUMNS}


# The columns that depend on the run's state: insert_tasks sets them under the run's lock.
RUN_STATE_COLUMNS = (
    "context_snapshot_id",
    "claimable",
    "unmet_dependencies",
    "failed_dependencies",
)

Column = tuple[bool, Any]  # (the same for every task, that value | the values in task order)


def column_values(d: Dialect, tasks: list[Task], attnames: Iterable[str]) -> dict[str, Column]:
    """Per column, the tasks' values adapted for the database, or the one value they share
    (most columns: defaults, the run, the time, often the kind)."""
    result = {}
    for attname in attnames:
        kind = COLUMN_KINDS[attname]
        values = [task.__dict__[attname] for task in tasks]
        first = values[0]
        if len(tasks) == 1 or values.count(first) == len(values):
            result[attname] = (
                True,
                json_param(first) if kind == "jsonb" else d.adapt(kind, first),
            )
        elif kind == "jsonb":
            result[attname] = (False, values)  # Dialect.rows encodes them
        else:
            result[attname] = (False, [d.adapt(kind, value) for value in values])
    return result


def _insert_tasks(
    w: Write, run_id: UUID, tasks: list[Task], values: dict[str, Column], *, guarded: bool
) -> None:
    """One INSERT of ``tasks`` whose text does not depend on their number (docs/internals.md).
    ``guarded`` (ids or keys given by the caller): a row that clashes with a task is skipped,
    then ``_clash`` says which, and the write rolls back."""
    d = w.d
    selected: list[str] = []
    constants: list[Any] = []
    varying: list[tuple[str, str]] = []
    values_by_column: list[list[Any]] = []
    for attname, column, kind in TASK_COLUMNS:
        shared, value = values[attname]
        if shared:
            if kind == "jsonb":
                selected.append(d.json_cast)
            else:
                selected.append("%s" if d.vendor == "sqlite" else f"%s::{kind}")
            constants.append(value)
        elif d.vendor == "sqlite":
            selected.append(f"json_extract(v.value, '$[{len(varying)}]')")
            varying.append((column, kind))
            # A JSON column's value travels as its text, stored as it is.
            values_by_column.append([json_param(v) for v in value] if kind == "jsonb" else value)
        else:
            selected.append(f"v.{column}")
            varying.append((column, kind))
            values_by_column.append(value)
    # WHERE: SQLite would read an ON CONFLICT right after the FROM as a join's ON.
    sql = f"INSERT INTO pmcp_task ({columns(Task)}) SELECT {', '.join(selected)}"
    params = constants
    if varying:
        rows = list(zip(*values_by_column, strict=True))
        if d.vendor == "sqlite":
            sql += " FROM json_each(%s) AS v"
            params = [*constants, json.dumps(rows)]
        else:
            names = ", ".join(column for column, _ in varying)
            source, row_params = d.rows(varying, rows)
            sql = f"WITH v({names}) AS ({source}) {sql} FROM v"
            params = [*row_params, *constants]
    sql += " WHERE 1 = 1"
    if not guarded:
        w.defer(sql, params)
        return
    inserted = w.db.send(f"{sql} ON CONFLICT DO NOTHING RETURNING id", params).fetchall()
    if len(inserted) < len(tasks):
        written = {value if isinstance(value, UUID) else UUID(value) for (value,) in inserted}
        raise _clash(w.using, run_id, [task for task in tasks if task.pk not in written])


def _clash(using: str, run_id: UUID, skipped: list[Task]) -> ParallelMcpError:
    """Why rows of a guarded insert were skipped: an id taken, else a key of the run."""
    taken = (
        Task.objects.using(using)
        .filter(pk__in=[task.pk for task in skipped])
        .order_by("id")
        .values_list("id", flat=True)
        .first()
    )
    if taken is not None:
        return DuplicateIdError(f"A task with id {taken} already exists.", task_id=taken)
    key = (
        Task.objects.using(using)
        .filter(run_id=run_id, key__in=[task.key for task in skipped if task.key is not None])
        .order_by("key")
        .values_list("key", flat=True)
        .first()
    )
    assert key is not None, "a row skipped by ON CONFLICT clashes on its id or its key"
    return DuplicateTaskKeyError(
        f"Run {run_id} already has a task with key {key!r}.", run_id=run_id, key=key
    )


# A dependency edge's columns (see Dialect.rows), inserted with the write's flush.
EDGE_COLUMNS = typed_columns(TaskDependency, ("run_id", "task_id", "depends_on_id", "required"))


# A dependency outside the batch whose state is not read yet: counted as one not yet run.
UNREAD: State = (TaskStatus.QUEUED, 0)


@dataclass
class Batch:
    """Validated specs made into their tasks before the write, but for what depends on the
    run's state, which ``insert_tasks`` sets under the run's lock (docs/internals.md)."""

    tasks: list[Task]  # in batch order
    ordered: list[Task]  # dependencies first
    upstream: list[list[tuple[Task | UUID, bool]]]  # per ordered task: (dependency, required)
    edges: list[tuple[Any, Any, Any, bool]]  # EDGE_COLUMNS' rows, adapted
    no_context: list[Task]  # the tasks whose spec names no context snapshot
    external_ids: set[UUID]
    snapshot_ids: set[UUID]
    guarded: bool  # ids or keys given by the caller
    values: dict[str, Column]  # column_values of the ordered tasks
    payloads: list[dict[str, Any]]  # of their task.enqueued events


def prepare_batch(specs: list[dict[str, Any]], *, using: str, run_id: UUID, now: datetime) -> Batch:
    """Build the tasks of validated ``specs`` (dependencies parsed); raises what the batch
    itself gets wrong (a cycle, an id given twice)."""
    # How a batch member can be named in ``depends_on``: its key or its explicit id.
    refs = {
        name: index
        for index, spec in enumerate(specs)
        for name in (spec["key"], spec["id"])
        if name is not None
    }
    order = _dependency_order(specs, refs)
    explicit_ids = [spec["id"] for spec in specs if spec["id"] is not None]
    if len(set(explicit_ids)) != len(explicit_ids):
        raise ValidationError("The batch gives the same task id twice.", field="id")
    # Ids in batch order: among equal priorities, claims follow the order given.
    ids = [spec["id"] or new_id() for spec in specs]
    tasks: list[Task | None] = [None] * len(specs)
    ordered: list[Task] = []
    upstream: list[list[tuple[Task | UUID, bool]]] = []
    edges: list[tuple[Any, Any, Any, bool]] = []
    external_ids: set[UUID] = set()
    d = dialect_for(using)
    run, uuid = d.uuid(run_id), d.uuid
    common = {**NEW_TASK, "run_id": run_id, "created_at": now, "updated_at": now}
    for index in order:
        spec = specs[index]
        dependencies: list[tuple[Task | UUID, bool]] = []
        depends_on: list[UUID] = []
        for target, required in spec["depends_on"]:
            if target in refs:
                dependency = tasks[refs[target]]
                assert dependency is not None  # built earlier: dependency order
                dependencies.append((dependency, required))
                depends_on.append(dependency.pk)
            else:
                external_ids.add(target)
                dependencies.append((target, required))
                depends_on.append(target)
            edges.append((run, uuid(ids[index]), uuid(depends_on[-1]), required))
        values = {**common, **spec, "id": ids[index]}
        del values["depends_on"]  # the spec's other fields are the task's
        task = saved_instance(Task, using, values)
        task._depends_on_cache = depends_on
        tasks[index] = task
        ordered.append(task)
        upstream.append(dependencies)
    # A column no spec field sets holds the value of ``common`` in every task: read from the
    # first (those of RUN_STATE_COLUMNS are insert_tasks').
    fields = set(specs[0]) - {"depends_on"}
    steady = [name for name in COLUMN_KINDS if name not in fields and name not in RUN_STATE_COLUMNS]
    batch = Batch(
        tasks=[task for task in tasks if task is not None],
        ordered=ordered,
        upstream=upstream,
        edges=edges,
        no_context=[task for task in ordered if task.context_snapshot_id is None],
        external_ids=external_ids,
        snapshot_ids={spec["context_snapshot_id"] for spec in specs} - {None},
        guarded=bool(refs),  # the tasks' keys and explicit ids
        values={
            **column_values(d, ordered[:1], steady),
            **column_values(d, ordered, [name for name in COLUMN_KINDS if name in fields]),
        },
        payloads=[
            {
                "kind": task.kind,
                "key": task.key,
                "priority": task.priority,
                "depends_on": [str(dep) for dep in task._depends_on_cache],
                "not_before": task.not_before.isoformat() if task.not_before else None,
            }
            for task in ordered
        ],
    )
    _count_dependencies(batch, {})
    return batch


def _count_dependencies(batch: Batch, external: Mapping[UUID, State]) -> None:
    """Each task's unmet and failed dependency counts, dependencies first (a dependency
    outside the batch in its state in ``external``, else as one not yet run)."""
    for task, dependencies in zip(batch.ordered, batch.upstream, strict=True):
        unmet = failed = 0
        for dependency, required in dependencies:
            if isinstance(dependency, Task):
                state = (dependency.status, dependency.failed_dependencies)
            else:
                state = external.get(dependency, UNREAD)
            edge_unmet, edge_failed = edge_counts(state, required=required)
            unmet += edge_unmet
            failed += edge_failed
        task.unmet_dependencies = unmet
        task.failed_dependencies = failed


def insert_tasks(w: Write, run: Run, batch: Batch) -> list[Task]:
    """Insert a prepared batch into the locked ``run``."""
    using = w.using
    if run.status in TERMINAL_RUN_STATUSES:
        raise RunTerminalError(
            f"Run {run.pk} is {run.status}; no task can be added to it.",
            run_id=run.pk,
            status=run.status,
        )
    if batch.snapshot_ids:
        known = set(
            ContextSnapshot.objects.using(using)
            .filter(pk__in=batch.snapshot_ids, run_id=run.pk)
            .values_list("id", flat=True)
        )
        missing = sorted(map(str, batch.snapshot_ids - known))
        if missing:
            raise ValidationError(
                f"Context snapshot {missing[0]} does not exist in run {run.pk}.",
                field="context_snapshot_id",
            )
    if batch.external_ids:
        external = sorted(batch.external_ids, key=str)
        _count_dependencies(batch, states_in_run(using, run.pk, external, noun="Dependency"))
    if run.current_context_snapshot_id is not None:
        for task in batch.no_context:
            task.context_snapshot_id = run.current_context_snapshot_id
    if run.max_parallel is not None:
        for task in batch.ordered:
            task.claimable = False  # until the run's slot hand-out gives it a slot
    ordered = batch.ordered
    values = {**batch.values, **column_values(w.d, ordered, RUN_STATE_COLUMNS)}
    _insert_tasks(w, run.pk, ordered, values, guarded=batch.guarded)
    w.insert("pmcp_task_dependency", EDGE_COLUMNS, *batch.edges)
    stuck = sum(1 for task in ordered if is_stuck(task.status, task.failed_dependencies))
    w.count(run.pk, total=len(ordered), active=len(ordered) - stuck, stuck=stuck)
    if any(task.unmet_dependencies == 0 and not task.failed_dependencies for task in ordered):
        w.ready(run.pk)
    for task, payload in zip(ordered, batch.payloads, strict=True):
        w.event("task.enqueued", run_id=run.pk, task_id=task.pk, payload=payload)
    return batch.tasks

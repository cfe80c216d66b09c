"""Reads. Nothing here writes; every list is bounded and ordered by an index."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, TypeVar

from django.db import connections, transaction
from django.db.models import BooleanField, Exists, ExpressionWrapper, OuterRef, Q, QuerySet

from .conf import app_settings
from .contract import validation as v
from .contract.limits import MAX_EVENT_ID
from .exceptions import RecordNotFoundError, ValidationError
from .ids import parse_id
from .models import (
    Attempt,
    ContextSnapshot,
    Event,
    InputRequest,
    Run,
    Task,
    TaskBlocker,
    TaskDependency,
    ToolCall,
    WorkerProcess,
    WorkerProcessKind,
)
from .models.tasks import CLAIM_ORDER, DEAD_LETTERED, lease_lapsed
from .models.tool_calls import expired_calls, outstanding_input
from .results import Blocker, EventPage
from .services.dag import edge_counts
from .services.write import EVENT_FENCE_LOCK_KEY
from .states import (
    LEASED_TASK_STATUSES,
    PAUSED_TASK_STATUSES,
    TERMINAL_TASK_STATUSES,
    RunStatus,
    TaskStatus,
)

T = TypeVar("T")

RUN_ORDER_FIELDS = ("created_at", "updated_at")


def in_flight(using: str, run_id: Any) -> int:
    """How many of a run's tasks are leased or running (at most its max_parallel, read through
    pmcp_task_run_status_idx)."""
    return (
        Task.objects.using(using)
        .filter(run_id=run_id, status__in=[TaskStatus.LEASED, TaskStatus.RUNNING])
        .count()
    )


def get_run(*, using: str, run_id: Any) -> Run | None:
    parsed = parse_id(run_id)
    if parsed is None:
        return None
    return Run.objects.using(using).filter(pk=parsed).first()


def get_task(*, using: str, task_id: Any) -> Task | None:
    parsed = parse_id(task_id)
    if parsed is None:
        return None
    return Task.objects.using(using).filter(pk=parsed).first()


def require_run(*, using: str, run_id: Any) -> Any:
    """``run_id`` as a UUID, or ``RecordNotFoundError`` when no run has it.

    The reads of one run's tasks, events or context through the HTTP API and the MCP tools
    refuse an unknown run with ``not_found``; the Orchestrator's lists answer empty, as the
    contract's ``list_*`` methods do.
    """
    run_uuid = v.require_id(run_id, "run_id")
    if not Run.objects.using(using).filter(pk=run_uuid).exists():
        raise RecordNotFoundError(f"Run {run_uuid} does not exist.", run_id=run_uuid)
    return run_uuid


def list_run_tasks(*, using: str, run_id: Any) -> list[Task]:
    run_uuid = v.require_id(run_id, "run_id")
    return list(Task.objects.using(using).filter(run_id=run_uuid).order_by("created_at", "id"))


def list_runs(
    *,
    using: str,
    namespace: str | None = None,
    statuses: Any = None,
    external_id: str | None = None,
    updated_after: datetime | None = None,
    updated_before: datetime | None = None,
    limit: int | None = None,
    offset: int = 0,
    order_by: str = "updated_at",
    order_dir: str = "desc",
) -> list[Run]:
    if order_by not in RUN_ORDER_FIELDS:
        raise ValidationError(
            f"order_by must be one of {', '.join(RUN_ORDER_FIELDS)}, got {order_by!r}.",
            field="order_by",
        )
    if order_dir not in ("asc", "desc"):
        raise ValidationError(
            f"order_dir must be 'asc' or 'desc', got {order_dir!r}.", field="order_dir"
        )
    qs: QuerySet[Run] = Run.objects.using(using)
    if namespace is not None:
        qs = qs.filter(namespace=v.text(namespace, "namespace"))
    chosen = v.choice_list(statuses, "statuses", RunStatus)
    if chosen is not None:
        qs = qs.filter(status__in=chosen)
    if external_id is not None:
        qs = qs.filter(external_id=v.text(external_id, "external_id"))
    after = v.optional_datetime(updated_after, "updated_after")
    if after is not None:
        qs = qs.filter(updated_at__gte=after)
    before = v.optional_datetime(updated_before, "updated_before")
    if before is not None:
        qs = qs.filter(updated_at__lt=before)
    prefix = "-" if order_dir == "desc" else ""
    qs = qs.order_by(f"{prefix}{order_by}", f"{prefix}id")
    start = v.offset(offset)
    return list(qs[start : start + v.limit(limit)])


def list_pending_tasks(
    *,
    using: str,
    run_id: Any = None,
    kinds: Any = None,
    ready_by: datetime | None = None,
    limit: int | None = None,
) -> list[Task]:
    """Queued tasks in claim order; with ``ready_by``, only those a claim could take then."""
    qs = pending_tasks(using=using, run_id=run_id, kinds=kinds, ready_by=ready_by)
    return list(qs.order_by(*CLAIM_ORDER)[: v.limit(limit)])


def pending_tasks(
    *, using: str, run_id: Any = None, kinds: Any = None, ready_by: datetime | None = None
) -> QuerySet[Task]:
    """The queued tasks of ``list_pending_tasks`` (unordered, for the API's keyset pages)."""
    qs = Task.objects.using(using).filter(status=TaskStatus.QUEUED)
    if run_id is not None:
        qs = qs.filter(run_id=v.require_id(run_id, "run_id"))
    kind_list = v.kinds(kinds)
    if kind_list:
        qs = qs.filter(kind__in=kind_list)
    ready = v.optional_datetime(ready_by, "ready_by")
    if ready is not None:
        qs = qs.filter(unmet_dependencies=0).filter(
            Q(not_before__isnull=True) | Q(not_before__lte=ready)
        )
    return qs


def list_dead_tasks(
    *,
    using: str,
    run_id: Any = None,
    kinds: Any = None,
    limit: int | None = None,
    offset: int = 0,
) -> list[Task]:
    qs = Task.objects.using(using).filter(DEAD_LETTERED)
    if run_id is not None:
        qs = qs.filter(run_id=v.require_id(run_id, "run_id"))
    kind_list = v.kinds(kinds)
    if kind_list:
        qs = qs.filter(kind__in=kind_list)
    start = v.offset(offset)
    return list(qs.order_by("-updated_at", "-id")[start : start + v.limit(limit)])


def get_current_context_snapshot(*, using: str, run_id: Any) -> ContextSnapshot | None:
    parsed = parse_id(run_id)
    if parsed is None:
        return None
    return (
        ContextSnapshot.objects.using(using)
        .filter(
            pk__in=Run.objects.using(using).filter(pk=parsed).values("current_context_snapshot_id")
        )
        .first()
    )


def list_run_events(*, using: str, run_id: Any) -> list[Event]:
    run_uuid = v.require_id(run_id, "run_id")
    return list(Event.objects.using(using).filter(run_id=run_uuid).order_by("id"))


def list_events_since(
    *,
    using: str,
    after_id: int | None = None,
    run_id: Any = None,
    event_types: Any = None,
    limit: int | None = None,
) -> EventPage:
    """A page of events after ``after_id``, in id order, never skipping a committed one.

    On PostgreSQL ids are allocated before commit, so a later id can commit first. Writers
    hold a shared advisory lock from their first event insert to commit; here it is taken
    exclusively around the read, so no writer is between allocating an id and committing it.
    """
    after = v.integer(after_id, "after_id", minimum=0, maximum=MAX_EVENT_ID, allow_none=True)
    size = v.limit(limit, default=app_settings.DEFAULT_EVENT_PAGE_LIMIT)
    qs = Event.objects.using(using).all()
    if after is not None:
        qs = qs.filter(id__gt=after)
    if run_id is not None:
        qs = qs.filter(run_id=v.require_id(run_id, "run_id"))
    types = v.event_types(event_types)
    if types is not None:
        qs = qs.filter(event_type__in=types)
    qs = qs.order_by("id")
    connection = connections[using]
    if connection.vendor != "postgresql":
        events = list(qs[:size])  # SQLite commits writers one at a time, in id order
    elif not Event.objects.using(using).filter(id__gt=after or 0).exists():
        events = []  # nothing newer: no need to wait for writers
    else:
        events = _behind_event_fence(using, lambda: list(qs[:size]))
    if events:
        cursor_value: int | None = events[-1].pk
    else:
        cursor_value = after
    return EventPage(events=events, next_cursor=cursor_value)


def last_event_id(*, using: str) -> int:
    """The id of the newest event (0 when there is none), read behind the event fence as
    ``list_events_since`` reads: every event with a lower id has committed, so a feed that
    starts after it ("from now on") misses nothing."""
    newest = Event.objects.using(using).order_by("-id").values_list("id", flat=True)
    return _behind_event_fence(using, lambda: newest.first()) or 0


def _behind_event_fence(using: str, read: Callable[[], T]) -> T:
    """``read()`` while no writer is between allocating an event id and committing it
    (PostgreSQL allocates ids before commit; see docs/events.md). SQLite commits writers one
    at a time, in id order: no fence."""
    connection = connections[using]
    if connection.vendor != "postgresql":
        return read()
    if not connection.in_atomic_block:
        # A transaction-level lock: released by the commit even behind a pooler.
        with transaction.atomic(using=using), connection.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [EVENT_FENCE_LOCK_KEY])
            return read()
    # Inside the caller's transaction: hold the fence only for this read.
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_lock(%s)", [EVENT_FENCE_LOCK_KEY])
        try:
            # A savepoint: if the read fails, the transaction stays usable for the unlock.
            with transaction.atomic(using=using):
                return read()
        finally:
            cursor.execute("SELECT pg_advisory_unlock(%s)", [EVENT_FENCE_LOCK_KEY])


# Said of a task whose lease ran out that no expiry pass has requeued yet (explain_task,
# pmcp_status).
LEASE_LAPSED = (
    "That lease has lapsed (its worker stopped heart-beating) and nothing has expired it "
    "yet: a running local pmcp_worker does within WORKER_LEASE_EXPIRY_INTERVAL_MS, or run "
    "pmcp_expire_leases."
)


def explain_task(*, using: str, task_id: Any, now: datetime | None = None) -> list[Blocker]:
    """Why a non-terminal task is not running; empty when the next claim can take it and a
    running worker handles its kind (and for terminal tasks, which have nothing left to wait
    for)."""
    now = v.resolve_now(now)
    task_uuid = v.require_id(task_id, "task_id")
    task = Task.objects.using(using).select_related("run").filter(pk=task_uuid).first()
    if task is None:
        raise RecordNotFoundError(f"Task {task_uuid} does not exist.", task_id=task_uuid)
    if task.status in TERMINAL_TASK_STATUSES:
        return []
    blockers: list[Blocker] = []
    if task.run.status == RunStatus.CANCELLED:
        blockers.append(Blocker("run_cancelled", f"Run {task.run_id} was cancelled."))
    if task.status in LEASED_TASK_STATUSES:
        assert task.lease_expires_at is not None  # set while leased (a check constraint)
        message = (
            f"Task is {task.status} by worker {task.leased_by!r} under lease "
            f"{task.lease_id} until {task.lease_expires_at.isoformat()}."
        )
        if task.lease_expires_at < now:  # strict, as expiry is
            message += " " + LEASE_LAPSED
        blockers.append(Blocker("leased", message, until=task.lease_expires_at))
        return blockers
    if task.status in PAUSED_TASK_STATUSES:
        pause = (
            Event.objects.using(using)
            .filter(task_id=task.pk, event_type=f"task.{task.status}")
            .order_by("-id")
            .values_list("payload", flat=True)
            .first()
        )
        reason = (pause or {}).get("reason")
        waits_for = list(
            TaskBlocker.objects.using(using)
            .filter(task_id=task.pk)
            .select_related("blocker")
            .order_by("id")
        )
        pending = [
            edge.blocker for edge in waits_for if edge.blocker.status != TaskStatus.COMPLETED
        ]
        if pending:
            for blocker in pending:
                if blocker.status in (TaskStatus.FAILED, TaskStatus.CANCELLED):
                    message = (
                        f"Blocked by task {blocker.pk} ({blocker.kind}), which is "
                        f"{blocker.status}: it stays blocked until that task is "
                        "re-executed and completes, or resume_task is called."
                    )
                else:
                    message = (
                        f"Blocked until task {blocker.pk} ({blocker.kind}) completes; "
                        f"it is {blocker.status}."
                    )
                blockers.append(Blocker("paused", message, task_id=blocker.pk))
            return blockers
        blockers.append(
            Blocker(
                "paused",
                f"Task is paused ({task.status})"
                + (f": {reason}" if reason else "")
                + "; resume_task puts it back in the queue.",
            )
        )
        return blockers
    edges = (
        TaskDependency.objects.using(using)
        .filter(task_id=task.pk)
        .select_related("depends_on")
        .order_by("id")
    )
    for edge in edges:
        dep = edge.depends_on
        # What the edge adds to the task's counters (services/dag.py): one rule for both.
        unmet, failed = edge_counts((dep.status, dep.failed_dependencies), required=edge.required)
        if failed and dep.status in (TaskStatus.FAILED, TaskStatus.CANCELLED):
            message = (
                f"Required dependency {dep.pk} ({dep.kind}) is {dep.status}; this task "
                "cannot run unless it is re-executed."
            )
            blockers.append(Blocker("dependency_failed", message, task_id=dep.pk))
        elif failed:  # the dependency is stuck
            message = (
                f"Dependency {dep.pk} ({dep.kind}) can never run: one of its own "
                "required dependencies failed or was cancelled."
            )
            blockers.append(Blocker("dependency_failed", message, task_id=dep.pk))
        elif unmet:
            message = f"Waiting for dependency {dep.pk} ({dep.kind}), which is {dep.status}."
            blockers.append(Blocker("dependency_pending", message, task_id=dep.pk))
    blocked_by_others = bool(blockers)
    due = task.not_before is None or task.not_before <= now
    if (
        not blockers
        and due
        and task.run.max_parallel is not None
        and task.unmet_dependencies == 0
        and not task.claimable
    ):
        blockers.append(
            Blocker(
                "run_limit",
                f"Run {task.run_id} allows max_parallel={task.run.max_parallel} tasks at once; "
                f"{in_flight(using, task.run_id)} are leased or running and the free slots went to "
                "tasks ahead of this one.",
            )
        )
    if task.not_before is not None and task.not_before > now:
        blockers.append(
            Blocker(
                "not_before",
                f"Not claimable before {task.not_before.isoformat()}.",
                until=task.not_before,
            )
        )
    # Said of a task that waits for nothing but time or a slot: one waiting for a dependency
    # is explained by that dependency (explain it in turn).
    if not blocked_by_others and kinds_without_live_worker(using=using, kinds=[task.kind], now=now):
        blockers.append(Blocker("no_worker", no_worker_message(task.kind)))
    return blockers


# -- worker presence ----------------------------------------------------------------------------


def no_worker_message(kind: str) -> str:
    """The one sentence explain_task, pmcp_status and the admin show for an unserved kind."""
    return (
        f"No running worker handles kind {kind!r}: start a pmcp_worker that has a handler for "
        "it (and no --kinds that leaves it out)."
    )


def kinds_without_live_worker(*, using: str, kinds: Any, now: datetime | None = None) -> list[str]:
    """Those of ``kinds`` that no running worker process handles (one indexed query)."""
    now = v.resolve_now(now)
    wanted = sorted(set(kinds))
    if not wanted:
        return []
    served = set(
        WorkerProcessKind.objects.using(using)
        .filter(kind__in=wanted, worker_process__expires_at__gt=now)
        .values_list("kind", flat=True)
    )
    return [kind for kind in wanted if kind not in served]


def unserved_kinds(*, using: str, tasks: Any, now: datetime | None = None) -> list[str]:
    """The kinds of ``tasks`` for which explain_task would say ``no_worker``: queued tasks
    whose dependencies are all satisfied, of a kind no running worker handles (one query)."""
    waiting = {
        task.kind
        for task in tasks
        if task.status == TaskStatus.QUEUED
        and task.unmet_dependencies == 0
        and task.failed_dependencies == 0
    }
    return kinds_without_live_worker(using=using, kinds=waiting, now=now)


def list_live_workers(*, using: str, now: datetime | None = None) -> list[WorkerProcess]:
    """Running worker processes (not yet three missed reports late), each with ``kinds``
    prefetched."""
    now = v.resolve_now(now)
    return list(
        WorkerProcess.objects.using(using)
        .filter(expires_at__gt=now)
        .prefetch_related("kinds")
        .order_by("worker_id", "started_at", "id")
    )


def list_stuck_tasks(
    *, using: str, running_longer_than_ms: int | None = None, now: datetime | None = None
) -> list[Task]:
    """Leased or running tasks whose lease is still alive (so expiry will not catch them) but
    whose current attempt has run longer than ``running_longer_than_ms`` or the task's own
    ``timeout_ms``: typically a worker wedged inside a handler. Longest-running first."""
    now = v.resolve_now(now)
    threshold = v.integer(
        running_longer_than_ms, "running_longer_than_ms", minimum=0, allow_none=True
    )
    tasks = list(
        Task.objects.using(using)
        .filter(status__in=sorted(LEASED_TASK_STATUSES), lease_expires_at__gte=now)
        .order_by("lease_expires_at")
    )
    if not tasks:
        return []
    started = {
        row["id"]: row["started_at"] or row["leased_at"]
        for row in Attempt.objects.using(using)
        .filter(pk__in=[task.lease_id for task in tasks])
        .values("id", "started_at", "leased_at")
    }
    stuck = []
    for task in tasks:
        since = started.get(task.lease_id)
        if since is None:
            continue
        elapsed_ms = (now - since).total_seconds() * 1000
        limits = [limit for limit in (threshold, task.timeout_ms) if limit is not None]
        if limits and elapsed_ms > min(limits):
            task.running_for_ms = int(elapsed_ms)
            stuck.append(task)
    stuck.sort(key=lambda task: -task.running_for_ms)
    return stuck


def list_lapsed_leases(*, using: str, now: datetime | None = None, limit: int = 100) -> list[Task]:
    """Leased or running tasks whose lease ran out before ``now`` and that no expiry pass has
    requeued yet (the worker holding it died, and nothing expires leases), first lapsed first;
    read through the lease-expiry index, as expiry is."""
    now = v.resolve_now(now)
    return list(
        Task.objects.using(using).filter(lease_lapsed(now)).order_by("lease_expires_at")[:limit]
    )


def dependency_ids(*, using: str, task_ids: list[Any]) -> dict[Any, list[Any]]:
    """The dependency ids of many tasks (declaration order), in one query."""
    found: dict[Any, list[Any]] = {task_id: [] for task_id in task_ids}
    if task_ids:
        rows = (
            TaskDependency.objects.using(using)
            .filter(task_id__in=task_ids)
            .order_by("id")
            .values_list("task_id", "depends_on_id")
        )
        for task_id, depends_on_id in rows:
            found[task_id].append(depends_on_id)
    return found


def snapshot_payloads(*, using: str, snapshot_ids: set[Any]) -> dict[Any, Any]:
    """The payloads of some context snapshots, in one query."""
    return dict(
        ContextSnapshot.objects.using(using)
        .filter(pk__in=snapshot_ids)
        .values_list("id", "payload")
    )


# -- runs created by MCP tool calls -------------------------------------------------------------
def tool_call(*, using: str, run_id: Any, principal: str, now: datetime | None = None) -> Any:
    """The tool call whose run is ``run_id``, with its run and its tool's task, when
    ``principal`` made it; None otherwise (an unknown id and someone else's look the same).
    Its ``expired`` says whether its MCP task has expired at ``now`` (``expired_calls``)."""
    run_uuid = parse_id(run_id)
    if run_uuid is None:
        return None
    now = v.resolve_now(now)
    return (
        ToolCall.objects.using(using)
        .select_related("run", "task")
        .annotate(expired=ExpressionWrapper(expired_calls(now), output_field=BooleanField()))
        .filter(pk=run_uuid, principal=principal)
        .first()
    )


def visible_tool_calls(
    *, using: str, run_ids: Any, principal: str, now: datetime | None = None
) -> set[Any]:
    """Which of ``run_ids`` are tool calls that ``principal`` made, not expired at ``now``."""
    return set(
        ToolCall.objects.using(using)
        .filter(pk__in=list(run_ids), principal=principal)
        .exclude(expired_calls(v.resolve_now(now)))
        .values_list("pk", flat=True)
    )


def outstanding_input_requests(*, using: str, run_id: Any) -> dict[str, Any]:
    """``{key: request}`` the run's tasks that wait for input still ask for."""
    rows = (
        InputRequest.objects.using(using)
        .filter(outstanding_input(run_id))
        .order_by("requested_at", "key")
        .values_list("key", "request")
    )
    return dict(rows)


# Longest error text a tool call's statusMessage quotes from a failed task.
STALL_ERROR_CHARS = 300


def tool_call_notice(*, using: str, run: Run, now: datetime | None = None) -> str | None:
    """Why a tool call's run, not ended and asking no input, is not getting on, for the MCP
    ``statusMessage``: its run is ``waiting`` on a task that nothing will resume (a task
    blocked by a failed or cancelled task, or paused without a request), or a ready task is
    of a kind no running worker handles. None when neither; at most two queries."""
    if run.status == RunStatus.WAITING:
        return _stall_of(using, run.pk)
    if run.status not in (RunStatus.PENDING, RunStatus.ACTIVE):
        return None
    served = set(
        WorkerProcessKind.objects.using(using)
        .filter(worker_process__expires_at__gt=v.resolve_now(now))
        .values_list("kind", flat=True)
        .distinct()
    )
    unserved = (
        Task.objects.using(using)
        .filter(run_id=run.pk, status=TaskStatus.QUEUED, unmet_dependencies=0)
        .filter(failed_dependencies=0)
        .exclude(kind__in=sorted(served))
        .values_list("kind", flat=True)
        .first()
    )
    return None if unserved is None else no_worker_message(unserved)


def _stall_of(using: str, run_id: Any) -> str | None:
    edge = (
        TaskBlocker.objects.using(using)
        .filter(
            task__run_id=run_id,
            task__status=TaskStatus.BLOCKED,
            blocker__status__in=[TaskStatus.FAILED, TaskStatus.CANCELLED],
        )
        .select_related("blocker")
        .order_by("id")
        .first()
    )
    if edge is not None:
        blocker = edge.blocker
        if blocker.status == TaskStatus.FAILED:
            error = str(blocker.error or "no error recorded")
            if len(error) > STALL_ERROR_CHARS:
                error = error[: STALL_ERROR_CHARS - 1] + "…"
            what = f"which failed: {error}"
        else:
            what = "which was cancelled"
        return (
            f"Stalled: blocked by task {blocker.pk} ({blocker.kind}), {what}. It stays "
            "blocked until an operator re-executes that task (retry_task, or the admin's "
            "Re-execute action) or resumes this one; or cancel this task."
        )
    paused = (
        Task.objects.using(using)
        .filter(run_id=run_id, status__in=sorted(PAUSED_TASK_STATUSES))
        # Not one blocked on other tasks: those are explained by what they wait for.
        .filter(~Exists(TaskBlocker.objects.using(using).filter(task_id=OuterRef("pk"))))
        .order_by("id")
        .values_list("pk", "kind", "status")
        .first()
    )
    if paused is None:
        return None
    task_id, kind, status = paused
    return (
        f"Stalled: task {task_id} ({kind}) is {status} and nothing will resume it; an "
        "operator can resume it (resume_task), or cancel this task."
    )

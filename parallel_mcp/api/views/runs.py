"""Runs: list, create, detail, cancel, copy, context, events and tasks of a run."""

from __future__ import annotations

from typing import Any

from drf_spectacular.utils import OpenApiExample
from rest_framework import status
from rest_framework.response import Response

from ...contract import shapes
from ...contract.arguments import WHEN
from ...exceptions import RecordNotFoundError
from ...models import Run, Task
from ..pagination import RUN_ORDERS, TASKS_BY_CREATED, next_link
from ..permissions import OPERATE, READ
from ..schema import api_schema
from ..serializers import inputs, outputs
from .base import ApiView
from .common import event_page, require_run, tasks_data

RUN_EXAMPLE: dict[str, Any] = {
    "id": "0195f3a1-8c1e-7a11-9c3e-2b1f0d7e4a01",
    "namespace": "sites",
    "external_id": "deploy-42",
    "status": "active",
    "metadata": {"requested_by": "ops"},
    "current_context_snapshot_id": "0195f3a1-8c1f-7c52-8d0a-7f3e2c9b1a02",
    "max_parallel": None,
    "cancel_requested_at": None,
    "cancel_reason": None,
    "tasks_total": 3,
    "tasks_active": 2,
    "tasks_waiting": 0,
    "tasks_stuck": 0,
    "tasks_completed": 1,
    "tasks_failed": 0,
    "tasks_cancelled": 0,
    "progress": 0.3333333333333333,
    "created_at": "2026-01-01T12:00:00Z",
    "updated_at": "2026-01-01T12:00:05Z",
}


def run_queryset(using: str, params: dict[str, Any]):
    """The filters of ``Orchestrator.list_runs`` as a read-only queryset, for keyset pages."""
    queryset = Run.objects.using(using).all()
    if "namespace" in params:
        queryset = queryset.filter(namespace=params["namespace"])
    if params.get("status"):
        queryset = queryset.filter(status__in=params["status"])
    if "external_id" in params:
        queryset = queryset.filter(external_id=params["external_id"])
    # The contract's check, as list_runs applies it: it returns the time in UTC (the value
    # read from the query string keeps its offset, which PostgreSQL refuses beyond ±15:59).
    if params.get("updated_after") is not None:
        after = WHEN.check(params["updated_after"], "updated_after")
        queryset = queryset.filter(updated_at__gte=after)
    if params.get("updated_before") is not None:
        before = WHEN.check(params["updated_before"], "updated_before")
        queryset = queryset.filter(updated_at__lt=before)
    return queryset


class RunCollectionView(ApiView):
    access = {"GET": READ, "POST": OPERATE}
    view_permissions = ("parallel_mcp.view_run",)
    error_statuses = {"POST": (409,)}  # duplicate_id
    data_refusals = {"GET": ("cursor",)}
    tags = ("runs",)

    @api_schema(
        operation_id="runs_list",
        summary="List runs",
        description="The filters of list_runs, newest first by default, in keyset pages "
        "(pass next_cursor back as ?cursor=; no total count).",
        parameters=[inputs.RunListQuery],
        responses={200: outputs.RunPageOut},
    )
    def get(self, request: Any) -> Response:
        params = self.query(inputs.RunListQuery)
        keyset = RUN_ORDERS[(params["order_by"], params["order_dir"])]
        page = keyset.page(
            run_queryset(self.using, params),
            cursor=params.get("cursor"),
            limit=self.page_size(params),
        )
        return Response(
            {
                "results": [shapes.run(item) for item in page.items],
                "next_cursor": page.next_cursor,
                "next": next_link(request, page.next_cursor),
            }
        )

    @api_schema(
        operation_id="runs_create",
        summary="Create a run",
        request=inputs.RunCreateIn,
        responses={201: outputs.RunOut},
        examples=[
            OpenApiExample(
                "A run with initial context",
                request_only=True,
                value={
                    "namespace": "sites",
                    "external_id": "deploy-42",
                    "metadata": {"requested_by": "ops"},
                    "context": {"release": "2026.01"},
                },
            ),
            OpenApiExample(
                "The new run", response_only=True, status_codes=["201"], value=RUN_EXAMPLE
            ),
        ],
    )
    def post(self, request: Any) -> Response:
        data = self.body(inputs.RunCreateIn)
        run = self.orchestrator.create_run(**data)
        return Response(shapes.run(run), status=status.HTTP_201_CREATED)


class RunDetailView(ApiView):
    access = READ
    view_permissions = ("parallel_mcp.view_run",)
    tags = ("runs",)

    @api_schema(
        operation_id="runs_retrieve",
        summary="A run, with its task counters and progress",
        responses={200: outputs.RunOut},
        examples=[OpenApiExample("A run", value=RUN_EXAMPLE)],
    )
    def get(self, request: Any, run_id: Any) -> Response:
        run = self.orchestrator.get_run(run_id=run_id)
        if run is None:
            raise RecordNotFoundError(f"Run {run_id} does not exist.", run_id=run_id)
        return Response(shapes.run(run))


class RunCancelView(ApiView):
    access = OPERATE
    tags = ("runs",)

    @api_schema(
        operation_id="runs_cancel",
        summary="Cancel a run",
        description="Cancels every non-terminal task of the run; workers holding leases learn "
        "it on their next heartbeat. A terminal run is returned unchanged.",
        request=inputs.ReasonIn,
        responses={200: outputs.RunOut},
    )
    def post(self, request: Any, run_id: Any) -> Response:
        data = self.body(inputs.ReasonIn)
        run = self.orchestrator.cancel_run(run_id=run_id, **data)
        return Response(shapes.run(run))


class RunCopyView(ApiView):
    access = OPERATE
    tags = ("runs",)

    @api_schema(
        operation_id="runs_copy",
        summary="Copy a run",
        description="A new run with a fresh copy of every task definition and the same "
        "dependency graph; the original is untouched.",
        request=inputs.ReasonIn,
        responses={201: outputs.RunOut},
    )
    def post(self, request: Any, run_id: Any) -> Response:
        data = self.body(inputs.ReasonIn)
        run = self.orchestrator.copy_run(run_id=run_id, **data)
        return Response(shapes.run(run), status=status.HTTP_201_CREATED)


class RunContextView(ApiView):
    access = {"GET": READ, "POST": OPERATE}
    view_permissions = ("parallel_mcp.view_contextsnapshot",)
    error_statuses = {"POST": (409,)}  # duplicate_id
    data_refusals = {"POST": ("parent_snapshot",)}
    tags = ("runs",)

    @api_schema(
        operation_id="runs_context_retrieve",
        summary="The run's current context snapshot",
        responses={200: outputs.CurrentContextOut},
    )
    def get(self, request: Any, run_id: Any) -> Response:
        require_run(self.using, run_id)
        snapshot = self.orchestrator.get_current_context_snapshot(run_id=run_id)
        data = shapes.snapshot(snapshot) if snapshot is not None else None
        return Response({"snapshot": data})

    @api_schema(
        operation_id="runs_context_append",
        summary="Append a context snapshot (it becomes current for scope=run)",
        request=inputs.ContextAppendIn,
        responses={201: outputs.ContextSnapshotOut},
        examples=[
            OpenApiExample(
                "New shared context",
                request_only=True,
                value={"payload": {"release": "2026.02"}, "label": "operator update"},
            )
        ],
    )
    def post(self, request: Any, run_id: Any) -> Response:
        data = self.body(inputs.ContextAppendIn)
        snapshot = self.orchestrator.append_context_snapshot(run_id=run_id, **data)
        return Response(shapes.snapshot(snapshot), status=status.HTTP_201_CREATED)


class RunEventsView(ApiView):
    access = READ
    view_permissions = ("parallel_mcp.view_event",)
    tags = ("runs", "events")

    @api_schema(
        operation_id="runs_events_list",
        summary="Events of a run",
        description="list_events_since for one run: pass next_cursor back as after_id.",
        parameters=[inputs.RunEventsQuery],
        responses={200: outputs.EventPageOut},
    )
    def get(self, request: Any, run_id: Any) -> Response:
        params = self.query(inputs.RunEventsQuery)
        require_run(self.using, run_id)
        return Response(event_page(self, params, run_id=run_id))


class RunTasksView(ApiView):
    access = {"GET": READ, "POST": OPERATE}
    view_permissions = ("parallel_mcp.view_task",)
    error_statuses = {"POST": (409,)}
    data_refusals = {
        "GET": ("cursor",),
        "POST": ("dependency", "cycle", "context_snapshot"),
    }
    tags = ("runs", "tasks")

    @api_schema(
        operation_id="runs_tasks_list",
        summary="Tasks of a run, oldest first",
        parameters=[inputs.RunTasksQuery],
        responses={200: outputs.TaskPageOut},
    )
    def get(self, request: Any, run_id: Any) -> Response:
        params = self.query(inputs.RunTasksQuery)
        require_run(self.using, run_id)
        queryset = Task.objects.using(self.using).filter(run_id=run_id)
        if params.get("status"):
            queryset = queryset.filter(status__in=params["status"])
        if params.get("kind"):
            queryset = queryset.filter(kind__in=params["kind"])
        page = TASKS_BY_CREATED.page(
            queryset, cursor=params.get("cursor"), limit=self.page_size(params)
        )
        return Response(
            {
                "results": tasks_data(self.using, page.items),
                "next_cursor": page.next_cursor,
                "next": next_link(request, page.next_cursor),
            }
        )

    @api_schema(
        operation_id="runs_tasks_enqueue",
        summary="Enqueue a task into the run",
        request=inputs.TaskIn,
        responses={201: outputs.TaskOut},
        examples=[
            OpenApiExample(
                "A task with retries that waits for another",
                request_only=True,
                value={
                    "kind": "site.apply",
                    "key": "apply-eu",
                    "priority": 5,
                    "max_attempts": 3,
                    "retry": {"delay_ms": 1000, "backoff": "exponential", "max_delay_ms": 60000},
                    "timeout_ms": 300000,
                    "input": {"region": "eu"},
                    "depends_on": ["0195f3a1-8c20-7d11-a2b3-c4d5e6f70803"],
                },
            )
        ],
    )
    def post(self, request: Any, run_id: Any) -> Response:
        data = self.body(inputs.TaskIn)
        task = self.orchestrator.enqueue_task(run_id=run_id, **data)
        return Response(shapes.task(task), status=status.HTTP_201_CREATED)


class RunTasksBatchView(ApiView):
    access = OPERATE
    error_statuses = (409,)
    data_refusals = ("dependency", "cycle", "context_snapshot", "batch_id")
    tags = ("runs", "tasks")

    @api_schema(
        operation_id="runs_tasks_enqueue_batch",
        summary="Enqueue a graph of tasks at once",
        description="All or nothing. depends_on may name the key of a task of the same batch; "
        "a cycle answers 400 dependency_cycle naming it.",
        request=inputs.TaskBatchIn,
        responses={201: outputs.TaskBatchOut},
        examples=[
            OpenApiExample(
                "Fan-out and join",
                request_only=True,
                value={
                    "tasks": [
                        {"kind": "fetch", "key": "a", "input": {"shard": 1}},
                        {"kind": "fetch", "key": "b", "input": {"shard": 2}},
                        {"kind": "merge", "key": "join", "depends_on": ["a", "b"]},
                    ]
                },
            )
        ],
    )
    def post(self, request: Any, run_id: Any) -> Response:
        data = self.body(inputs.TaskBatchIn)
        tasks = self.orchestrator.enqueue_tasks(
            run_id=run_id, tasks=[dict(item) for item in data["tasks"]]
        )
        return Response({"tasks": shapes.tasks(tasks)}, status=201)

"""Tasks: detail (attempts, blockers), operator actions, pending / dead / stuck lists."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from drf_spectacular.utils import OpenApiExample
from rest_framework.response import Response

from ... import selectors
from ...contract import shapes
from ...exceptions import RecordNotFoundError
from ...models import Attempt, Task
from ...models.tasks import DEAD_LETTERED
from ..pagination import TASKS_BY_CLAIM_ORDER, TASKS_BY_UPDATED_DESC, next_link
from ..permissions import OPERATE, READ
from ..schema import api_schema
from ..serializers import inputs, outputs
from ..settings import api_settings
from .base import ApiView
from .common import tasks_data


class TaskDetailView(ApiView):
    access = READ
    view_permissions = ("parallel_mcp.view_task",)
    tags = ("tasks",)

    @api_schema(
        operation_id="tasks_retrieve",
        summary="A task, with its recent attempts and what blocks it",
        responses={200: outputs.TaskDetailOut},
    )
    def get(self, request: Any, task_id: Any) -> Response:
        task = self.orchestrator.get_task(task_id=task_id)
        if task is None:
            raise RecordNotFoundError(f"Task {task_id} does not exist.", task_id=task_id)
        recent = list(
            Attempt.objects.using(self.using)
            .filter(task_id=task.pk)
            .order_by("-leased_at", "-id")[: int(api_settings.TASK_DETAIL_ATTEMPTS)]
        )
        blockers = self.orchestrator.explain_task(task_id=task.pk)
        return Response(shapes.task_detail(task, attempts=recent[::-1], blockers=blockers))


class _TaskActionView(ApiView):
    access = OPERATE
    error_statuses = (409,)
    tags = ("tasks",)


class TaskResumeView(_TaskActionView):
    @api_schema(
        operation_id="tasks_resume",
        summary="Resume a paused task (blocked or waiting_input -> queued)",
        request=inputs.ResumeIn,
        responses={200: outputs.TaskOut},
        examples=[
            OpenApiExample(
                "Answer a task waiting for input",
                request_only=True,
                value={"input": {"approved": True}},
            )
        ],
    )
    def post(self, request: Any, task_id: Any) -> Response:
        data = self.body(inputs.ResumeIn)
        task = self.orchestrator.resume_task(task_id=task_id, **data)
        return Response(shapes.task(task))


class TaskCancelView(_TaskActionView):
    @api_schema(
        operation_id="tasks_cancel",
        summary="Cancel a task",
        description="Any non-terminal task -> cancelled; a worker holding its lease gets 409 "
        "lease_conflict (details.cancelled = true) on its next call.",
        request=inputs.ReasonIn,
        responses={200: outputs.TaskOut},
    )
    def post(self, request: Any, task_id: Any) -> Response:
        data = self.body(inputs.ReasonIn)
        task = self.orchestrator.cancel_task(task_id=task_id, **data)
        return Response(shapes.task(task))


class TaskRetryView(_TaskActionView):
    @api_schema(
        operation_id="tasks_retry",
        summary="Re-execute a finished task (failed, cancelled or completed -> queued)",
        request=inputs.TaskRetryIn,
        responses={200: outputs.TaskOut},
    )
    def post(self, request: Any, task_id: Any) -> Response:
        data = self.body(inputs.TaskRetryIn)
        task = self.orchestrator.retry_task(task_id=task_id, **data)
        return Response(shapes.task(task))


class TaskRequeueView(_TaskActionView):
    @api_schema(
        operation_id="tasks_requeue",
        summary="Requeue a task from the dead-letter queue",
        request=inputs.RequeueIn,
        responses={200: outputs.TaskOut},
    )
    def post(self, request: Any, task_id: Any) -> Response:
        data = self.body(inputs.RequeueIn)
        task = self.orchestrator.requeue_dead_task(task_id=task_id, **data)
        return Response(shapes.task(task))


def _task_page(view: ApiView, request: Any, keyset: Any, queryset: Any, params: dict) -> Response:
    page = keyset.page(queryset, cursor=params.get("cursor"), limit=view.page_size(params))
    return Response(
        {
            "results": tasks_data(view.using, page.items),
            "next_cursor": page.next_cursor,
            "next": next_link(request, page.next_cursor),
        }
    )


def pending_ready_by(params: dict[str, Any]) -> Any:
    """The time a pending listing filters on: ready_by when given (it says when; ready=true
    with it adds nothing), else now for ready=true, else none. Query parameters cannot state
    "one or the other" in OpenAPI, so both together are accepted rather than refused."""
    if params.get("ready_by") is not None:
        return params["ready_by"]
    return timezone.now() if params.get("ready") else None


class PendingTasksView(ApiView):
    access = READ
    view_permissions = ("parallel_mcp.view_task",)
    data_refusals = ("cursor",)
    tags = ("tasks",)

    @api_schema(
        operation_id="tasks_pending_list",
        summary="Queued tasks, in claim order",
        description="list_pending_tasks in keyset pages: highest priority first, then oldest; "
        "ready=true or ready_by: only tasks a claim could take now or then (ready_by wins when "
        "both are given).",
        parameters=[inputs.PendingQuery],
        responses={200: outputs.TaskPageOut},
    )
    def get(self, request: Any) -> Response:
        params = self.query(inputs.PendingQuery)
        queryset = selectors.pending_tasks(
            using=self.using,
            run_id=params.get("run_id"),
            kinds=params.get("kind") or None,
            ready_by=pending_ready_by(params),
        )
        return _task_page(self, request, TASKS_BY_CLAIM_ORDER, queryset, params)


class DeadTasksView(ApiView):
    access = READ
    view_permissions = ("parallel_mcp.view_task",)
    data_refusals = ("cursor",)
    tags = ("tasks",)

    @api_schema(
        operation_id="tasks_dead_list",
        summary="The dead-letter queue, most recent first",
        parameters=[inputs.DeadQuery],
        responses={200: outputs.TaskPageOut},
    )
    def get(self, request: Any) -> Response:
        params = self.query(inputs.DeadQuery)
        queryset = Task.objects.using(self.using).filter(DEAD_LETTERED)
        if params.get("run_id") is not None:
            queryset = queryset.filter(run_id=params["run_id"])
        if params.get("kind"):
            queryset = queryset.filter(kind__in=params["kind"])
        return _task_page(self, request, TASKS_BY_UPDATED_DESC, queryset, params)


class StuckTasksView(ApiView):
    access = READ
    view_permissions = ("parallel_mcp.view_task",)
    tags = ("tasks",)

    @api_schema(
        operation_id="tasks_stuck_list",
        summary="Leased or running tasks past a threshold or their own timeout_ms",
        description="list_stuck_tasks: still heart-beating, so lease expiry will not catch "
        "them; longest-running first.",
        parameters=[inputs.StuckQuery],
        responses={200: outputs.TaskListOut},
    )
    def get(self, request: Any) -> Response:
        params = self.query(inputs.StuckQuery)
        tasks = self.orchestrator.list_stuck_tasks(
            running_longer_than_ms=params.get("running_longer_than_ms")
        )
        return Response({"results": tasks_data(self.using, tasks)})

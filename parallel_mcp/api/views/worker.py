"""The worker protocol over HTTP: claim (one task or a batch), running, heartbeat, progress,
pause, complete, fail, release, and the worker process's presence. Every call about a claimed
task presents ``lease_id`` and ``worker_id`` (fencing); a call whose lease no longer holds
answers 409 ``lease_conflict`` with ``details.cancelled`` telling whether the task or its run
was cancelled, or 410 ``lease_expired``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from drf_spectacular.utils import OpenApiExample, OpenApiResponse
from rest_framework import status
from rest_framework.response import Response

from ...contract import shapes
from ...services.workers import record_worker_presence, remove_worker_presence
from ..permissions import WORK
from ..schema import api_schema
from ..serializers import inputs, outputs
from .base import ApiView
from .runs import RUN_EXAMPLE

RUN_ID = RUN_EXAMPLE["id"]
TASK_ID = "0195f3a1-8c20-7d11-a2b3-c4d5e6f70803"
LEASE_ID = "0195f3a1-9d00-7e00-8a00-0a0b0c0d0e0f"
WORKER_ID = "host-1:4242:0"

TASK_EXAMPLE: dict[str, Any] = {
    "id": TASK_ID,
    "run_id": RUN_ID,
    "key": "apply-eu",
    "kind": "site.apply",
    "status": "leased",
    "priority": 5,
    "max_attempts": 3,
    "attempt_count": 1,
    "retry_delay_ms": 1000,
    "retry_backoff": "exponential",
    "retry_max_delay_ms": 60000,
    "timeout_ms": 300000,
    "not_before": None,
    "input": {"region": "eu"},
    "output": None,
    "metadata": None,
    "error": None,
    "progress": 0.0,
    "progress_message": None,
    "context_snapshot_id": RUN_EXAMPLE["current_context_snapshot_id"],
    "lease_id": LEASE_ID,
    "leased_by": WORKER_ID,
    "lease_expires_at": "2026-01-01T12:00:36Z",
    "dead": False,
    "created_at": "2026-01-01T12:00:00Z",
    "updated_at": "2026-01-01T12:00:06Z",
    "started_at": None,
    "completed_at": None,
    "depends_on_task_ids": [],
}
LEASE_EXAMPLE: dict[str, Any] = {
    "id": LEASE_ID,
    "run_id": RUN_ID,
    "task_id": TASK_ID,
    "attempt_id": LEASE_ID,
    "worker_id": WORKER_ID,
    "status": "active",
    "acquired_at": "2026-01-01T12:00:06Z",
    "expires_at": "2026-01-01T12:00:36Z",
    "heartbeat_at": "2026-01-01T12:00:06Z",
    "released_at": None,
    "client_token": "host-1:4242:0:claim:17",
}
ATTEMPT_EXAMPLE: dict[str, Any] = {
    "id": LEASE_ID,
    "run_id": RUN_ID,
    "task_id": TASK_ID,
    "worker_id": WORKER_ID,
    "status": "leased",
    "leased_at": "2026-01-01T12:00:06Z",
    "started_at": None,
    "ended_at": None,
    "lease_expires_at": "2026-01-01T12:00:36Z",
    "error": None,
    "output": None,
    "metadata": None,
}
LEASE_CONFLICT_EXAMPLE = {
    "error": {
        "code": "lease_conflict",
        "message": f"Task {TASK_ID} is cancelled, not leased; lease {LEASE_ID} is no longer valid.",
        "details": {
            "task_id": TASK_ID,
            "lease_id": LEASE_ID,
            "status": "cancelled",
            "cancelled": True,
        },
    }
}


class _WorkerView(ApiView):
    access = WORK
    throttle_scope = "pmcp_worker"
    tags = ("worker",)


CLAIM_REQUEST = {
    "worker_id": WORKER_ID,
    "lease_ms": 30000,
    "kinds": ["site.apply"],
    "client_token": "host-1:4242:0:claim:17",
}
CLAIM_RESPONSE = {
    "run": RUN_EXAMPLE,
    "task": TASK_EXAMPLE,
    "attempt": ATTEMPT_EXAMPLE,
    "lease": LEASE_EXAMPLE,
    "context": {"release": "2026.01"},
}


class ClaimView(_WorkerView):
    error_statuses = (409,)

    @api_schema(
        operation_id="worker_claim",
        summary="Claim the next ready task",
        description="200 with the claim, or 204 (no body) when nothing is claimable. A retried "
        "claim with the same client_token returns the same claim (409 idempotency_conflict if "
        "another worker used the token). With start=true the task is claimed straight into "
        "running (no tasks/{task_id}/running call needed).",
        request=inputs.ClaimIn,
        responses={
            200: outputs.ClaimOut,
            204: OpenApiResponse(description="Nothing is claimable now."),
        },
        examples=[
            OpenApiExample("Claim", request_only=True, value=CLAIM_REQUEST),
            OpenApiExample(
                "A claim", response_only=True, status_codes=["200"], value=CLAIM_RESPONSE
            ),
        ],
    )
    def post(self, request: Any) -> Response:
        data = self.body(inputs.ClaimIn)
        claim = self.orchestrator.claim_next_task(**data)
        if claim is None:
            return Response(status=status.HTTP_204_NO_CONTENT)
        return Response(shapes.claim(claim))


class ClaimBatchView(_WorkerView):
    error_statuses = (409,)

    @api_schema(
        operation_id="worker_claim_batch",
        summary="Claim up to `limit` ready tasks at once",
        description="Up to limit (1 to 100) claims in one transaction, in claim order (priority, "
        "then age), each under its own lease and shaped like a worker/claim answer; an empty "
        "list when nothing is claimable. A retried batch with the same client_token returns "
        "the same claims (lease n carries the token '<client_token>#<n>'; 409 "
        "idempotency_conflict if another worker used it). start=true claims the tasks straight "
        "into running.",
        request=inputs.ClaimBatchIn,
        responses={200: outputs.ClaimBatchOut},
        examples=[
            OpenApiExample(
                "Claim a batch",
                request_only=True,
                value={**CLAIM_REQUEST, "limit": 10, "start": True},
            ),
            OpenApiExample(
                "Claims",
                response_only=True,
                status_codes=["200"],
                value={"claims": [CLAIM_RESPONSE]},
            ),
        ],
    )
    def post(self, request: Any) -> Response:
        data = self.body(inputs.ClaimBatchIn)
        claims = self.orchestrator.claim_next_tasks(**data)
        return Response({"claims": shapes.claims(claims)})


class _LeaseView(_WorkerView):
    error_statuses = (409, 410)
    serializer: type = inputs.LeaseIn

    def task_call(self, task_id: Any, method: Callable[..., Any]) -> Response:
        # A lost lease raises LeaseConflictError with details.cancelled (set by the service).
        data = self.body(self.serializer)
        return Response(shapes.task(method(task_id=task_id, **data)))


def _lease_schema(operation_id: str, summary: str, serializer: type, **kwargs: Any) -> Any:
    return api_schema(
        operation_id=operation_id,
        summary=summary,
        request=serializer,
        responses=kwargs.pop("responses", {200: outputs.TaskOut}),
        **kwargs,
    )


class TaskRunningView(_LeaseView):
    serializer = inputs.LeaseIn

    @_lease_schema("worker_running", "Mark a claimed task running", inputs.LeaseIn)
    def post(self, request: Any, task_id: Any) -> Response:
        return self.task_call(task_id, self.orchestrator.mark_task_running)


class TaskHeartbeatView(_LeaseView):
    serializer = inputs.HeartbeatIn

    @_lease_schema(
        "worker_heartbeat",
        "Extend the lease",
        inputs.HeartbeatIn,
        description="Extends the lease to now + lease_ms (default: the server's default lease). "
        "When the task or its run was cancelled the answer is 409 lease_conflict with "
        "details.cancelled = true: stop working on the task.",
        responses={200: outputs.HeartbeatOut},
        examples=[
            OpenApiExample(
                "Heartbeat",
                request_only=True,
                value={"lease_id": LEASE_ID, "worker_id": WORKER_ID, "lease_ms": 30000},
            ),
            OpenApiExample(
                "Extended",
                response_only=True,
                status_codes=["200"],
                value={"lease": LEASE_EXAMPLE, "cancelled": False},
            ),
            OpenApiExample(
                "Cancelled meanwhile",
                response_only=True,
                status_codes=["409"],
                value=LEASE_CONFLICT_EXAMPLE,
            ),
        ],
    )
    def post(self, request: Any, task_id: Any) -> Response:
        data = self.body(inputs.HeartbeatIn)
        lease = self.orchestrator.heartbeat_lease(task_id=task_id, **data)
        return Response({"lease": shapes.lease(lease), "cancelled": False})


class TaskProgressView(_LeaseView):
    serializer = inputs.ProgressIn

    @_lease_schema("worker_progress", "Report progress (0.0 to 1.0)", inputs.ProgressIn)
    def post(self, request: Any, task_id: Any) -> Response:
        return self.task_call(task_id, self.orchestrator.report_progress)


class TaskPauseView(_LeaseView):
    serializer = inputs.PauseIn
    data_refusals = ("dependency", "input_requests")  # blocked_by, input_requests

    @_lease_schema(
        "worker_pause",
        "Pause the task (blocked or waiting_input)",
        inputs.PauseIn,
        description="Gives the lease up. With status=blocked and blocked_by, the task is queued "
        "again when every named task has completed. With status=waiting_input and "
        "input_requests (a task of a run created by an MCP tool call), the requests are "
        "recorded with the pause and the task is queued again once the MCP client has answered "
        "them all. Otherwise an operator resumes it.",
    )
    def post(self, request: Any, task_id: Any) -> Response:
        return self.task_call(task_id, self.orchestrator.pause_task)


class TaskCompleteView(_LeaseView):
    serializer = inputs.CompleteIn

    @_lease_schema(
        "worker_complete",
        "Complete the task",
        inputs.CompleteIn,
        description="A retried call with the same client_token returns the recorded result "
        "without applying it twice.",
        examples=[
            OpenApiExample(
                "Complete and pass context on",
                request_only=True,
                value={
                    "lease_id": LEASE_ID,
                    "worker_id": WORKER_ID,
                    "output": {"applied": True},
                    "metadata": {"duration_ms": 5120},
                    "next_context": {"release": "2026.01", "eu": "done"},
                    "next_context_label": "after apply-eu",
                    "client_token": f"{LEASE_ID}:completed",
                },
            )
        ],
    )
    def post(self, request: Any, task_id: Any) -> Response:
        return self.task_call(task_id, self.orchestrator.complete_task)


class TaskFailView(_LeaseView):
    serializer = inputs.FailIn

    @_lease_schema(
        "worker_fail",
        "Fail the task",
        inputs.FailIn,
        description="retry=false: terminal failed. retry=true: requeued with backoff while "
        "attempts remain, else failed and dead-lettered.",
        examples=[
            OpenApiExample(
                "Fail, retry with backoff",
                request_only=True,
                value={
                    "lease_id": LEASE_ID,
                    "worker_id": WORKER_ID,
                    "error": "TimeoutError: upstream did not answer",
                    "retry": True,
                    "client_token": f"{LEASE_ID}:failed",
                },
            )
        ],
    )
    def post(self, request: Any, task_id: Any) -> Response:
        return self.task_call(task_id, self.orchestrator.fail_task)


class TaskReleaseView(_LeaseView):
    serializer = inputs.ReleaseIn

    @_lease_schema(
        "worker_release",
        "Give the task back to the queue (no attempt consumed)",
        inputs.ReleaseIn,
    )
    def post(self, request: Any, task_id: Any) -> Response:
        return self.task_call(task_id, self.orchestrator.release_task)


# -- worker presence ----------------------------------------------------------------------------

# No request example for worker/presence: with one, schemathesis' pool of example values
# changes and the full-suite fuzz run sends worker/claim an invalid Host header, which Django's
# CommonMiddleware refuses with an HTML 400 before the API sees it (reported; not an API path).
PROCESS_ID = "0195f3a1-7b00-7c00-9a00-0a0b0c0d0e10"


class PresenceView(_WorkerView):
    @api_schema(
        operation_id="worker_presence",
        summary="Report that a worker process runs, and the kinds it handles",
        description="Send it when the process starts and then every interval_ms. The process "
        "counts as running (explain_task, pmcp_status and the admin then do not say 'no "
        "running worker handles kind X' for its kinds) until three intervals after its last "
        "report. The first report of a process_id records it; later ones only refresh it.",
        request=inputs.PresenceIn,
        responses={200: outputs.WorkerProcessOut},
    )
    def post(self, request: Any) -> Response:
        data = self.body(inputs.PresenceIn)
        process = record_worker_presence(using=self.using, remote=True, **data)
        process.kind_names = list(process.kinds.values_list("kind", flat=True))
        return Response(outputs.WorkerProcessOut(process).data)


class PresenceStopView(_WorkerView):
    @api_schema(
        operation_id="worker_presence_stop",
        summary="A worker process stopped cleanly",
        description="It no longer counts as running, at once. 204 also when the process was "
        "not recorded (or had already been forgotten).",
        request=inputs.PresenceStopIn,
        responses={204: OpenApiResponse(description="Forgotten.")},
        examples=[OpenApiExample("Stopped", request_only=True, value={"process_id": PROCESS_ID})],
    )
    def post(self, request: Any) -> Response:
        data = self.body(inputs.PresenceStopIn)
        remove_worker_presence(using=self.using, **data)
        return Response(status=status.HTTP_204_NO_CONTENT)

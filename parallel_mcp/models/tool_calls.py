"""Runs created by MCP tool calls (the io.modelcontextprotocol/tasks extension): who called
which tool, and the input the tool's tasks asked the client for."""

from __future__ import annotations

from datetime import datetime

from django.db import models
from django.db.models import Q

from ..contract.limits import NAME_LENGTH
from ..states import TERMINAL_RUN_STATUSES, TaskStatus
from ._fields import uuid_pk


def expired_calls(now: datetime) -> Q:
    """Tool calls whose MCP task has expired: ``ttlMs`` has passed since the call (the
    extension counts it from creation) and the run has ended. ``tasks/get`` then answers
    "Task has expired", and ``pmcp_prune --expired`` deletes the run. A run still going on
    stays visible past its TTL: nothing interrupts work a client may still poll."""
    return Q(expires_at__lte=now, run__status__in=sorted(TERMINAL_RUN_STATUSES))


def outstanding_input(run_id: object) -> Q:
    """The run's input requests still asked for: not answered, of a task that waits for
    input (a request of a task cancelled or resumed without it asks nothing any more)."""
    return Q(run_id=run_id, answered_at__isnull=True, task__status=TaskStatus.WAITING_INPUT)


class ToolCall(models.Model):
    """A run created by a call of an MCP tool; the MCP task id is the run id."""

    run = models.OneToOneField(
        "parallel_mcp.Run",
        on_delete=models.DO_NOTHING,
        primary_key=True,
        related_name="tool_call",
    )
    tool = models.CharField(max_length=NAME_LENGTH)
    # Who called: "token:<prefix>" over HTTP with tokens, "local" otherwise. Only this
    # principal sees the MCP task.
    principal = models.CharField(max_length=NAME_LENGTH)
    # The tool's own task (its output is the call's result).
    task = models.ForeignKey(
        "parallel_mcp.Task", on_delete=models.DO_NOTHING, related_name="+", db_index=False
    )
    ttl_ms = models.BigIntegerField(null=True, blank=True)
    created_at = models.DateTimeField()
    # created_at + ttl_ms (None: unlimited), stored so that expired calls are found by index.
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "pmcp_tool_call"
        ordering = ["-created_at"]
        indexes = [
            models.Index(
                fields=["expires_at"],
                name="pmcp_tool_call_expiry_idx",
                condition=Q(expires_at__isnull=False),
            )
        ]

    def __str__(self) -> str:
        return f"{self.tool} call {self.run_id}"


class InputRequest(models.Model):
    """One request a task asked the client to fulfil (an elicitation, a sampling request),
    keyed as in ``inputRequests``; unique in its run over the run's whole life."""

    id = uuid_pk()
    run = models.ForeignKey(
        "parallel_mcp.Run", on_delete=models.DO_NOTHING, related_name="+", db_index=False
    )
    task = models.ForeignKey(
        "parallel_mcp.Task", on_delete=models.DO_NOTHING, related_name="input_requests"
    )
    key = models.CharField(max_length=NAME_LENGTH)
    request = models.JSONField()
    requested_at = models.DateTimeField()
    # Set together when the client answers (tasks/update).
    response = models.JSONField(null=True, blank=True)
    answered_at = models.DateTimeField(null=True, blank=True)
    answered_by = models.CharField(max_length=NAME_LENGTH, null=True, blank=True)

    class Meta:
        db_table = "pmcp_input_request"
        ordering = ["requested_at", "key"]
        constraints = [
            models.UniqueConstraint(fields=["run", "key"], name="pmcp_input_request_key_unique")
        ]

    def __str__(self) -> str:
        return f"input {self.key} of task {self.task_id}"

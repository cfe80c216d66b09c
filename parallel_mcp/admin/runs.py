"""The Run admin: a list with status, task counts and progress from the run's counters (no
per-row queries), and a detail page with the context chain, the task graph, the tasks and the
latest events."""

from __future__ import annotations

import json
from typing import Any

from django.contrib import admin
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import mark_safe

from ..ids import parse_id
from ..mcp.task_state import mcp_status
from ..models import Run
from ..selectors import in_flight, no_worker_message, unserved_kinds
from ..states import TaskStatus
from . import reads
from .actions import RUN_ACTIONS, run_action_applies
from .base import ParallelMcpAdmin
from .formatting import (
    EMPTY,
    admin_url,
    compact_relative,
    first_line,
    id_link,
    json_block,
    progress_bar,
    relative,
    run_counts,
    run_progress_bar,
    short_id,
    status_badge,
    when,
)
from .graph import STATUS_STYLE, GraphEdge, GraphNode, render_svg

NAMESPACE_CHOICES_MAX = 50


class NamespaceFilter(admin.SimpleListFilter):
    """The namespaces in use (the first NAMESPACE_CHOICES_MAX, one index lookup each); any
    other one can still be given as ``?namespace=``."""

    title = "namespace"
    parameter_name = "namespace"

    def lookups(self, request, model_admin):
        names = reads.namespaces(NAMESPACE_CHOICES_MAX)
        value = self.value()
        if value and value not in names:
            names.append(value)
        return [(name, name) for name in names]

    def queryset(self, request, queryset):
        value = self.value()
        return queryset.filter(namespace=value) if value else queryset


def payload_summary(payload: Any, width: int = 110) -> str:
    if payload in (None, {}, []):
        return ""
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False, default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


def task_node_label(task: Any) -> str:
    return task.key or f"{task.kind} {short_id(task.pk)[-6:]}"


def attempts_text(task: Any) -> str:
    if task.max_attempts:
        return f"{task.attempt_count} of {task.max_attempts}"
    return f"{task.attempt_count} (no limit)"


def task_status_badge(task: Any):
    """A task's status; ``dead letter`` for a dead-lettered task and ``stuck`` for a queued
    one behind a failed or cancelled required dependency (it can never run as things are)."""
    if task.dead:
        return status_badge("failed", label="dead letter", title="failed, out of attempts")
    if task.status == "queued" and task.failed_dependencies > 0:
        return status_badge(
            "queued",
            label="stuck",
            title="queued behind a failed or cancelled required dependency",
        )
    return status_badge(task.status)


def task_rows(site: str, tasks: list[Any], now, *, unserved: Any = ()) -> list[dict[str, Any]]:
    """Rows of the run page's task table; a ready task of an ``unserved`` kind says in its
    lease column that no running worker handles it."""
    no_worker = mark_safe('<span class="pmcp-lapsed">no running worker</span>')
    rows = []
    for task in tasks:
        waits_for_worker = (
            task.kind in unserved and task.status == "queued" and task.unmet_dependencies == 0
        )
        rows.append(
            {
                "task": id_link(site, "task", task.pk, task.key or short_id(task.pk)),
                "kind": task.kind,
                "status": task_status_badge(task),
                "attempts": attempts_text(task),
                "progress": progress_bar(task.progress),
                "lease": no_worker if waits_for_worker else task.leased_by or "",
                "updated": when(task.updated_at, now, compact=True),
                "error": first_line(task.error, 80),
            }
        )
    return rows


# The task status whose badge colours each MCP task status.
MCP_STATUS_STYLE = {
    "working": "running",
    "input_required": "waiting_input",
    "completed": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
}


def input_request_rows(site: str, requests: list[Any], now) -> list[dict[str, Any]]:
    """Rows of a tool call's input requests: what each task asked the MCP client, and what
    it answered."""
    rows = []
    for row in requests:
        request = row.request if isinstance(row.request, dict) else {}
        if row.answered_at is not None:
            state = status_badge("completed", label="answered")
        elif row.task.status == TaskStatus.WAITING_INPUT:
            state = status_badge("waiting_input", label="waiting")
        else:
            state = status_badge("cancelled", label="not answered", title=row.task.status)
        rows.append(
            {
                "key": row.key,
                "task": id_link(site, "task", row.task_id, row.task.key or short_id(row.task_id)),
                "method": request.get("method", ""),
                "params": json_block(request.get("params"), empty="no params"),
                "asked": when(row.requested_at, now, compact=True),
                "state": state,
                "answer": json_block(row.response) if row.answered_at is not None else EMPTY,
                "answered_by": row.answered_by or "",
                "answered": when(row.answered_at, now, compact=True) if row.answered_at else "",
            }
        )
    return rows


def tool_call_context(site: str, run: Run, now) -> dict[str, Any]:
    """The tool call section of a run's page: the tool, the caller, the MCP task's status and
    the input requests (nothing, and no query, for runs no tool call created)."""
    call = reads.tool_call(run)
    if call is None:
        return {"tool_call": None}
    requests = reads.input_requests(run.pk)
    shown = requests[: reads.INPUT_REQUESTS_SHOWN]
    asks = any(
        row.answered_at is None and row.task.status == TaskStatus.WAITING_INPUT for row in shown
    )
    status = mcp_status(run_status=run.status, task_status=call.task.status, asks_input=asks)
    return {
        "tool_call": {
            "tool": call.tool,
            "caller": call.principal,
            "status": status_badge(MCP_STATUS_STYLE[status], label=status),
            "task": id_link(site, "task", call.task_id, call.task.key or short_id(call.task_id)),
            "created": when(call.created_at, now),
            "ttl": "unlimited" if call.ttl_ms is None else f"{call.ttl_ms} ms",
            # When the client stops seeing it, once the run has ended (expired_calls).
            "expires": "never" if call.expires_at is None else when(call.expires_at, now),
        },
        "input_request_rows": input_request_rows(site, shown, now),
        "input_requests_more": len(requests) > len(shown),
        "input_requests_shown": reads.INPUT_REQUESTS_SHOWN,
    }


def event_rows(site: str, events: list[Any], now) -> list[dict[str, Any]]:
    return [
        {
            "id": id_link(site, "event", event.pk, f"#{event.pk}"),
            "created": when(event.created_at, now, compact=True),
            "type": event.event_type,
            "task": id_link(site, "task", event.task_id) if event.task_id else EMPTY,
            "payload": payload_summary(event.payload),
        }
        for event in events
    ]


@admin.register(Run)
class RunAdmin(ParallelMcpAdmin):
    list_display = (
        "run",
        "namespace",
        "external_id",
        "status_display",
        "tasks_display",
        "progress_display",
        "age_display",
    )
    list_filter = (
        "status",
        NamespaceFilter,
        ("updated_at", admin.DateFieldListFilter),
        ("created_at", admin.DateFieldListFilter),
    )
    search_fields = ("id", "external_id")
    search_help_text = "An exact run id, external id or namespace."
    ordering = ("-updated_at", "-id")
    changelist_defer = ("metadata", "cancel_reason")
    raw_id_fields = ("current_context_snapshot",)
    actions = RUN_ACTIONS
    object_actions = ("cancel_runs", "copy_runs")
    change_form_template = "admin/parallel_mcp/run/change_form.html"

    def get_fieldsets(self, request, obj=None):
        fieldsets: list[tuple[str | None, dict[str, Any]]] = [
            (
                None,
                {
                    "fields": (
                        "id",
                        ("namespace", "external_id"),
                        "status_display",
                        "progress_detail",
                        "counts_detail",
                        "max_parallel_display",
                        ("created_at", "updated_at"),
                        "age",
                    )
                },
            )
        ]
        if obj is not None and obj.cancel_requested_at is not None:
            fieldsets.append(("Cancellation", {"fields": ("cancel_requested_at", "cancel_reason")}))
        fieldsets.append(("Metadata", {"fields": ("metadata_display",)}))
        return fieldsets

    def get_readonly_fields(self, request, obj=None):
        return [
            "id",
            "namespace",
            "external_id",
            "status_display",
            "progress_detail",
            "counts_detail",
            "max_parallel_display",
            "created_at",
            "updated_at",
            "age",
            "cancel_requested_at",
            "cancel_reason",
            "metadata_display",
        ]

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        from django.db.models import Q

        condition = Q(external_id=term) | Q(namespace=term)
        parsed = parse_id(term)
        if parsed is not None:
            condition |= Q(pk=parsed)
        return queryset.filter(condition), False

    def object_action_applies(self, name, obj):
        return run_action_applies(name, obj)

    # -- columns ------------------------------------------------------------------------------
    @admin.display(description="run")
    def run(self, obj):
        return short_id(obj.pk)

    @admin.display(description="status")
    def status_display(self, obj):
        return status_badge(obj.status)

    @admin.display(description="tasks")
    def tasks_display(self, obj):
        return run_counts(obj)

    @admin.display(description="progress")
    def progress_display(self, obj):
        return run_progress_bar(obj)

    @admin.display(description="age")
    def age(self, obj):
        return when(obj.created_at)

    @admin.display(description="age")
    def age_display(self, obj):
        """How old the run is, and when it last changed, in one narrow cell."""
        now = timezone.now()
        return format_html(
            '<time datetime="{}" title="created {}">{}</time><br>'
            '<span class="pmcp-muted pmcp-small">updated {}</span>',
            obj.created_at.isoformat(),
            obj.created_at.isoformat(sep=" ", timespec="seconds"),
            compact_relative(obj.created_at, now).removesuffix(" ago"),
            when(obj.updated_at, now, compact=True),
        )

    # -- detail fields ------------------------------------------------------------------------
    @admin.display(description="progress")
    def progress_detail(self, obj):
        done = obj.tasks_completed + obj.tasks_failed + obj.tasks_cancelled
        return format_html(
            "{} &nbsp; {} of {} task(s) finished", run_progress_bar(obj), done, obj.tasks_total
        )

    @admin.display(description="tasks")
    def counts_detail(self, obj):
        return run_counts(obj, site_name=self.admin_site.name)

    @admin.display(description="max parallel")
    def max_parallel_display(self, obj):
        if obj.max_parallel is None:
            return "no limit"
        now = in_flight(obj._state.db or "default", obj.pk)
        return f"{obj.max_parallel} ({now} leased or running now)"

    @admin.display(description="metadata")
    def metadata_display(self, obj):
        return json_block(obj.metadata)

    # -- detail page --------------------------------------------------------------------------
    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            context.update(self.detail_context(request, obj))
        return super().render_change_form(request, context, add, change, form_url, obj)

    def detail_context(self, request, run: Run) -> dict[str, Any]:
        site = self.admin_site.name
        now = timezone.now()
        chain = reads.snapshot_chain(run)
        graph = reads.graph_data(run)
        svg = None
        if graph.skipped is None:
            nodes = [
                GraphNode(
                    id=str(task.pk),
                    label=task_node_label(task),
                    status=task.status,
                    title=(
                        f"{task.key or task.pk} — {task.kind}\nstatus: {task.status}"
                        + (" (dead-lettered)" if task.dead else "")
                        + f"\nattempts: {attempts_text(task)}"
                        + (f"\nerror: {first_line(task.error, 120)}" if task.error else "")
                        + f"\nid: {task.pk}"
                    ),
                    href=admin_url(site, "task", "change", task.pk),
                    stuck=task.status == "queued" and task.failed_dependencies > 0,
                    dead=task.dead,
                )
                for task in graph.tasks
            ]
            edges = [
                GraphEdge(source=str(dep), target=str(task), required=required)
                for dep, task, required in graph.edges
            ]
            svg = mark_safe(render_svg(nodes, edges))  # built from escaped parts
            preview = graph.tasks[: reads.RUN_TASKS_PREVIEW]
        elif graph.tasks:
            preview = graph.tasks
        else:
            preview = reads.run_tasks_preview(run)
        events = reads.latest_events(run_id=run.pk)
        unserved = unserved_kinds(using=reads.alias(), tasks=preview, now=now)
        return {
            "object_actions": self.available_object_actions(request, run),
            "context_chain": chain,
            "context_current": json_block(chain.current.payload) if chain.current else None,
            "context_rows": [
                {
                    "id": id_link(site, "contextsnapshot", snapshot.pk),
                    "label": snapshot.label or "",
                    "scope": snapshot.scope,
                    "task": id_link(site, "task", snapshot.task_id) if snapshot.task_id else EMPTY,
                    "created": when(snapshot.created_at, now),
                    "current": snapshot.pk == run.current_context_snapshot_id,
                }
                for snapshot in chain.chain
            ],
            "snapshots_url": admin_url(site, "contextsnapshot", "changelist") + f"?run={run.pk}",
            "graph_svg": svg,
            "graph_skipped": graph.skipped,
            "graph_legend": [
                {"status": status, "fill": fill, "stroke": stroke}
                for status, (fill, stroke, _) in STATUS_STYLE.items()
            ],
            "task_rows": task_rows(site, preview, now, unserved=unserved),
            "no_worker_messages": [no_worker_message(kind) for kind in unserved],
            "tasks_shown": len(preview),
            "tasks_total": run.tasks_total,
            "tasks_url": admin_url(site, "task", "changelist") + f"?run={run.pk}",
            "event_rows": event_rows(site, events, now),
            "events_url": admin_url(site, "event", "changelist") + f"?run={run.pk}",
            "latest_events_limit": reads.LATEST_EVENTS,
            "updated_relative": relative(run.updated_at, now),
            **tool_call_context(site, run, now),
        }

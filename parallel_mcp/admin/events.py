"""Read-only admins for the history: events, context snapshots, attempts and leases.

No one can add, change or delete these rows here, superusers included: the event log and the
snapshots are append-only, and attempts and leases belong to the Orchestrator.
"""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Q
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from ..ids import parse_id
from ..models import Attempt, ContextSnapshot, Event, Lease
from . import reads
from .base import ParallelMcpAdmin, RunIdFilter, TaskIdFilter
from .formatting import EMPTY, first_line, id_link, json_block, status_badge, when
from .runs import payload_summary

# The event types of the contract (docs/events.md), for the filter: no DISTINCT over the table.
EVENT_TYPES = (
    "run.created",
    "run.cancelled",
    "run.status.changed",
    "task.enqueued",
    "task.claimed",
    "task.running",
    "task.lease_heartbeat",
    "task.progress",
    "task.blocked",
    "task.waiting_input",
    "task.input_received",
    "task.resumed",
    "task.completed",
    "task.failed",
    "task.released",
    "task.lease_expired",
    "task.retry_scheduled",
    "task.dead_lettered",
    "task.requeued_from_dlq",
    "task.cancelled",
    "task.requeued",
    "context.snapshot.created",
)


class EventTypeFilter(admin.SimpleListFilter):
    title = "event type"
    parameter_name = "type"

    def lookups(self, request, model_admin):
        return [(name, name) for name in EVENT_TYPES]

    def queryset(self, request, queryset):
        value = self.value()
        return queryset.filter(event_type=value) if value else queryset


class HistoryAdmin(ParallelMcpAdmin):
    """Common columns: links to the run and the task by id (no joins)."""

    ordering = ("-id",)
    list_per_page = 100

    @admin.display(description="run")
    def run_link(self, obj):
        return id_link(self.admin_site.name, "run", obj.run_id)

    @admin.display(description="task")
    def task_link(self, obj):
        return id_link(self.admin_site.name, "task", obj.task_id) if obj.task_id else EMPTY

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        parsed = parse_id(term)
        if parsed is not None:
            return queryset.filter(Q(pk=parsed) | Q(run_id=parsed) | Q(task_id=parsed)), False
        return queryset.none(), False


@admin.register(Event)
class EventAdmin(HistoryAdmin):
    list_display = ("event", "created", "event_type", "run_link", "task_link", "payload_short")
    list_filter = (EventTypeFilter, RunIdFilter, TaskIdFilter)
    search_fields = ("id",)
    search_help_text = "An event number, or a run or task id."
    fields = (
        "id",
        "event_type",
        "created_at",
        "run_link",
        "task_link",
        "attempt_link",
        "payload_display",
    )
    readonly_fields = fields

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip().lstrip("#")
        if not term:
            return queryset, False
        if term.isdigit():
            return queryset.filter(pk=int(term)), False
        parsed = parse_id(term)
        if parsed is not None:
            return queryset.filter(Q(run_id=parsed) | Q(task_id=parsed)), False
        return queryset.filter(event_type=term), False

    @admin.display(description="event")
    def event(self, obj):
        return f"#{obj.pk}"

    @admin.display(description="created")
    def created(self, obj):
        return when(obj.created_at, compact=True)

    @admin.display(description="payload")
    def payload_short(self, obj):
        return format_html('<code class="pmcp-payload">{}</code>', payload_summary(obj.payload))

    @admin.display(description="attempt")
    def attempt_link(self, obj):
        if not obj.attempt_id:
            return EMPTY
        return id_link(self.admin_site.name, "attempt", obj.attempt_id)

    @admin.display(description="payload")
    def payload_display(self, obj):
        return json_block(obj.payload)


@admin.register(ContextSnapshot)
class ContextSnapshotAdmin(HistoryAdmin):
    list_display = ("snapshot", "run_link", "scope", "label", "task_link", "parent", "created")
    list_filter = ("scope", RunIdFilter, TaskIdFilter)
    search_fields = ("id",)
    search_help_text = "A snapshot, run or task id."
    changelist_defer = ("payload",)
    fields = (
        "id",
        "run_link",
        "scope",
        "label",
        "task_link",
        "parent",
        "created_at",
        "current",
        "payload_display",
        "ancestors",
    )
    readonly_fields = fields

    @admin.display(description="snapshot")
    def snapshot(self, obj):
        return obj.label or str(obj.pk)[-12:]

    @admin.display(description="parent")
    def parent(self, obj):
        if obj.parent_snapshot_id is None:
            return EMPTY
        return id_link(self.admin_site.name, "contextsnapshot", obj.parent_snapshot_id)

    @admin.display(description="created")
    def created(self, obj):
        return when(obj.created_at)

    @admin.display(description="current context of its run")
    def current(self, obj):
        return "yes" if obj.run.current_context_snapshot_id == obj.pk else "no"

    @admin.display(description="payload")
    def payload_display(self, obj):
        return json_block(obj.payload)

    @admin.display(description="parent chain")
    def ancestors(self, obj):
        chain, more = reads.snapshot_ancestors(obj)
        if not chain:
            return "none (a root snapshot)"
        site = self.admin_site.name
        rows = format_html_join(
            "",
            '<li>{} {} <span class="pmcp-muted">{}</span></li>',
            (
                (
                    id_link(site, "contextsnapshot", parent.pk),
                    parent.label or "",
                    when(parent.created_at),
                )
                for parent in chain
            ),
        )
        tail = mark_safe("<li>… older snapshots not shown</li>") if more else ""
        return format_html('<ol class="pmcp-chain">{}{}</ol>', rows, tail)


@admin.register(Attempt)
class AttemptAdmin(HistoryAdmin):
    list_display = (
        "attempt",
        "task_link",
        "run_link",
        "worker_id",
        "status_display",
        "leased_at",
        "ended_at",
        "error_line",
    )
    list_filter = ("status", RunIdFilter, TaskIdFilter)
    search_fields = ("id",)
    search_help_text = "An attempt, run or task id."
    changelist_defer = ("output", "metadata")
    fields = (
        "id",
        "task_link",
        "run_link",
        "worker_id",
        "status_display",
        "leased_at",
        "started_at",
        "ended_at",
        "lease_expires_at",
        "error_text",
        "output_display",
        "metadata_display",
    )
    readonly_fields = fields

    @admin.display(description="attempt")
    def attempt(self, obj):
        return str(obj.pk)[-12:]

    @admin.display(description="status")
    def status_display(self, obj):
        return status_badge(obj.status)

    @admin.display(description="error")
    def error_line(self, obj):
        return first_line(obj.error, 80)

    @admin.display(description="error")
    def error_text(self, obj):
        if not obj.error:
            return EMPTY
        return format_html('<pre class="pmcp-error-text">{}</pre>', obj.error)

    @admin.display(description="output")
    def output_display(self, obj):
        return json_block(obj.output)

    @admin.display(description="metadata")
    def metadata_display(self, obj):
        return json_block(obj.metadata)


@admin.register(Lease)
class LeaseAdmin(HistoryAdmin):
    list_display = (
        "lease",
        "task_link",
        "run_link",
        "worker_id",
        "status_display",
        "acquired_at",
        "expires_at",
        "heartbeat_at",
        "released_at",
    )
    list_filter = ("status", RunIdFilter, TaskIdFilter)
    search_fields = ("id",)
    search_help_text = "A lease, run or task id."
    fields = (
        "id",
        "task_link",
        "run_link",
        "attempt_link",
        "worker_id",
        "status_display",
        "acquired_at",
        "expires_at",
        "heartbeat_at",
        "released_at",
        "client_token",
    )
    readonly_fields = fields

    @admin.display(description="lease")
    def lease(self, obj):
        return str(obj.pk)[-12:]

    @admin.display(description="status")
    def status_display(self, obj):
        return status_badge(obj.status)

    @admin.display(description="attempt")
    def attempt_link(self, obj):
        return id_link(self.admin_site.name, "attempt", obj.attempt_id)

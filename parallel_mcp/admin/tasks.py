"""The Task admin: list (with a dead-letter filter) and detail with attempts "n of max", the
next retry, the lease, progress, error, input/output, attempts and leases inline, the task's
dependencies and "why isn't this running?" (``Orchestrator.explain_task``)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import Q
from django.forms.models import BaseInlineFormSet
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import mark_safe

from ..exceptions import ParallelMcpError
from ..ids import parse_id
from ..models import Attempt, Lease, Task
from ..models.tasks import DEAD_LETTERED
from ..states import TERMINAL_TASK_STATUSES
from . import reads
from .actions import TASK_ACTIONS, orchestrator, task_action_applies
from .base import ParallelMcpAdmin, ReadOnlyInline, RunIdFilter
from .formatting import (
    EMPTY,
    admin_url,
    first_line,
    id_link,
    json_block,
    progress_bar,
    short_id,
    status_badge,
    when,
)
from .runs import attempts_text, event_rows, task_status_badge

INLINE_ROWS = 50


class DeadLetterFilter(admin.SimpleListFilter):
    """The dead-letter queue: failed tasks that ran out of attempts (``pmcp_task_dead_idx``)."""

    title = "dead letter"
    parameter_name = "dead"

    def lookups(self, request, model_admin):
        return [("yes", "dead-lettered"), ("no", "not dead-lettered")]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.filter(DEAD_LETTERED)
        if self.value() == "no":
            return queryset.filter(dead=False)
        return queryset


class LatestFirstFormSet(BaseInlineFormSet):
    """An inline formset showing only the newest INLINE_ROWS rows."""

    def get_queryset(self):
        if not hasattr(self, "_latest_rows"):
            self._latest_rows = list(super().get_queryset()[:INLINE_ROWS])
        return self._latest_rows


class AttemptInline(ReadOnlyInline):
    model = Attempt
    formset = LatestFirstFormSet
    fk_name = "task"
    verbose_name_plural = f"attempts (newest first, at most {INLINE_ROWS})"
    ordering = ("-leased_at", "-id")
    fields = ("worker_id", "status", "leased_at", "started_at", "ended_at", "error_line")
    readonly_fields = fields

    @admin.display(description="error")
    def error_line(self, obj):
        return first_line(obj.error, 100)


class LeaseInline(ReadOnlyInline):
    model = Lease
    formset = LatestFirstFormSet
    fk_name = "task"
    verbose_name_plural = f"leases (newest first, at most {INLINE_ROWS})"
    ordering = ("-acquired_at", "-id")
    fields = (
        "worker_id",
        "status",
        "acquired_at",
        "expires_at",
        "heartbeat_at",
        "released_at",
        "client_token",
    )
    readonly_fields = fields


@admin.register(Task)
class TaskAdmin(ParallelMcpAdmin):
    list_display = (
        "task",
        "run_display",
        "kind",
        "status_display",
        "priority",
        "attempts",
        "progress_display",
        "lease_or_retry",
        "error_summary",
    )
    list_filter = ("status", DeadLetterFilter, RunIdFilter)
    list_select_related = ("run",)
    search_fields = ("id", "key", "kind")
    search_help_text = "An exact task id, run id, key or kind."
    ordering = ("-id",)  # ids are time-ordered (UUIDv7): newest first, by the primary key
    changelist_defer = ("input", "output", "metadata", "run__metadata", "run__cancel_reason")
    raw_id_fields = ("run", "context_snapshot")
    actions = TASK_ACTIONS
    object_actions = (
        "retry_tasks_cascade",
        "retry_tasks",
        "requeue_dead_tasks",
        "resume_tasks",
        "expire_leases_now",
        "cancel_tasks",
    )
    inlines = (AttemptInline, LeaseInline)
    change_form_template = "admin/parallel_mcp/task/change_form.html"

    def get_fieldsets(self, request, obj=None):
        if obj is not None and not obj.error:
            return [entry for entry in self.fieldsets if entry[0] != "Error"]
        return self.fieldsets

    fieldsets = (
        (
            None,
            {
                "fields": (
                    "id",
                    "run_detail",
                    ("key", "kind"),
                    "status_display",
                    ("priority", "attempts"),
                    "progress_detail",
                    ("created_at", "updated_at"),
                    ("started_at", "completed_at"),
                )
            },
        ),
        ("Why isn't this running?", {"fields": ("blockers",)}),
        (
            "Retries and timeout",
            {"fields": ("next_retry", "retry_policy", "timeout_display")},
        ),
        ("Lease", {"fields": ("lease_detail",)}),
        ("Error", {"fields": ("error_display",)}),
        ("Input", {"fields": ("input_display",)}),
        ("Output", {"fields": ("output_display",)}),
        ("Metadata", {"fields": ("metadata_display", "context_snapshot_display")}),
    )
    readonly_fields = (
        "id",
        "run_detail",
        "key",
        "kind",
        "status_display",
        "priority",
        "attempts",
        "progress_detail",
        "created_at",
        "updated_at",
        "started_at",
        "completed_at",
        "blockers",
        "next_retry",
        "retry_policy",
        "timeout_display",
        "lease_detail",
        "error_display",
        "input_display",
        "output_display",
        "metadata_display",
        "context_snapshot_display",
    )

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("run")

    def get_list_display(self, request):
        if request.GET.get(DeadLetterFilter.parameter_name) == "yes":
            # The dead-letter view: what failed, why, and when.
            return (
                "task",
                "run_display",
                "kind",
                "attempts",
                "error_summary",
                "dead_since",
                "updated",
            )
        return self.list_display

    def get_ordering(self, request):
        if request.GET.get(DeadLetterFilter.parameter_name) == "yes":
            return ("-updated_at", "-id")  # the partial index of the dead-letter queue
        return self.ordering

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        condition = Q(key=term) | Q(kind=term)
        parsed = parse_id(term)
        if parsed is not None:
            condition = Q(pk=parsed) | Q(run_id=parsed)
        return queryset.filter(condition), False

    def object_action_applies(self, name, obj):
        return task_action_applies(name, obj)

    # -- columns ------------------------------------------------------------------------------
    @admin.display(description="task")
    def task(self, obj):
        return obj.key or short_id(obj.pk)

    @admin.display(description="run")
    def run_display(self, obj):
        run = obj.run
        return format_html(
            '<a class="pmcp-id" href="{}" title="run {} ({}), namespace {}">{}</a>',
            admin_url(self.admin_site.name, "run", "change", obj.run_id),
            obj.run_id,
            run.status,
            run.namespace,
            short_id(obj.run_id),
        )

    @admin.display(description="run")
    def run_detail(self, obj):
        run = obj.run
        return format_html(
            '{} {} <span class="pmcp-muted">namespace {}</span>',
            id_link(self.admin_site.name, "run", obj.run_id),
            status_badge(run.status),
            run.namespace,
        )

    @admin.display(description="dead since")
    def dead_since(self, obj):
        return when(obj.completed_at or obj.updated_at, compact=True)

    @admin.display(description="status")
    def status_display(self, obj):
        return task_status_badge(obj)

    @admin.display(description="attempts")
    def attempts(self, obj):
        return attempts_text(obj)

    @admin.display(description="progress")
    def progress_display(self, obj):
        return progress_bar(obj.progress, message=obj.progress_message)

    @admin.display(description="next retry")
    def next_retry(self, obj):
        if obj.not_before is None:
            return EMPTY
        if obj.not_before <= timezone.now():
            return format_html(
                '{} <span class="pmcp-muted">(due)</span>', when(obj.not_before, compact=True)
            )
        return when(obj.not_before, compact=True)

    @admin.display(description="lease")
    def lease(self, obj):
        if not obj.leased_by:
            return EMPTY
        expired = obj.lease_expires_at is not None and obj.lease_expires_at < timezone.now()
        return format_html(
            '{}<br><span class="pmcp-small {}">{} {}</span>',
            obj.leased_by,
            "pmcp-lapsed" if expired else "pmcp-muted",
            "lapsed" if expired else "until",
            when(obj.lease_expires_at, compact=True),
        )

    @admin.display(description="lease / next retry")
    def lease_or_retry(self, obj):
        """The lease holder and expiry while leased or running; the next retry time while
        queued with a delay (the two never overlap)."""
        if obj.leased_by:
            return self.lease(obj)
        if obj.not_before is not None:
            return format_html("retry {}", self.next_retry(obj))
        return EMPTY

    @admin.display(description="updated")
    def updated(self, obj):
        return when(obj.updated_at, compact=True)

    @admin.display(description="error / failure reason")
    def error_summary(self, obj):
        text = first_line(obj.error, 70)
        return format_html('<span class="pmcp-error">{}</span>', text) if text else ""

    # -- detail fields ------------------------------------------------------------------------
    @admin.display(description="progress")
    def progress_detail(self, obj):
        if obj.progress_message:
            return format_html(
                "{} &nbsp; {}",
                progress_bar(obj.progress, message=obj.progress_message),
                obj.progress_message,
            )
        return progress_bar(obj.progress)

    @admin.display(description="blockers")
    def blockers(self, obj):
        if obj.status in TERMINAL_TASK_STATUSES:
            return format_html(
                "It has finished: {}{}.",
                obj.status,
                " and is in the dead-letter queue" if obj.dead else "",
            )
        try:
            found = orchestrator().explain_task(task_id=obj.pk)
        except ParallelMcpError as exc:
            return format_html('<span class="pmcp-error">{}</span>', exc.message)
        if not found:
            return format_html(
                "Nothing blocks it: the next worker that handles kind <code>{}</code> can "
                "claim it.",
                obj.kind,
            )
        site = self.admin_site.name
        items = []
        for blocker in found:
            extra = ""
            if blocker.task_id is not None:
                extra = format_html(" {}", id_link(site, "task", blocker.task_id))
            if blocker.until is not None:
                extra = format_html("{} ({})", extra, when(blocker.until))
            items.append((blocker.kind, blocker.message, extra))
        return format_html(
            '<ul class="pmcp-blockers">{}</ul>',
            format_html_join(
                "",
                '<li><span class="pmcp-blocker-kind">{}</span> {}{}</li>',
                items,
            ),
        )

    @admin.display(description="retry policy")
    def retry_policy(self, obj):
        if obj.max_attempts is None:
            limit = "no attempt limit: a failure is final unless the worker releases the task"
        else:
            limit = f"at most {obj.max_attempts} attempt(s)"
        if obj.retry_delay_ms:
            delay = f"{obj.retry_delay_ms} ms, {obj.retry_backoff or 'fixed'}"
            if obj.retry_max_delay_ms:
                delay += f", capped at {obj.retry_max_delay_ms} ms"
            return f"{limit}; delay {delay}"
        return f"{limit}; no delay between attempts"

    @admin.display(description="timeout")
    def timeout_display(self, obj):
        return f"{obj.timeout_ms} ms per attempt" if obj.timeout_ms else "none"

    @admin.display(description="lease")
    def lease_detail(self, obj):
        if not obj.leased_by:
            return "Not leased."
        expired = obj.lease_expires_at is not None and obj.lease_expires_at < timezone.now()
        return format_html(
            "held by <strong>{}</strong> under lease {} — {} {}{}",
            obj.leased_by,
            id_link(self.admin_site.name, "lease", obj.lease_id),
            "lapsed" if expired else "expires",
            when(obj.lease_expires_at),
            mark_safe(' <span class="pmcp-lapsed">(not yet expired by the expiry loop)</span>')
            if expired
            else "",
        )

    @admin.display(description="error")
    def error_display(self, obj):
        if not obj.error:
            return EMPTY
        return format_html('<pre class="pmcp-error-text">{}</pre>', obj.error)

    @admin.display(description="input")
    def input_display(self, obj):
        return json_block(obj.input)

    @admin.display(description="output")
    def output_display(self, obj):
        return json_block(obj.output)

    @admin.display(description="metadata")
    def metadata_display(self, obj):
        return json_block(obj.metadata)

    @admin.display(description="context snapshot")
    def context_snapshot_display(self, obj):
        if obj.context_snapshot_id is None:
            return EMPTY
        return id_link(self.admin_site.name, "contextsnapshot", obj.context_snapshot_id)

    # -- detail page --------------------------------------------------------------------------
    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            context.update(self.detail_context(request, obj))
        return super().render_change_form(request, context, add, change, form_url, obj)

    def detail_context(self, request, task: Task) -> dict[str, Any]:
        site = self.admin_site.name
        now = timezone.now()
        deps = reads.task_dependencies(task)

        def dep_row(other: Task, required: bool) -> dict[str, Any]:
            return {
                "task": id_link(site, "task", other.pk, other.key or short_id(other.pk)),
                "kind": other.kind,
                "status": task_status_badge(other),
                "required": "required" if required else "optional",
                "updated": when(other.updated_at, now),
            }

        events = reads.latest_events(task_id=task.pk, limit=10)
        return {
            "object_actions": self.available_object_actions(request, task),
            "upstream_rows": [dep_row(edge.depends_on, edge.required) for edge in deps.upstream],
            "downstream_rows": [dep_row(edge.task, edge.required) for edge in deps.downstream],
            "more_upstream": deps.more_upstream,
            "more_downstream": deps.more_downstream,
            "dependency_limit": reads.DEPENDENCY_PREVIEW,
            "event_rows": event_rows(site, events, now),
            "events_url": admin_url(site, "event", "changelist") + f"?task={task.pk}",
            "run_url": admin_url(site, "run", "change", task.run_id),
        }

"""The worker admin: the worker processes that report their presence (``pmcp_worker``, local or
``--api``), the kinds each handles, and whether it still counts as running. Read-only: rows are
written by the workers themselves (``services.workers``)."""

from __future__ import annotations

from django.contrib import admin
from django.db.models import Prefetch, Q
from django.utils import timezone
from django.utils.html import format_html

from ..models import WorkerProcess, WorkerProcessKind
from .base import ParallelMcpAdmin
from .formatting import status_badge, when


class RunningFilter(admin.SimpleListFilter):
    """Running (the default) or gone: a process that missed three reports in a row."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [("all", "all"), ("gone", "gone")]

    def choices(self, changelist):
        value = self.value()
        yield {
            "selected": value is None,
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "display": "running",
        }
        for lookup, title in self.lookup_choices:
            yield {
                "selected": value == lookup,
                "query_string": changelist.get_query_string({self.parameter_name: lookup}),
                "display": title,
            }

    def queryset(self, request, queryset):
        now = timezone.now()
        if self.value() == "all":
            return queryset
        if self.value() == "gone":
            return queryset.filter(expires_at__lte=now)
        return queryset.filter(expires_at__gt=now)


@admin.register(WorkerProcess)
class WorkerProcessAdmin(ParallelMcpAdmin):
    list_display = (
        "worker_id",
        "state",
        "hostname",
        "pid",
        "concurrency",
        "via",
        "kinds_display",
        "started",
        "last_seen",
    )
    list_display_links = None  # everything is on the list
    list_filter = (RunningFilter,)
    search_fields = ("worker_id", "hostname")
    search_help_text = "A worker id or host name (exact)."
    ordering = ("worker_id", "started_at", "id")

    def get_queryset(self, request):
        kinds = Prefetch("kinds", queryset=WorkerProcessKind.objects.order_by("kind"))
        return super().get_queryset(request).prefetch_related(kinds)

    def get_search_results(self, request, queryset, search_term):
        term = search_term.strip()
        if not term:
            return queryset, False
        return queryset.filter(Q(worker_id=term) | Q(hostname=term)), False

    @admin.display(description="state")
    def state(self, obj):
        if obj.expires_at > timezone.now():
            return status_badge("running")
        return status_badge("cancelled", label="gone", title="missed three reports in a row")

    @admin.display(description="via")
    def via(self, obj):
        return "HTTP API" if obj.remote else "database"

    @admin.display(description="kinds")
    def kinds_display(self, obj):
        return format_html("<code>{}</code>", ", ".join(kind.kind for kind in obj.kinds.all()))

    @admin.display(description="started")
    def started(self, obj):
        return when(obj.started_at, compact=True)

    @admin.display(description="last report")
    def last_seen(self, obj):
        return when(obj.last_seen_at, compact=True)

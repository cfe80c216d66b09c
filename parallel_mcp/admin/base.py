"""Shared admin machinery: a changelist that never counts, read-only permissions, the
``operate_runs`` permission, list filters that take an id, and object actions (buttons on a
detail page that run a changelist action on that one object)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import PAGE_VAR, ChangeList
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import Http404, HttpResponseNotAllowed, HttpResponseRedirect
from django.http.response import HttpResponseBase
from django.urls import path, reverse

from ..actors import acting_as, for_user
from ..ids import parse_id
from ..management.tables import short_id
from . import reads

OPERATE_PERMISSION = "parallel_mcp.operate_runs"


def action_parts(action: Any) -> tuple[Callable[..., Any], str]:
    """(function, description) of a ``get_actions()`` value: an ``Action`` on Django 6.1 (its
    unpacking and indexing are deprecated there), a ``(function, name, description)`` tuple on
    older versions."""
    if isinstance(action, tuple):
        func, _, description = action
        return func, description
    return action.func, action.description


class KnownCountPaginator(Paginator):
    """A paginator for one page already fetched: ``count`` is what is known without a COUNT
    query (the rows up to this page, plus one when another page follows)."""

    def __init__(self, object_list: Any, per_page: int, *, known_count: int) -> None:
        super().__init__(object_list, per_page)
        self._known_count = known_count

    @property
    def count(self) -> int:
        return self._known_count


class NoCountChangeList(ChangeList):
    """A changelist that fetches ``list_per_page + 1`` rows instead of counting.

    Django's changelist runs ``SELECT COUNT(*)`` over the filtered queryset on every page (and
    over the whole table unless ``show_full_result_count = False``); on tables of millions of
    rows that count is the slowest query of the page. Here the page query asks for one row
    more than it shows: that row only says whether a next page exists. Pages are "previous /
    next" links; the total is shown when the last page is reached. "Show all" is off.
    """

    def get_queryset(self, request, exclude_parameters=None):
        queryset = super().get_queryset(request, exclude_parameters)
        deferred = getattr(self.model_admin, "changelist_defer", ())
        return queryset.defer(*deferred) if deferred else queryset

    def get_results(self, request) -> None:
        per_page = self.list_per_page
        if self.page_num < 1:
            raise IncorrectLookupParameters
        offset = (self.page_num - 1) * per_page
        rows = list(self.queryset[offset : offset + per_page + 1])
        has_next = len(rows) > per_page
        rows = rows[:per_page]
        if offset and not rows:
            raise IncorrectLookupParameters  # past the last page: the admin redirects to ?e=1
        seen = offset + len(rows)
        self.result_list = rows
        self.result_count = seen
        self.count_known = not has_next
        self.has_next_page = has_next
        self.has_previous_page = self.page_num > 1
        self.first_row = offset + 1 if rows else 0
        self.last_row = seen
        self.full_result_count = None
        self.show_full_result_count = False
        self.show_admin_actions = True
        self.can_show_all = False
        self.multi_page = has_next or self.page_num > 1
        self.paginator = KnownCountPaginator(rows, per_page, known_count=seen + int(has_next))
        self.next_page_url = self.get_query_string({PAGE_VAR: self.page_num + 1})
        self.previous_page_url = self.get_query_string({PAGE_VAR: self.page_num - 1})
        self.first_page_url = self.get_query_string(remove=[PAGE_VAR])


class ParallelMcpAdmin(admin.ModelAdmin):
    """Base of every parallel_mcp ModelAdmin: reads from ``PARALLEL_MCP["DATABASE_ALIAS"]``,
    no COUNT queries, no facet counts, no sorting by columns that no index serves, and never
    adds, changes or deletes a row (writes go through the Orchestrator, in actions)."""

    show_full_result_count = False
    show_facets = admin.ShowFacets.NEVER
    sortable_by: ClassVar[tuple[str, ...]] = ()
    list_per_page = 50
    actions: list[Any] = []
    changelist_defer: tuple[str, ...] = ()
    # Names of actions offered as buttons on the detail page (when the user may run them).
    object_actions: tuple[str, ...] = ()

    class Media:
        css = {"all": ("parallel_mcp/admin.css",)}
        js = ("parallel_mcp/admin.js",)

    def get_changelist(self, request, **kwargs):
        return NoCountChangeList

    def get_queryset(self, request):
        return super().get_queryset(request).using(reads.alias())

    # -- read only ------------------------------------------------------------------------
    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    # -- operating ------------------------------------------------------------------------
    def has_operate_runs_permission(self, request) -> bool:
        """Whether the user may run actions (cancel, copy, re-execute, requeue, resume,
        expire leases): the ``parallel_mcp.operate_runs`` permission."""
        return request.user.is_active and request.user.has_perm(OPERATE_PERMISSION)

    def get_urls(self):
        info = self.opts.app_label, self.opts.model_name
        return [
            path(
                "<path:object_id>/actions/<str:action>/",
                self.admin_site.admin_view(self.object_action_view),
                name="{}_{}_object_action".format(*info),
            ),
            *super().get_urls(),
        ]

    def change_url(self, pk: Any) -> str:
        info = self.admin_site.name, self.opts.app_label, self.opts.model_name
        return reverse("{}:{}_{}_change".format(*info), args=[pk])

    def available_object_actions(self, request, obj) -> list[dict[str, Any]]:
        """The detail page's action buttons: ``object_actions`` the user may run and that
        apply to ``obj`` (see ``object_action_applies``)."""
        actions = self.get_actions(request)
        info = self.admin_site.name, self.opts.app_label, self.opts.model_name
        buttons = []
        for name in self.object_actions:
            if name not in actions or not self.object_action_applies(name, obj):
                continue
            func, description = action_parts(actions[name])
            buttons.append(
                {
                    "name": name,
                    "label": getattr(func, "button_label", description),
                    "url": reverse("{}:{}_{}_object_action".format(*info), args=[obj.pk, name]),
                    "danger": getattr(func, "danger", False),
                }
            )
        return buttons

    def response_action(self, request, queryset, *args, **kwargs):
        # Actions run as the signed-in user: their events record who acted. (Django 6 passes
        # more arguments than 5.2.)
        with acting_as(for_user(request.user)):
            return super().response_action(request, queryset, *args, **kwargs)

    def object_action_applies(self, name: str, obj: Any) -> bool:
        return True

    def object_action_view(self, request, object_id: str, action: str):
        """POST only: run the changelist action ``action`` on this one object. An action that
        answers with a page (a confirmation or a form) gets it shown; its form posts back here.
        Afterwards, back to the object's page."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        obj = self.get_object(request, unquote(object_id))
        if obj is None:
            raise Http404(f"No {self.opts.verbose_name} with id {object_id!r}.")
        if not self.has_view_permission(request, obj):
            raise PermissionDenied
        actions = self.get_actions(request)
        if action not in self.object_actions or action not in actions:
            raise PermissionDenied  # unknown, or not allowed for this user
        func, _ = action_parts(actions[action])
        queryset = self.get_queryset(request).filter(pk=obj.pk)
        with acting_as(for_user(request.user)):
            response = func(self, request, queryset)
        if isinstance(response, HttpResponseBase):
            return response
        return HttpResponseRedirect(self.change_url(obj.pk))


class ReadOnlyInline(admin.TabularInline):
    """A read-only inline whose visibility follows the parent's view permission."""

    extra = 0
    max_num = 0
    can_delete = False
    show_change_link = True
    template = "admin/parallel_mcp/edit_inline/readonly_tabular.html"

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False

    def has_view_permission(self, request, obj=None) -> bool:
        parent = self.parent_model._meta
        return request.user.has_perm(f"{parent.app_label}.view_{parent.model_name}")


# -- list filters --------------------------------------------------------------------------
class IdFilter(admin.SimpleListFilter):
    """Filter on a foreign key given by id in the query string (``?run=<uuid>``): no list of
    every run is ever loaded. Shown only when active, with a link back to the object."""

    field_name = "run_id"
    model_name = "run"

    def lookups(self, request, model_admin):
        value = self.value()
        if not value:
            return []
        return [(value, f"{self.model_name} {short_id(value)}")]

    def queryset(self, request, queryset):
        value = self.value()
        if not value:
            return queryset
        parsed = parse_id(value)
        if parsed is None:
            raise IncorrectLookupParameters(f"{value!r} is not a valid id.")
        return queryset.filter(**{self.field_name: parsed})


class RunIdFilter(IdFilter):
    title = "run"
    parameter_name = "run"
    field_name = "run_id"
    model_name = "run"


class TaskIdFilter(IdFilter):
    title = "task"
    parameter_name = "task"
    field_name = "task_id"
    model_name = "task"

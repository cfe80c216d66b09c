"""Admin actions. Every one calls the Orchestrator (never updates a row itself), needs the
``parallel_mcp.operate_runs`` permission, reports each selected item's outcome (or its typed
error) and records the user: in the event payload through ``reason="admin: <username>"`` where
the Orchestrator method takes a reason, and in the message and the admin log otherwise.

Destructive actions (cancelling, re-executing) show a confirmation page first; resuming shows
a form to optionally replace the tasks' input.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.template.response import TemplateResponse
from django.utils import timezone
from django.utils.html import format_html

from ..exceptions import ParallelMcpError
from ..models import Run, Task
from ..orchestrator import Orchestrator
from ..states import (
    LEASED_TASK_STATUSES,
    PAUSED_TASK_STATUSES,
    TERMINAL_RUN_STATUSES,
    TERMINAL_TASK_STATUSES,
)
from . import reads
from .formatting import admin_url, first_line, short_id, status_badge, when
from .forms import ReasonForm, ResumeForm

# An action works on at most this many selected rows (each is its own transaction).
MAX_ACTION_ITEMS = 500
# Per-item messages shown before the rest are summed up in one line.
MESSAGE_ITEMS = 20

OPERATE = ["operate_runs"]


def _button(func: Any, label: str, *, danger: bool = False) -> None:
    """How an action appears as a button on a detail page (red when ``danger``)."""
    func.button_label = label
    func.danger = danger


def actor(request) -> str:
    """Who did it, as recorded in event payloads: ``admin: <username>``."""
    return f"admin: {request.user.get_username()}"


def reason_for(request, note: str | None = None) -> str:
    note = (note or "").strip()
    return f"{actor(request)}: {note}" if note else actor(request)


def orchestrator() -> Orchestrator:
    return Orchestrator(using=reads.alias())


class Report:
    """Collects per-item outcomes and sends them as admin messages, one per item (the first
    MESSAGE_ITEMS of each level), then one line for the rest."""

    def __init__(self, modeladmin, request) -> None:
        self.modeladmin = modeladmin
        self.request = request
        self.sent: dict[int, int] = {}
        self.held: dict[int, int] = {}

    def add(self, level: int, message: Any) -> None:
        if self.sent.get(level, 0) < MESSAGE_ITEMS:
            self.modeladmin.message_user(self.request, message, level)
            self.sent[level] = self.sent.get(level, 0) + 1
        else:
            self.held[level] = self.held.get(level, 0) + 1

    def success(self, message: Any) -> None:
        self.add(messages.SUCCESS, message)

    def info(self, message: Any) -> None:
        self.add(messages.INFO, message)

    def warning(self, message: Any) -> None:
        self.add(messages.WARNING, message)

    def error(self, label: str, exc: ParallelMcpError) -> None:
        self.add(messages.ERROR, f"{label}: {exc.message} [{exc.code}]")

    def finish(self) -> None:
        names = {
            messages.SUCCESS: "succeeded",
            messages.INFO: "notes",
            messages.WARNING: "warnings",
            messages.ERROR: "failed",
        }
        for level, count in self.held.items():
            self.modeladmin.message_user(
                self.request, f"… and {count} more ({names.get(level, 'messages')}).", level
            )


def _selection(modeladmin, request, queryset) -> list[Any] | None:
    """The selected rows, oldest first, or None (with an error message) when there are more
    than MAX_ACTION_ITEMS."""
    rows = list(queryset.order_by("created_at", "id")[: MAX_ACTION_ITEMS + 1])
    if len(rows) > MAX_ACTION_ITEMS:
        modeladmin.message_user(
            request,
            f"Select at most {MAX_ACTION_ITEMS} {modeladmin.opts.verbose_name_plural} at a "
            "time; nothing was done.",
            messages.ERROR,
        )
        return None
    return rows


def _confirmed(request) -> bool:
    return request.method == "POST" and request.POST.get("post") == "yes"


def _back_url(modeladmin, request, rows: Sequence[Any]) -> str:
    match = getattr(request, "resolver_match", None)
    if match and match.url_name and match.url_name.endswith("_object_action") and rows:
        return modeladmin.change_url(rows[0].pk)
    return request.get_full_path()


def _intermediate_page(
    modeladmin,
    request,
    rows: Sequence[Any],
    *,
    action: str,
    title: str,
    question: Any,
    columns: Sequence[str],
    cells: Callable[[Any], Sequence[Any]],
    submit: str,
    form: Any = None,
    danger: bool = True,
    notes: Sequence[Any] = (),
    template: str = "admin/parallel_mcp/action_confirmation.html",
) -> TemplateResponse:
    opts = modeladmin.model._meta
    media = modeladmin.media
    if form is not None:
        media = media + form.media
    context = {
        **modeladmin.admin_site.each_context(request),
        "title": title,
        "subtitle": None,
        "opts": opts,
        "app_label": opts.app_label,
        "question": question,
        "notes": notes,
        "columns": columns,
        "rows": [cells(row) for row in rows],
        "count": len(rows),
        "action": action,
        "selected_ids": [str(row.pk) for row in rows],
        "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
        "form": form,
        "submit_label": submit,
        "danger": danger,
        "form_url": request.get_full_path(),
        "back_url": _back_url(modeladmin, request, rows),
        "media": media,
    }
    request.current_app = modeladmin.admin_site.name
    return TemplateResponse(request, template, context)


def _run_label(run: Run) -> str:
    return f"Run {short_id(run.pk)}"


def _task_label(task: Task) -> str:
    return f"Task {task.key or short_id(task.pk)}"


def _run_cells(modeladmin):
    site = modeladmin.admin_site.name

    def cells(run: Run) -> list[Any]:
        return [
            format_html(
                '<a href="{}">{}</a>', admin_url(site, "run", "change", run.pk), short_id(run.pk)
            ),
            run.namespace,
            run.external_id or "-",
            status_badge(run.status),
            f"{run.tasks_active + run.tasks_waiting + run.tasks_stuck} of {run.tasks_total}",
        ]

    return cells


RUN_COLUMNS = ("run", "namespace", "external id", "status", "unfinished tasks")


def _task_cells(modeladmin):
    site = modeladmin.admin_site.name

    def cells(task: Task) -> list[Any]:
        return [
            format_html(
                '<a href="{}">{}</a>',
                admin_url(site, "task", "change", task.pk),
                task.key or short_id(task.pk),
            ),
            task.kind,
            format_html(
                '<a href="{}">{}</a>',
                admin_url(site, "run", "change", task.run_id),
                short_id(task.run_id),
            ),
            status_badge(task.status, label="dead letter" if task.dead else None),
            first_line(task.error, 60) or "-",
        ]

    return cells


TASK_COLUMNS = ("task", "kind", "run", "status", "error")


# -- runs ---------------------------------------------------------------------------------------
@admin.action(description="Cancel selected runs…", permissions=OPERATE)
def cancel_runs(modeladmin, request, queryset):
    runs = _selection(modeladmin, request, queryset)
    if runs is None:
        return None
    form = ReasonForm(request.POST if _confirmed(request) else None)
    if not (_confirmed(request) and form.is_valid()):
        return _intermediate_page(
            modeladmin,
            request,
            runs,
            action="cancel_runs",
            title="Cancel runs",
            question=(
                "Cancel these runs? Every unfinished task is cancelled, and a worker holding a "
                "lease is stopped at its next call. A cancelled run cannot be resumed; “Copy "
                "selected runs” makes a fresh one."
            ),
            columns=RUN_COLUMNS,
            cells=_run_cells(modeladmin),
            submit="Yes, cancel these runs",
            form=form,
        )
    reason = reason_for(request, form.cleaned_data["note"])
    orch = orchestrator()
    report = Report(modeladmin, request)
    for run in runs:
        if run.status in TERMINAL_RUN_STATUSES:
            report.warning(f"{_run_label(run)} is already {run.status}; nothing to cancel.")
            continue
        unfinished = run.tasks_active + run.tasks_waiting + run.tasks_stuck
        try:
            orch.cancel_run(run_id=run.pk, reason=reason)
        except ParallelMcpError as exc:
            report.error(_run_label(run), exc)
            continue
        report.success(
            f"{_run_label(run)} cancelled ({unfinished} unfinished task(s) cancelled; "
            f"reason “{reason}”)."
        )
        modeladmin.log_change(request, run, f"Cancelled the run ({reason}).")
    report.finish()
    return None


_button(cancel_runs, "Cancel run", danger=True)


@admin.action(description="Copy selected runs (fresh tasks, same graph)", permissions=OPERATE)
def copy_runs(modeladmin, request, queryset):
    runs = _selection(modeladmin, request, queryset)
    if runs is None:
        return None
    orch = orchestrator()
    report = Report(modeladmin, request)
    who = actor(request)
    for run in runs:
        try:
            copy = orch.copy_run(run_id=run.pk, reason=reason_for(request))
        except ParallelMcpError as exc:
            report.error(_run_label(run), exc)
            continue
        url = admin_url(modeladmin.admin_site.name, "run", "change", copy.pk)
        report.success(
            format_html(
                '{} copied to <a href="{}">run {}</a> ({} task(s)), by {}.',
                _run_label(run),
                url,
                short_id(copy.pk),
                copy.tasks_total,
                who,
            )
        )
        modeladmin.log_change(request, run, f"Copied to run {copy.pk} ({who}).")
        modeladmin.log_change(request, copy, f"Copied from run {run.pk} ({who}).")
    report.finish()
    return None


_button(copy_runs, "Copy run")


# -- tasks --------------------------------------------------------------------------------------
@admin.action(description="Cancel selected tasks…", permissions=OPERATE)
def cancel_tasks(modeladmin, request, queryset):
    tasks = _selection(modeladmin, request, queryset)
    if tasks is None:
        return None
    form = ReasonForm(request.POST if _confirmed(request) else None)
    if not (_confirmed(request) and form.is_valid()):
        return _intermediate_page(
            modeladmin,
            request,
            tasks,
            action="cancel_tasks",
            title="Cancel tasks",
            question=(
                "Cancel these tasks? A worker holding a task's lease is stopped at its next "
                "call; tasks that depend on a cancelled task cannot run until it is "
                "re-executed."
            ),
            columns=TASK_COLUMNS,
            cells=_task_cells(modeladmin),
            submit="Yes, cancel these tasks",
            form=form,
        )
    reason = reason_for(request, form.cleaned_data["note"])
    orch = orchestrator()
    report = Report(modeladmin, request)
    for task in tasks:
        try:
            orch.cancel_task(task_id=task.pk, reason=reason)
        except ParallelMcpError as exc:
            report.error(_task_label(task), exc)
            continue
        report.success(f"{_task_label(task)} cancelled (was {task.status}).")
        modeladmin.log_change(request, task, f"Cancelled the task ({reason}).")
    report.finish()
    return None


_button(cancel_tasks, "Cancel task", danger=True)


def _retry(modeladmin, request, queryset, *, cascade: bool):
    tasks = _selection(modeladmin, request, queryset)
    if tasks is None:
        return None
    action = "retry_tasks_cascade" if cascade else "retry_tasks"
    form = ReasonForm(request.POST if _confirmed(request) else None)
    if not (_confirmed(request) and form.is_valid()):
        notes: list[Any] = []
        if cascade:
            reach = reads.cascade_preview([task.pk for task in tasks])
            more = "+" if reach.capped else ""
            notes.append(
                f"Their dependents: {reach.finished}{more} finished task(s) will be reset and "
                f"run again; {reach.waiting}{more} unfinished one(s) are left as they are "
                "(they run once their dependencies complete)."
            )
        else:
            notes.append(
                "Only the selected tasks are reset; their finished dependents keep their "
                "results (use “… and their dependents” to re-run those too)."
            )
        return _intermediate_page(
            modeladmin,
            request,
            tasks,
            action=action,
            title="Re-execute tasks" + (" and their dependents" if cascade else ""),
            question=(
                "Re-execute these tasks? Each goes back to queued with its output, error, "
                "progress and attempt count cleared (attempts and events are kept)."
            ),
            notes=notes,
            columns=TASK_COLUMNS,
            cells=_task_cells(modeladmin),
            submit="Yes, re-execute" + (" with dependents" if cascade else ""),
            form=form,
        )
    reason = reason_for(request, form.cleaned_data["note"])
    orch = orchestrator()
    report = Report(modeladmin, request)
    for task in tasks:
        if cascade and task.status in TERMINAL_TASK_STATUSES:
            now_status = (
                Task.objects.using(reads.alias())
                .filter(pk=task.pk)
                .values_list("status", flat=True)
                .first()
            )
            if now_status is not None and now_status not in TERMINAL_TASK_STATUSES:
                report.info(
                    f"{_task_label(task)} was already re-executed by the cascade of an "
                    "earlier selected task."
                )
                continue
        try:
            orch.retry_task(task_id=task.pk, cascade=cascade, reason=reason)
        except ParallelMcpError as exc:
            report.error(_task_label(task), exc)
            continue
        report.success(
            f"{_task_label(task)} re-executed (was {task.status}, now queued"
            + ("; finished dependents reset too)." if cascade else ").")
        )
        modeladmin.log_change(
            request,
            task,
            f"Re-executed{' with dependents' if cascade else ''} ({reason}).",
        )
    report.finish()
    return None


@admin.action(description="Re-execute selected tasks (only them)…", permissions=OPERATE)
def retry_tasks(modeladmin, request, queryset):
    return _retry(modeladmin, request, queryset, cascade=False)


_button(retry_tasks, "Re-execute", danger=True)


@admin.action(description="Re-execute selected tasks and their dependents…", permissions=OPERATE)
def retry_tasks_cascade(modeladmin, request, queryset):
    return _retry(modeladmin, request, queryset, cascade=True)


_button(retry_tasks_cascade, "Re-execute with dependents", danger=True)


@admin.action(description="Requeue selected dead-lettered tasks", permissions=OPERATE)
def requeue_dead_tasks(modeladmin, request, queryset):
    tasks = _selection(modeladmin, request, queryset)
    if tasks is None:
        return None
    reason = reason_for(request)
    orch = orchestrator()
    report = Report(modeladmin, request)
    for task in tasks:
        try:
            orch.requeue_dead_task(task_id=task.pk, reason=reason)
        except ParallelMcpError as exc:
            report.error(_task_label(task), exc)
            continue
        report.success(
            f"{_task_label(task)} requeued from the dead-letter queue (attempts reset; "
            f"last error: {first_line(task.error, 60) or '-'})."
        )
        modeladmin.log_change(request, task, f"Requeued from the dead-letter queue ({reason}).")
    report.finish()
    return None


_button(requeue_dead_tasks, "Requeue from dead letter")


@admin.action(
    description="Resume selected paused tasks (optionally with new input)…", permissions=OPERATE
)
def resume_tasks(modeladmin, request, queryset):
    tasks = _selection(modeladmin, request, queryset)
    if tasks is None:
        return None
    if _confirmed(request):
        form = ResumeForm(request.POST)
    else:
        initial = {}
        if len(tasks) == 1 and tasks[0].input is not None:
            initial["input"] = json.dumps(tasks[0].input, indent=2, sort_keys=True)
        form = ResumeForm(initial=initial)
    if not (_confirmed(request) and form.is_valid()):
        return _intermediate_page(
            modeladmin,
            request,
            tasks,
            action="resume_tasks",
            title="Resume paused tasks",
            question=(
                "Resume these tasks? Each blocked or waiting_input task goes back to the "
                "queue. A task waiting for input usually needs its answer: tick “Replace the "
                "input” and give it."
            ),
            columns=TASK_COLUMNS,
            cells=_task_cells(modeladmin),
            submit="Resume",
            form=form,
            danger=False,
        )
    replace = form.cleaned_data.get("replace_input", False)
    new_input = form.cleaned_data.get("input_value")
    who = actor(request)
    orch = orchestrator()
    report = Report(modeladmin, request)
    for task in tasks:
        try:
            if replace:
                orch.resume_task(task_id=task.pk, input=new_input, reason=reason_for(request))
            else:
                orch.resume_task(task_id=task.pk, reason=reason_for(request))
        except ParallelMcpError as exc:
            report.error(_task_label(task), exc)
            continue
        detail = "with new input" if replace else "input unchanged"
        report.success(f"{_task_label(task)} resumed (was {task.status}; {detail}), by {who}.")
        modeladmin.log_change(request, task, f"Resumed ({detail}; {who}).")
    report.finish()
    return None


_button(resume_tasks, "Resume…")


@admin.action(description="Expire lapsed leases now", permissions=OPERATE)
def expire_leases_now(modeladmin, request, queryset):
    """What ``pmcp_expire_leases --once`` does, now: every lease that has lapsed is expired
    (its task requeued with backoff, or dead-lettered when out of attempts). A lease that is
    still valid is left alone and reported."""
    tasks = _selection(modeladmin, request, queryset)
    if tasks is None:
        return None
    who = actor(request)
    result = orchestrator().expire_leases()
    expired = set(result.expired_task_ids)
    current = {
        row["id"]: row
        for row in Task.objects.using(reads.alias())
        .filter(pk__in=[task.pk for task in tasks])
        .values("id", "status", "leased_by", "lease_expires_at", "dead")
    }
    report = Report(modeladmin, request)
    for task in tasks:
        row = current.get(task.pk)
        if row is None:
            continue
        if task.pk in expired:
            now_status = "dead-lettered" if row["dead"] else row["status"]
            report.success(f"{_task_label(task)}: lease expired by {who}; task now {now_status}.")
            modeladmin.log_change(request, task, f"Expired its lapsed lease ({who}).")
        elif row["status"] in LEASED_TASK_STATUSES:
            report.warning(
                format_html(
                    "{}: the lease held by {} is valid until {}; not expired (cancel the task "
                    "to stop it now).",
                    _task_label(task),
                    row["leased_by"],
                    when(row["lease_expires_at"]),
                )
            )
        else:
            report.info(f"{_task_label(task)}: {row['status']}, holds no lease.")
    others = len(expired - {task.pk for task in tasks})
    if others:
        report.info(f"The sweep also expired {others} other lapsed lease(s), by {who}.")
    if not result.count:
        report.info("No lease had lapsed.")
    report.finish()
    return None


_button(expire_leases_now, "Expire lapsed lease")

RUN_ACTIONS = [cancel_runs, copy_runs]
TASK_ACTIONS = [
    cancel_tasks,
    retry_tasks,
    retry_tasks_cascade,
    requeue_dead_tasks,
    resume_tasks,
    expire_leases_now,
]


def task_action_applies(name: str, task: Task) -> bool:
    """Which buttons a task's detail page shows, by its state."""
    if name == "cancel_tasks":
        return task.status not in TERMINAL_TASK_STATUSES
    if name in ("retry_tasks", "retry_tasks_cascade"):
        return task.status in TERMINAL_TASK_STATUSES
    if name == "requeue_dead_tasks":
        return bool(task.dead)
    if name == "resume_tasks":
        return task.status in PAUSED_TASK_STATUSES
    if name == "expire_leases_now":  # only a lease that has lapsed can be expired
        return (
            task.status in LEASED_TASK_STATUSES
            and task.lease_expires_at is not None
            and task.lease_expires_at < timezone.now()
        )
    return True


def run_action_applies(name: str, run: Run) -> bool:
    if name == "cancel_runs":
        return run.status not in TERMINAL_RUN_STATUSES
    return True

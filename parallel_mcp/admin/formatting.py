"""HTML fragments for the admin: status badges, progress bars, JSON blocks, ids and times.

Everything returns safe HTML built with ``format_html``; every value from the database is
escaped.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from django.urls import reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString, mark_safe
from django.utils.timesince import timesince, timeuntil

from ..management.tables import short_id

__all__ = [
    "EMPTY",
    "JSON_DISPLAY_LIMIT",
    "admin_url",
    "json_block",
    "link",
    "progress_bar",
    "relative",
    "run_counts",
    "run_progress_bar",
    "short_id",
    "status_badge",
    "when",
]

EMPTY = mark_safe('<span class="pmcp-muted">-</span>')
# Larger JSON documents are cut in the page (the full value stays in the database).
JSON_DISPLAY_LIMIT = 100_000

# The buckets of a run's task counters, in display order: (field, label).
RUN_BUCKETS = (
    ("tasks_completed", "completed"),
    ("tasks_failed", "failed"),
    ("tasks_cancelled", "cancelled"),
    ("tasks_active", "active"),
    ("tasks_waiting", "waiting"),
    ("tasks_stuck", "stuck"),
)


def admin_url(site_name: str, model_name: str, view: str, *args: Any) -> str:
    return reverse(f"{site_name}:parallel_mcp_{model_name}_{view}", args=args)


def link(url: str, text: Any, *, title: str | None = None) -> SafeString:
    if title:
        return format_html('<a href="{}" title="{}">{}</a>', url, title, text)
    return format_html('<a href="{}">{}</a>', url, text)


def id_link(site_name: str, model_name: str, pk: Any, text: Any = None) -> SafeString:
    """A link to an object's admin page showing its short id (the full id as a tooltip)."""
    if pk is None:
        return EMPTY
    return format_html(
        '<a class="pmcp-id" href="{}" title="{}">{}</a>',
        admin_url(site_name, model_name, "change", pk),
        str(pk),
        text if text is not None else short_id(pk),
    )


def status_badge(status: str | None, *, label: str | None = None, title: str = "") -> SafeString:
    if not status:
        return EMPTY
    return format_html(
        '<span class="pmcp-badge pmcp-status-{}"{}>{}</span>',
        status,
        format_html(' title="{}"', title) if title else "",
        label or status.replace("_", " "),
    )


def _percent(fraction: float | None) -> int:
    value = min(max(float(fraction or 0.0), 0.0), 1.0)
    return int(value * 100 + 1e-9)


def progress_bar(fraction: float | None, *, message: str | None = None) -> SafeString:
    percent = _percent(fraction)
    return format_html(
        '<span class="pmcp-progress" title="{}"><span class="pmcp-progress-fill" '
        'style="width: {}%"></span></span> <span class="pmcp-progress-text">{}%</span>',
        message or f"{percent}%",
        percent,
        percent,
    )


def run_progress_bar(run: Any) -> SafeString:
    """A bar split into completed / failed / cancelled shares of the run's tasks."""
    total = run.tasks_total or 0
    if not total:
        return format_html(
            '<span class="pmcp-progress" title="no tasks"></span> '
            '<span class="pmcp-progress-text">{}</span>',
            "0%",
        )
    parts = format_html_join(
        "",
        '<span class="pmcp-progress-fill pmcp-fill-{}" style="width: {}%"></span>',
        (
            (label, f"{100 * getattr(run, field) / total:.2f}")
            for field, label in RUN_BUCKETS[:3]
            if getattr(run, field)
        ),
    )
    done = run.tasks_completed + run.tasks_failed + run.tasks_cancelled
    return format_html(
        '<span class="pmcp-progress pmcp-progress-split" title="{} of {} task(s) finished">{}'
        '</span> <span class="pmcp-progress-text">{}%</span>',
        done,
        total,
        parts,
        _percent(run.progress),
    )


def run_counts(run: Any, *, site_name: str | None = None) -> SafeString:
    """``50 tasks: 40 completed 5 failed 5 active`` with coloured chips; zero buckets left out.

    With ``site_name`` each chip links to the run's tasks in that state."""
    chips = []
    for field, label in RUN_BUCKETS:
        value = getattr(run, field)
        if not value:
            continue
        chip = format_html('<span class="pmcp-chip pmcp-chip-{}">{} {}</span>', label, value, label)
        chips.append(chip)
    total = format_html(
        '<span class="pmcp-count-total">{} task{}</span>',
        run.tasks_total,
        "" if run.tasks_total == 1 else "s",
    )
    if site_name is not None:
        total = format_html(
            '<a href="{}?run={}">{}</a>',
            admin_url(site_name, "task", "changelist"),
            run.pk,
            total,
        )
    return format_html('<span class="pmcp-counts">{} {}</span>', total, mark_safe(" ".join(chips)))


def json_block(value: Any, *, empty: str = "null") -> SafeString:
    """Pretty-printed JSON in a scrollable ``<pre>``; very large documents are cut."""
    if value is None:
        return format_html('<pre class="pmcp-json pmcp-muted">{}</pre>', empty)
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
    note = ""
    if len(text) > JSON_DISPLAY_LIMIT:
        note = format_html(
            '<p class="pmcp-muted">Showing the first {} of {} characters.</p>',
            JSON_DISPLAY_LIMIT,
            len(text),
        )
        text = text[:JSON_DISPLAY_LIMIT]
    return format_html('<pre class="pmcp-json">{}</pre>{}', text, note)


def compact_relative(value: datetime | None, now: datetime | None = None) -> str:
    """``12s ago``, ``5m ago``, ``3h ago``, ``4d ago`` / ``in 5m``: for narrow list columns."""
    if value is None:
        return "-"
    now = now or timezone.now()
    seconds = int((value - now).total_seconds())
    size_unit = next(
        (
            (size, unit)
            for size, unit in ((86_400, "d"), (3_600, "h"), (60, "m"))
            if abs(seconds) >= size
        ),
        (1, "s"),
    )
    amount = f"{abs(seconds) // size_unit[0]}{size_unit[1]}"
    return f"in {amount}" if seconds > 0 else f"{amount} ago"


def relative(value: datetime | None, now: datetime | None = None) -> str:
    """``5 minutes ago`` / ``in 3 minutes``; ``-`` for none."""
    if value is None:
        return "-"
    now = now or timezone.now()
    seconds = (value - now).total_seconds()
    if abs(seconds) < 60:
        amount = int(abs(seconds))
        unit = "second" if amount == 1 else "seconds"
        return f"in {amount} {unit}" if seconds > 0 else f"{amount} {unit} ago"
    if value > now:
        return f"in {timeuntil(value, now)}"
    return f"{timesince(value, now)} ago"


def when(
    value: datetime | None, now: datetime | None = None, *, compact: bool = False
) -> SafeString:
    """A relative time with the exact time as a tooltip (``compact``: ``5m ago``)."""
    if value is None:
        return EMPTY
    return format_html(
        '<time datetime="{}" title="{}">{}</time>',
        value.isoformat(),
        value.isoformat(sep=" ", timespec="seconds"),
        compact_relative(value, now) if compact else relative(value, now),
    )


def first_line(text: str | None, width: int = 90) -> str:
    if not text:
        return ""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"

"""Drops the log lines peers write for every task, and keeps their start and stop lines.

The bench measures the queue, not log I/O: parallel_mcp logs nothing per task at WARNING, so
the peers' per-task INFO lines are dropped too (each worker's start line stays: the driver
waits for it).
"""

from __future__ import annotations

import logging

# Structured-log names the peers put on their per-task records (procrastinate's ``action``,
# django-ox's ``event``).
PER_TASK = frozenset(
    {
        # procrastinate
        "loaded_job_info",
        "start_job",
        "job_success",
        "finish_task",
        # django-ox
        "task_claimed",
        "task_started",
        "task_succeeded",
    }
)


class DropPerTask(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        name = getattr(record, "action", None) or getattr(record, "event", None)
        return name not in PER_TASK

"""Parsing and checking command-line values, with one-line errors (CommandError)."""

from __future__ import annotations

import logging
import re
import sys
from datetime import timedelta

from django.core.management.base import CommandError

_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|h|d|w)\s*$")
_UNITS = {
    "ms": timedelta(milliseconds=1),
    "s": timedelta(seconds=1),
    "m": timedelta(minutes=1),
    "h": timedelta(hours=1),
    "d": timedelta(days=1),
    "w": timedelta(weeks=1),
}


def positive_int(value: str | int | None, option: str, *, allow_zero: bool = False) -> int:
    try:
        number = int(str(value).strip())
    except (TypeError, ValueError):
        raise CommandError(f"{option} must be a whole number, got {value!r}") from None
    if number < 0 or (number == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise CommandError(f"{option} must be {bound}, got {number}")
    return number


def duration(value: str, option: str) -> timedelta:
    match = _DURATION.match(value or "")
    if not match:
        raise CommandError(
            f"{option} must be a number with a unit (ms, s, m, h, d, w), e.g. 7d; got {value!r}"
        )
    return int(match.group(1)) * _UNITS[match.group(2)]


def name_list(value: str | None, option: str) -> list[str] | None:
    if value is None:
        return None
    names = [part.strip() for part in value.split(",")]
    if not names or any(not name for name in names):
        raise CommandError(f"{option} must be a comma-separated list without empty items")
    return names


# Loggers whose DEBUG lines are for -v 3 only (the worker's heartbeats).
TRACE_LOGGERS = ("parallel_mcp.worker.trace",)


def configure_logging(verbosity: int) -> None:
    """Log parallel_mcp to stderr (stdout stays for command output): -v 0 warnings, 1 info,
    2 debug (a line per task event), 3 debug with the trace loggers (heartbeats)."""
    level = {0: logging.WARNING, 1: logging.INFO}.get(verbosity, logging.DEBUG)
    logger = logging.getLogger("parallel_mcp")
    # Only when the project's LOGGING gives these records nowhere to go.
    if not logger.hasHandlers():
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level)
    for name in TRACE_LOGGERS:
        logging.getLogger(name).setLevel(
            logging.DEBUG if verbosity >= 3 else max(level, logging.INFO)
        )

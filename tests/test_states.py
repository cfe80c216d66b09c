"""The pure rules in parallel_mcp.states: transitions, run-status derivation, backoff."""

from __future__ import annotations

import pytest

from parallel_mcp.exceptions import InvalidTransitionError
from parallel_mcp.states import (
    MAX_RETRY_DELAY_MS,
    TASK_TRANSITIONS,
    TERMINAL_TASK_STATUSES,
    TaskCounts,
    TaskStatus,
    assert_transition,
    can_transition,
    derive_run_status,
    retry_delay_ms,
    sources_of,
)

T = TaskStatus

CONTRACT_TABLE = {
    "queued": {"leased", "cancelled"},
    "leased": {"running", "queued", "blocked", "waiting_input", "completed", "failed", "cancelled"},
    "running": {"queued", "blocked", "waiting_input", "completed", "failed", "cancelled"},
    "blocked": {"queued", "cancelled"},
    "waiting_input": {"queued", "cancelled"},
    "completed": set(),
    "failed": set(),
    "cancelled": set(),
}


def test_transition_table_is_the_contracts():
    assert {str(k): {str(t) for t in v} for k, v in TASK_TRANSITIONS.items()} == CONTRACT_TABLE


@pytest.mark.parametrize("target", list(CONTRACT_TABLE))
def test_the_sources_of_a_target_are_the_tables(target):
    assert {str(s) for s in sources_of(target)} == {
        current for current, targets in CONTRACT_TABLE.items() if target in targets
    }


def test_every_task_that_has_not_ended_may_be_cancelled():
    """cancel_run cancels the tasks sources_of(cancelled) names and moves every open counter
    of the run to cancelled: both hold only while they are every task not yet ended."""
    assert sources_of(T.CANCELLED) == frozenset(TaskStatus) - TERMINAL_TASK_STATUSES


@pytest.mark.parametrize("current", list(CONTRACT_TABLE))
@pytest.mark.parametrize("target", list(CONTRACT_TABLE))
def test_assert_transition_matches_the_table(current, target):
    allowed = target in CONTRACT_TABLE[current]
    assert can_transition(current, target) is allowed
    if allowed:
        assert_transition(current, target)
    else:
        with pytest.raises(InvalidTransitionError) as info:
            assert_transition(current, target, task_id="t1")
        assert info.value.details == {"task_id": "t1", "current": current, "target": target}
        assert type(info.value.details["target"]) is str


@pytest.mark.parametrize(
    ("counts", "cancel_requested", "expected"),
    [
        (TaskCounts(), False, "pending"),
        (TaskCounts(), True, "cancelled"),
        (TaskCounts(total=2, active=2), True, "cancelled"),  # sticky
        (TaskCounts(total=2, cancelled=2), False, "cancelled"),
        (TaskCounts(total=3, completed=2, cancelled=1), False, "completed"),
        (TaskCounts(total=1, completed=1), False, "completed"),
        (TaskCounts(total=3, active=1, waiting=1, failed=1), False, "active"),
        (TaskCounts(total=3, waiting=1, failed=1, completed=1), False, "waiting"),
        (TaskCounts(total=2, failed=1, completed=1), False, "failed"),
        (TaskCounts(total=3, failed=1, stuck=2), False, "failed"),  # bug 3 of the original
        (TaskCounts(total=3, active=1, stuck=2), False, "active"),
        (TaskCounts(total=2, stuck=1, waiting=1), False, "waiting"),
    ],
)
def test_run_status_derivation(counts, cancel_requested, expected):
    assert derive_run_status(cancel_requested=cancel_requested, counts=counts) == expected


@pytest.mark.parametrize(
    ("attempt", "delay", "backoff", "cap", "expected"),
    [
        (1, None, None, None, 0),
        (3, 0, "exponential", None, 0),
        (1, 1000, "fixed", None, 1000),
        (5, 1000, "fixed", None, 1000),
        (5, 1000, None, None, 1000),
        (1, 1000, "exponential", None, 1000),
        (2, 1000, "exponential", None, 2000),
        (4, 1000, "exponential", None, 8000),
        (4, 1000, "exponential", 5000, 5000),
        (4, 1000, "exponential", 0, 8000),  # a cap of 0 means no cap
        (10_000, 1000, "exponential", None, MAX_RETRY_DELAY_MS),  # no overflow
    ],
)
def test_backoff_arithmetic(attempt, delay, backoff, cap, expected):
    assert (
        retry_delay_ms(attempt=attempt, delay_ms=delay, backoff=backoff, max_delay_ms=cap)
        == expected
    )

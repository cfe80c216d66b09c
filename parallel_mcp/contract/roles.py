"""API token roles: the kinds of access each allows, for the HTTP API and the MCP tools alike.

A role narrows what the token's user may do; within it, the user's Django permissions decide
(``view_*`` for reads, ``operate_runs`` for operating, ``work_tasks`` for the worker protocol).
The MCP tools' groups are these kinds of access.
"""

from __future__ import annotations

READ = "read"  # runs, tasks, events, context
OPERATE = "write"  # creating runs and tasks, operating on them, maintenance
WORK = "worker"  # the worker protocol: claim, running, heartbeat, progress, outcomes

ACCESS_KINDS = (READ, WORK, OPERATE)

ROLE_ACCESS: dict[str, frozenset[str]] = {
    "full": frozenset(ACCESS_KINDS),
    "read": frozenset({READ}),
    # A worker's handlers read what they work on (ctx.orchestrator.get_task, list_run_tasks,
    # the run's context), locally as remotely: reads come with the worker protocol.
    "worker": frozenset({WORK, READ}),
}
ROLES = tuple(ROLE_ACCESS)

ROLE_DESCRIPTIONS = {
    "full": "whatever the user's permissions allow",
    "read": "reading only",
    "worker": "the worker protocol and reads",
}

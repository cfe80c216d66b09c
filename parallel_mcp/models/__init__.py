"""Models, one module per aggregate. Only ``parallel_mcp.services`` writes them."""

from .api_tokens import ApiToken
from .attempts import Attempt
from .events import Event
from .leases import Lease
from .run_deltas import RunDelta
from .runs import Run
from .snapshots import ContextSnapshot
from .tasks import Task, TaskBlocker, TaskDependency
from .tokens import ClientTokenRecord
from .tool_calls import InputRequest, ToolCall
from .workers import WorkerProcess, WorkerProcessKind

__all__ = [
    "ApiToken",
    "Attempt",
    "ClientTokenRecord",
    "ContextSnapshot",
    "Event",
    "InputRequest",
    "Lease",
    "Run",
    "RunDelta",
    "Task",
    "TaskBlocker",
    "TaskDependency",
    "ToolCall",
    "WorkerProcess",
    "WorkerProcessKind",
]

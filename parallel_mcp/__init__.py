"""parallel_mcp: the durable orchestration core for parallel work, as a Django app.

Importing this package does not need configured settings; the public names load lazily.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0.dev0"

_LAZY = {
    "Orchestrator": ("parallel_mcp.orchestrator", "Orchestrator"),
    "Claim": ("parallel_mcp.results", "Claim"),
    "ExpireResult": ("parallel_mcp.results", "ExpireResult"),
    "PruneResult": ("parallel_mcp.results", "PruneResult"),
    "EventPage": ("parallel_mcp.results", "EventPage"),
    "Blocker": ("parallel_mcp.results", "Blocker"),
    "handler": ("parallel_mcp.worker.registry", "handler"),
    "Completed": ("parallel_mcp.worker.results", "Completed"),
    "Failed": ("parallel_mcp.worker.results", "Failed"),
    "Paused": ("parallel_mcp.worker.results", "Paused"),
    "Released": ("parallel_mcp.worker.results", "Released"),
    "HandlerContext": ("parallel_mcp.worker.context", "HandlerContext"),
}

__all__ = [
    "Blocker",
    "Claim",
    "Completed",
    "EventPage",
    "ExpireResult",
    "Failed",
    "HandlerContext",
    "Orchestrator",
    "Paused",
    "PruneResult",
    "Released",
    "__version__",
    "handler",
]

if TYPE_CHECKING:  # pragma: no cover
    from .orchestrator import Orchestrator
    from .results import Blocker, Claim, EventPage, ExpireResult, PruneResult
    from .worker.context import HandlerContext
    from .worker.registry import handler
    from .worker.results import Completed, Failed, Paused, Released


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module_name, attribute = _LAZY[name]
        value = getattr(importlib.import_module(module_name), attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'parallel_mcp' has no attribute {name!r}")

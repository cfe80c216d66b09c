"""Running task handlers: the registry, the Worker loop and the lease-expiry loop."""

from .context import HandlerContext
from .registry import HandlerRegistry, autodiscover, handler, registry
from .results import Completed, Failed, Paused, Released

__all__ = [
    "Completed",
    "Failed",
    "HandlerContext",
    "HandlerRegistry",
    "Paused",
    "Released",
    "autodiscover",
    "handler",
    "registry",
]

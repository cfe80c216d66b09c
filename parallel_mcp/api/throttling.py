"""Rate limits per user (or client address when anonymous), in two scopes.

``pmcp`` covers reads and operator calls, ``pmcp_worker`` the worker protocol (a worker fleet
heartbeats a lot). Rates come from DRF's own setting, ``REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]``
(``{"pmcp": "600/minute", "pmcp_worker": "6000/minute"}``); a scope missing there uses the
default below, and ``None`` turns the scope's throttling off.

Failed token authentications have a limit of their own, per ``client_address`` (see
``parallel_mcp.auth_throttle``).
"""

from __future__ import annotations

from typing import Any

from rest_framework.settings import api_settings as drf_settings
from rest_framework.throttling import BaseThrottle, UserRateThrottle

DEFAULT_RATES: dict[str, str | None] = {
    "pmcp": "1200/minute",
    "pmcp_worker": "12000/minute",
}


def client_address(request: Any) -> str:
    """The client's address: ``REMOTE_ADDR``, or DRF's reading of ``X-Forwarded-For`` when
    ``REST_FRAMEWORK["NUM_PROXIES"]`` says how many proxies to trust. (Without NUM_PROXIES DRF
    would take the whole header, which any client can change with every request.)"""
    if drf_settings.NUM_PROXIES is None:
        return str(request.META.get("REMOTE_ADDR") or "unknown")
    return str(BaseThrottle().get_ident(request))


class PmcpRateThrottle(UserRateThrottle):
    """DRF's ``UserRateThrottle`` with its scope taken from the view's ``throttle_scope``."""

    def __init__(self, scope: str = "pmcp") -> None:
        self.scope = scope
        super().__init__()

    def get_rate(self) -> str | None:
        scope = self.scope or ""
        rate = (drf_settings.DEFAULT_THROTTLE_RATES or {}).get(scope)
        return rate if isinstance(rate, str) else DEFAULT_RATES.get(scope)

    def allow_request(self, request: Any, view: Any) -> bool:
        if self.rate is None:
            return True
        return super().allow_request(request, view)

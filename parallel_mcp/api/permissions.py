"""Who may call what.

Every view declares its ``access``:

- ``read``: the model view permissions the view lists in ``view_permissions``
  (``parallel_mcp.view_run``, ``view_task``, ``view_event``, ``view_contextsnapshot``);
- ``operate``: ``parallel_mcp.operate_runs`` (create, enqueue, cancel, copy, retry, requeue,
  resume, append context, maintenance);
- ``work``: ``parallel_mcp.work_tasks`` (the worker protocol);
- ``meta``: any authenticated user (the OpenAPI schema and its Swagger UI page).

A bearer token's ``role`` narrows further, whatever the user's permissions (even a
superuser's), as ``parallel_mcp.contract.roles`` says: ``worker`` tokens reach the worker
protocol and reads, ``read`` tokens reads, ``full`` tokens (and session logins) everything the
user's permissions allow; every role may read the schema.
"""

from __future__ import annotations

from typing import Any

from rest_framework.permissions import BasePermission

from ..contract import roles
from ..contract.roles import OPERATE, READ, WORK
from ..models import ApiToken

META = "meta"  # the schema and its Swagger UI page: any authenticated user

OPERATE_PERMISSION = "parallel_mcp.operate_runs"
WORK_PERMISSION = "parallel_mcp.work_tasks"

ROLE_ACCESS: dict[str, frozenset[str]] = {
    role: access | {META} for role, access in roles.ROLE_ACCESS.items()
}


def token_role(request: Any) -> str:
    """The role of the bearer token of the request; ``full`` for session logins."""
    auth = getattr(request, "auth", None)
    if isinstance(auth, ApiToken):
        return auth.role
    return "full"


def view_access(view: Any, method: str) -> str | None:
    """The view's kind of access for ``method``: ``access`` is one kind, or a dict by method
    (a method the view does not list needs only authentication, and gets 405)."""
    access = getattr(view, "access", None)
    if isinstance(access, dict):
        method = "GET" if method == "HEAD" else method
        return access.get(method, META)
    return access


def required_permissions(view: Any, access: str | None) -> tuple[str, ...]:
    if access == READ:
        return tuple(getattr(view, "view_permissions", ()))
    if access == OPERATE:
        return (OPERATE_PERMISSION,)
    if access == WORK:
        return (WORK_PERMISSION,)
    return ()


class PmcpPermission(BasePermission):
    """Authenticated, the token's role allows the view's kind of access, and the user holds
    the permissions it needs. Unauthenticated requests get 401 (DRF turns a refusal into
    ``NotAuthenticated`` when no authenticator succeeded), the rest 403."""

    message = "You do not have permission to perform this action."
    code = "permission_denied"

    def has_permission(self, request: Any, view: Any) -> bool:
        user = request.user
        if user is None or not user.is_authenticated:
            return False
        access = view_access(view, request.method)
        if access is None:  # a view that forgot to say: nobody
            return False
        role = token_role(request)
        if access not in ROLE_ACCESS.get(role, frozenset()):
            self.message = (
                f"This API token has the role {role!r}, which allows "
                f"{roles.ROLE_DESCRIPTIONS.get(role, 'nothing')}."
            )
            return False
        needed = required_permissions(view, access)
        missing = [perm for perm in needed if not user.has_perm(perm)]
        if missing:
            self.message = f"This needs the permission {', '.join(missing)}."
            return False
        return True

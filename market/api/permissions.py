"""Scopes, roles and object ownership in one place.

Views declare `scopes = {"list": "read", "create": "trade", ...}` by action
and may set `public_read = True` for market data anyone can see. A token
carries its own scopes; a browser session has every scope its role allows.
Every role may hold `tokens` (create and revoke API tokens); a token only ever
mints tokens with a subset of its own scopes, expiring no later than itself, and
revokes only tokens whose every scope it holds (`services.token_create(by=)`,
`services.token_revoke(by=)`).

What a caller sees follows the same scopes: other users' rows need `operate`
(`is_operator`), so an operator's `read` token sees its own account's data, as
the WebSocket `operator` channel already had it.
"""

from __future__ import annotations

from typing import Any

from rest_framework import permissions
from rest_framework.request import Request

from market.models import ApiToken, Role, Scope

ROLE_SCOPES: dict[str, frozenset[str]] = {
    Role.BUYER: frozenset({Scope.READ, Scope.TRADE, Scope.TOKENS}),
    Role.PROVIDER: frozenset({Scope.READ, Scope.TRADE, Scope.PROVIDE, Scope.TOKENS}),
    Role.OPERATOR: frozenset({Scope.READ, Scope.TRADE, Scope.PROVIDE, Scope.OPERATE, Scope.TOKENS}),
}


def credential_scopes(user: Any, token: ApiToken | None) -> frozenset[str]:
    """What `user` may do through `token`, or through a browser session (None): its role's scopes."""
    if not user or not user.is_authenticated:
        return frozenset()
    role_scopes = ROLE_SCOPES[Role.OPERATOR] if user.is_superuser else ROLE_SCOPES.get(user.role, frozenset())
    if token is not None:
        return role_scopes & frozenset(token.scopes)
    return role_scopes


def granted_scopes(request: Request) -> frozenset[str]:
    return credential_scopes(request.user, request_token(request))


def request_token(request: Request) -> ApiToken | None:
    """The API token the request authenticated with; None for a browser session."""
    return request.auth if isinstance(request.auth, ApiToken) else None


def is_operator(request: Request) -> bool:
    """Whether the caller sees every user's data: an operator's session, or a token with `operate`."""
    return Scope.OPERATE in granted_scopes(request)


class ScopedAccess(permissions.BasePermission):
    message = "You are not allowed to do this."

    def has_permission(self, request: Request, view: Any) -> bool:
        action = getattr(view, "action", None) or request.method.lower()
        if getattr(view, "public_read", False) and request.method in permissions.SAFE_METHODS:
            return True
        if not request.user or not request.user.is_authenticated:
            return False
        needed = getattr(view, "scopes", {}).get(action, Scope.READ if request.method in permissions.SAFE_METHODS else Scope.OPERATE)
        if needed in granted_scopes(request):
            return True
        self.message = f"This needs the '{needed}' scope, which your token or role does not have."
        return False

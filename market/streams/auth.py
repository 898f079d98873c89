"""WebSocket authentication: a bearer token in the Authorization header, or the
browser's session. A token can also arrive in the first message (`auth`)."""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from rest_framework.exceptions import AuthenticationFailed

from market.api.auth import token_lookup


@database_sync_to_async
def user_for_token(raw: str) -> tuple[Any, list[str]]:
    """(user, scopes) for a live token; AuthenticationFailed with the reason otherwise."""
    token = token_lookup(raw)
    return token.user, list(token.scopes)


class TokenHeaderMiddleware:
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = dict(scope.get("headers") or [])
        auth = headers.get(b"authorization", b"").decode("latin-1").split()
        scope = dict(scope)
        scope["token_error"] = None
        if len(auth) == 2 and auth[0].lower() == "bearer":
            try:
                scope["user"], scope["token_scopes"] = await user_for_token(auth[1])
            except AuthenticationFailed as exc:
                scope["token_error"] = str(exc.detail)
        return await self.inner(scope, receive, send)


def TokenOrSessionAuthMiddleware(inner: Any) -> Any:  # noqa: N802 - reads like the Channels stacks
    return AuthMiddlewareStack(TokenHeaderMiddleware(inner))

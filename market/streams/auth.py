"""WebSocket authentication: a bearer token in the Authorization header, or the
browser's session. A token can also arrive in the first message (`auth`).

A socket outlives the check at its handshake, so it is asked again: the consumer joins
its token's and its account's groups (`publish.token_group`, `publish.account_group`),
where a revocation or a deactivation is announced, and `credentials_problem` re-reads
the token or account before each private action (an expiry announces nothing)."""

from __future__ import annotations

from typing import Any

from channels.auth import AuthMiddlewareStack
from channels.db import database_sync_to_async
from django.utils import timezone
from rest_framework.exceptions import AuthenticationFailed

from market.api.auth import token_lookup, token_problem
from market.models import ApiToken, User


@database_sync_to_async
def live_token(raw: str) -> ApiToken:
    """The live token for `raw`, its user loaded; AuthenticationFailed with the reason otherwise."""
    return token_lookup(raw)


@database_sync_to_async
def credentials_problem(*, user_id: int, token_id: int | None) -> str | None:
    """Why a socket's token (or, for a session, its account) no longer authenticates; None while it does."""
    if token_id is None:
        return None if User.objects.filter(pk=user_id, is_active=True).exists() else "This account is disabled."
    token = ApiToken.objects.select_related("user").filter(pk=token_id).first()
    if token is None:
        return "Unknown token. It may have been mistyped or deleted."
    return token_problem(token, now=timezone.now())


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
                token = await live_token(auth[1])
            except AuthenticationFailed as exc:
                scope["token_error"] = str(exc.detail)
            else:
                scope["user"], scope["token_scopes"], scope["token"] = token.user, list(token.scopes), token
        return await self.inner(scope, receive, send)


def TokenOrSessionAuthMiddleware(inner: Any) -> Any:  # noqa: N802 - reads like the Channels stacks
    return AuthMiddlewareStack(TokenHeaderMiddleware(inner))

"""Browsers send an Origin header with every WebSocket; a page on another site
must not ride a user's session cookie into our socket. Bots send no Origin and
authenticate with a token, so a missing Origin is allowed."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import validate_host


class OriginCheckMiddleware:
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        origin = dict(scope.get("headers") or []).get(b"origin")
        if origin is not None and not self.allowed(origin.decode("latin-1")):
            return await WebsocketDenier()(scope, receive, send)
        return await self.inner(scope, receive, send)

    @staticmethod
    def allowed(origin: str) -> bool:
        if origin in settings.CSRF_TRUSTED_ORIGINS:
            return True
        host = urlsplit(origin).hostname
        return bool(host) and validate_host(host, settings.ALLOWED_HOSTS)

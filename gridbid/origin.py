"""Browsers send an Origin header with every WebSocket; a page on another site
must not ride a user's session cookie into our socket. Bots send no Origin and
authenticate with a token, so a missing Origin is allowed.

An origin is scheme, host and port, as for Django's CSRF check of forms: a page
served from another port of the same host (another app, a tool on a dev box) or
over another scheme is another site. Only the server's own origin and those
listed in CSRF_TRUSTED_ORIGINS (wildcards such as https://*.example.com too)
may open a socket."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host
from django.utils.http import is_same_domain


class OriginCheckMiddleware:
    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> Any:
        headers = dict(scope.get("headers") or [])
        origin = headers.get(b"origin")
        if origin is not None:
            host = headers.get(b"host", b"").decode("latin-1")
            secure = scope.get("scheme") in ("wss", "https")  # set from X-Forwarded-Proto by uvicorn behind a trusted proxy
            if not self.allowed(origin.decode("latin-1"), host=host, secure=secure):
                return await WebsocketDenier()(scope, receive, send)
        return await self.inner(scope, receive, send)

    @staticmethod
    def allowed(origin: str, *, host: str, secure: bool) -> bool:
        if origin in settings.CSRF_TRUSTED_ORIGINS:
            return True
        try:
            parts = urlsplit(origin)
        except ValueError:  # an unparseable origin (a bad IPv6 literal) is nobody's
            return False
        for trusted in settings.CSRF_TRUSTED_ORIGINS:
            if "*" in trusted:
                pattern = urlsplit(trusted)
                if parts.scheme == pattern.scheme and is_same_domain(parts.netloc, pattern.netloc.lstrip("*")):
                    return True
        domain, _port = split_domain_port(host)
        own = f"{'https' if secure else 'http'}://{host}"
        return bool(domain) and origin == own and validate_host(domain, settings.ALLOWED_HOSTS)

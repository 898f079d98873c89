"""Request hygiene that applies to every page and endpoint."""

from __future__ import annotations

import secrets
from collections.abc import Callable

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse


class RejectNulBytesMiddleware:
    """NUL bytes in a URL or query string are never meaningful, and PostgreSQL
    refuses them in text columns; answer 400 before any view sees them."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if "\x00" in request.path or any("\x00" in k or any("\x00" in v for v in vs) for k, vs in request.GET.lists()):
            message = "The URL contains a NUL byte (%00); remove it."
            if request.path.startswith("/api/"):
                return JsonResponse({"error": {"code": "invalid", "message": message, "fields": {}}}, status=400)
            return HttpResponseBadRequest(message)
        return self.get_response(request)


class ContentSecurityPolicyMiddleware:
    """`Content-Security-Policy` on every response, from `settings.CONTENT_SECURITY_POLICY`
    ({directive: [sources]}). Scripts run only from our origin or with this response's
    nonce (`<script nonce="{{ request.csp_nonce }}">`), so injected markup cannot run
    script. The socket's ws:/wss: origin is added to connect-src: older browsers do not
    count it as 'self'."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        nonce = secrets.token_urlsafe(18)
        request.csp_nonce = nonce  # type: ignore[attr-defined]
        response = self.get_response(request)
        if "Content-Security-Policy" in response:
            return response
        policy = {name: list(sources) for name, sources in settings.CONTENT_SECURITY_POLICY.items()}
        policy.setdefault("script-src", ["'self'"]).append(f"'nonce-{nonce}'")
        try:
            host = request.get_host()
        except DisallowedHost:
            host = ""
        if host:
            policy.setdefault("connect-src", ["'self'"]).extend([f"ws://{host}", f"wss://{host}"])
        response["Content-Security-Policy"] = "; ".join(" ".join([name, *sources]) for name, sources in policy.items())
        return response

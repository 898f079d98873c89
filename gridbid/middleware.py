"""Request hygiene that applies to every page and endpoint."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from typing import Any

from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse

from gridbid import logs


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


def client_address(request: HttpRequest) -> str | None:
    """The address the request came from, for the audit log and anything else that needs
    it: REMOTE_ADDR when it is an IP address, else None (a Unix socket, a test without one)."""
    raw = str(request.META.get("REMOTE_ADDR") or "").strip()
    try:
        return str(ipaddress.ip_address(raw))
    except ValueError:
        return None


def scope_address(scope: Mapping[str, Any]) -> str | None:
    """The address an ASGI connection (a WebSocket) came from, like `client_address`."""
    client = scope.get("client") or ()
    try:
        return str(ipaddress.ip_address(str(client[0]).strip()))
    except (ValueError, IndexError, TypeError):
        return None


class RequestIdMiddleware:
    """Gives every request an id: the client's X-Request-ID when it is sane (1-64 of
    A-Za-z0-9._-), else a new one. It is answered in the X-Request-ID header, carried by
    every log line (gridbid.logs) and by the Celery tasks the request enqueues.

    The id stays bound until the response is closed, not only while the views run:
    Django logs a 4xx or 5xx response after the middleware chain has returned."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        incoming = request.headers.get(logs.REQUEST_ID_HEADER, "")
        rid = incoming if logs.request_id_sane(incoming) else logs.request_id_new()
        request.request_id = rid  # type: ignore[attr-defined]
        logs.request_id.set(rid)
        logs.request_address.set(client_address(request))
        response = self.get_response(request)
        response[logs.REQUEST_ID_HEADER] = rid
        response._resource_closers.append(_unbind)
        return response


def _unbind() -> None:
    # set, not reset: under ASGI the response closes in another context than it was bound in
    logs.request_id.set("")
    logs.request_address.set(None)

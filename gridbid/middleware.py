"""Request hygiene that applies to every page and endpoint."""

from __future__ import annotations

import html
import json
from collections.abc import Callable
from typing import Any

from django.conf import settings
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


class BodySizeLimitMiddleware:
    """ASGI: an HTTP body over DATA_UPLOAD_MAX_MEMORY_SIZE gets a 413 before Django reads it.

    Django's ASGI handler reads the whole body (to disk past 2.5 MiB) before any view or
    middleware runs, and only then, when DRF touches ``request.body``, refuses it with an
    HTML 400. Here a Content-Length over the limit is refused without reading a byte; a
    body without one (chunked) is counted as it arrives and cut off at the limit. API
    paths answer in the API's error shape, pages with a short HTML page.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        limit: int | None = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
        if scope["type"] != "http" or limit is None:
            await self.inner(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length", b"")
        if length.isdigit() and int(length) > limit:  # the server refuses a malformed length itself
            await self.refuse(scope, send, limit)
            return
        received = 0
        over = started = False

        async def counted_receive() -> dict[str, Any]:
            nonlocal received, over
            message: dict[str, Any] = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    over = True  # Django stops reading on a disconnect and answers nothing
                    return {"type": "http.disconnect"}
            return message

        async def tracked_send(message: dict[str, Any]) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        await self.inner(scope, counted_receive, tracked_send)
        if over and not started:
            await self.refuse(scope, send, limit)

    @staticmethod
    async def refuse(scope: dict[str, Any], send: Any, limit: int) -> None:
        from market.api.errors import error_body
        from market.api.parsers import body_too_large_message

        message = body_too_large_message(limit)
        if str(scope.get("path", "")).startswith("/api/"):
            body, content_type = json.dumps(error_body("too_large", message)).encode(), b"application/json"
        else:
            body, content_type = f"<!doctype html><title>Too large</title><h1>413 Too large</h1><p>{html.escape(message)}</p>".encode(), b"text/html; charset=utf-8"
        # Connection: close - the rest of the body is not read, so the connection cannot be reused
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})

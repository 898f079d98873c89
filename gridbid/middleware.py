"""Request hygiene that applies to every page and endpoint."""

from __future__ import annotations

import html
import json
import re
import secrets
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.core.exceptions import DisallowedHost
from django.http import HttpRequest, HttpResponse, HttpResponseBadRequest, JsonResponse

from gridbid import logs
from gridbid.proxies import request_address
from market.api.errors import (
    REDIS_RETRY_AFTER_S,
    REDIS_UNREACHABLE_MESSAGE,
    error_body,
    redis_unreachable,
    redis_unreachable_log,
)
from market.api.parsers import body_too_large_message


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


class RedisUnreachableMiddleware:
    """A view that finds Redis unreachable (the cache behind the markets list and the log-in
    limits, the broker a task is sent to) answers 503 with Retry-After: a short page, or the
    API's error shape on /api/ paths outside DRF's own handler (market.api.errors), instead
    of a 500 that says the server failed. /readyz names Redis meanwhile."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if not redis_unreachable(exception):
            return None
        redis_unreachable_log(exception, request.path)
        response: HttpResponse
        if request.path.startswith("/api/"):
            response = JsonResponse(error_body("unavailable", REDIS_UNREACHABLE_MESSAGE), status=503)
        else:
            page = ("<!doctype html><title>Unavailable</title><h1>503 Service unavailable</h1>"
                    "<p>GridBid cannot reach one of its services right now. Please try again in a few seconds.</p>")
            response = HttpResponse(page, status=503, content_type="text/html; charset=utf-8")
        response["Retry-After"] = str(REDIS_RETRY_AFTER_S)
        return response


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
        logs.request_address.set(request_address(request))
        response = self.get_response(request)
        response[logs.REQUEST_ID_HEADER] = rid
        response._resource_closers.append(_unbind)
        return response


def _unbind() -> None:
    # set, not reset: under ASGI the response closes in another context than it was bound in
    logs.request_id.set("")
    logs.request_address.set(None)


# an agent's upload of one job output file (market.outputs): bounded by OUTPUTS_MAX_BYTES
# instead, and read by the view in chunks (Django spools the body to disk, not memory)
OUTPUT_UPLOAD_PATH = re.compile(r"^/api/v1/agent/jobs/\d+/outputs/")


def body_limit(scope: dict[str, Any]) -> int | None:
    if scope.get("method") == "PUT" and OUTPUT_UPLOAD_PATH.match(str(scope.get("path", ""))):
        return int(settings.OUTPUTS_MAX_BYTES)
    limit: int | None = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    return limit


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
        limit = body_limit(scope) if scope["type"] == "http" else None
        if limit is None:
            await self.inner(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length", b"")
        if length.isascii() and length.isdigit() and int(length) > limit:  # the server refuses a malformed length itself
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
        message = body_too_large_message(limit)
        if str(scope.get("path", "")).startswith("/api/"):
            body, content_type = json.dumps(error_body("too_large", message)).encode(), b"application/json"
        else:
            body, content_type = f"<!doctype html><title>Too large</title><h1>413 Too large</h1><p>{html.escape(message)}</p>".encode(), b"text/html; charset=utf-8"
        # Connection: close - the rest of the body is not read, so the connection cannot be reused
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})


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


class RateLimitHeadersMiddleware:
    """Every throttled API response says where its caller stands (IETF draft
    httpapi-ratelimit-headers): `RateLimit-Limit` requests per window, `RateLimit-Remaining`,
    `RateLimit-Reset` seconds, and `RateLimit-Policy` ("120;w=60"). A 429 says 0 remaining
    and the same wait as its Retry-After. The throttles (market.api.throttles) leave the
    figures on the request."""

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response

    def __call__(self, request: Any) -> Any:
        response = self.get_response(request)
        told = getattr(request, "rate_limit", None)
        if told is not None:
            limit, remaining, reset_s, window_s, _scope = told
            response["RateLimit-Limit"] = str(limit)
            response["RateLimit-Remaining"] = str(remaining)
            response["RateLimit-Reset"] = str(reset_s)
            response["RateLimit-Policy"] = f"{limit};w={window_s}"
        return response


class SyncMiddlewareChainMiddleware:
    """Runs the middleware chain above it in one worker thread per request under ASGI.

    Django's built-in middlewares can run either way; under ASGI (uvicorn, `gridbid up`)
    each then hands its process_request and process_response to a thread and back: 14
    crossings between the event loop and a thread per request, most of the ~1.6 ms of
    CPU an ASGI request costs above the same request under WSGI. Django runs every
    middleware above a sync-only one in sync mode too, so this pass-through, last in
    MIDDLEWARE, makes the chain cross once on the way in and once to the (sync) view.
    """

    sync_capable = True
    async_capable = False

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        return self.get_response(request)

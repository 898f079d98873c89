"""Request hygiene that applies to every page and endpoint."""

from __future__ import annotations

from collections.abc import Callable

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

"""Plain HTTP through the ASGI application `gridbid up` serves (gridbid.asgi), with the
middleware chain run in sync mode (gridbid.middleware.SyncMiddlewareChainMiddleware):
the same answers as through Django's test client, hygiene and security headers included."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from channels.db import database_sync_to_async as sync_to_async

from gridbid.asgi import django_asgi

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def asgi_get(path: str, query: str = "") -> tuple[int, dict[str, str], bytes]:
    """One GET through the ASGI app, as uvicorn would send it: (status, headers, body)."""
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http", "path": path,
             "raw_path": path.encode(), "query_string": query.encode(), "root_path": "", "headers": [(b"host", b"127.0.0.1")],
             "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000)}
    body_sent = asyncio.Event()
    messages: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if not body_sent.is_set():
            body_sent.set()
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.sleep(30)  # the client stays connected; the handler gives up waiting once it has answered
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    await asyncio.wait_for(django_asgi(scope, receive, send), timeout=20)
    start = messages[0]
    headers = {k.decode().lower(): v.decode() for k, v in start["headers"]}
    return start["status"], headers, b"".join(m.get("body", b"") for m in messages[1:])


async def test_markets_through_asgi_match_the_test_client(provider_user: Any, make_offer: Any, anon: Any) -> None:
    await sync_to_async(make_offer)(provider_user, price=2_000_000)
    status, headers, body = await asgi_get("/api/v1/markets/")
    assert status == 200 and headers["content-type"].startswith("application/json")
    assert headers["x-frame-options"] == "DENY" and headers["x-content-type-options"] == "nosniff"
    expected = await sync_to_async(lambda: anon.get("/api/v1/markets/").json())()
    assert json.loads(body) == expected and expected[0]["key"] == "H100-SXM-80GB.us-east"


async def test_a_nul_byte_in_the_query_is_refused_through_asgi() -> None:
    status, _, body = await asgi_get("/api/v1/markets/", "region=eu%00west")
    assert status == 400 and json.loads(body)["error"]["code"] == "invalid"


async def test_pages_and_static_files_are_served_through_asgi() -> None:
    status, headers, body = await asgi_get("/")
    assert status == 200 and b"GPU markets" in body and "csrftoken" not in headers.get("set-cookie", "")
    status, headers, body = await asgi_get("/static/gridbid/app.css")
    assert status == 200 and headers["content-type"].startswith("text/css") and body

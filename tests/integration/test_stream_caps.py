"""WebSockets per client address and per token, on one server process (issue 27, item 3):
500 sockets from one address were all accepted before. One past WS_MAX_PER_ADDRESS or
WS_MAX_PER_TOKEN gets `too_many_connections` and close 4029 (docs/stream.md); closing one
makes room for the next."""

from __future__ import annotations

import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.conf import settings

from gridbid.asgi import application

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def caps(monkeypatch: Any) -> None:
    from dataclasses import replace

    monkeypatch.setattr(settings, "CONFIG", replace(settings.CONFIG, ws_max_per_address=3, ws_max_per_token=2))


async def opened(headers: list[tuple[bytes, bytes]] | None = None, client: tuple[str, int] = ("203.0.113.7", 40000)) -> tuple[WebsocketCommunicator, dict[str, Any]]:
    comm = WebsocketCommunicator(application, "/ws/v1/stream", headers=headers or [])
    comm.scope["client"] = list(client)
    connected, _ = await comm.connect(timeout=5)
    assert connected
    return comm, json.loads(await comm.receive_from(timeout=5))


async def refused(comm: WebsocketCommunicator, first: dict[str, Any]) -> str:
    assert first["type"] == "error" and first["code"] == "too_many_connections", first
    assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": 4029}
    return first["message"]


async def test_one_socket_past_the_per_address_cap_is_closed_with_4029(caps: None) -> None:
    socks = []
    for _ in range(3):
        comm, hello = await opened()
        assert hello["type"] == "welcome"
        socks.append(comm)
    extra, first = await opened()
    message = await refused(extra, first)
    assert "3" in message and "WS_MAX_PER_ADDRESS" in message
    other, hello = await opened(client=("198.51.100.9", 40001))  # another address is not counted
    assert hello["type"] == "welcome"
    await socks.pop().disconnect()
    again, hello = await opened()  # one closed: room for one more
    assert hello["type"] == "welcome"
    for comm in [*socks, other, again]:
        await comm.disconnect()


async def test_one_socket_past_the_per_token_cap_is_closed_with_4029_header_or_auth_message(caps: None, buyer: Any) -> None:
    from market import services

    _, raw = await sync_to_async(services.token_create)(user=buyer, name="bot", scopes=["read"])
    headers = [(b"authorization", f"Bearer {raw}".encode())]
    a, _ = await opened(headers, client=("198.51.100.1", 1))
    b, _ = await opened(headers, client=("198.51.100.2", 2))
    c, first = await opened(headers, client=("198.51.100.3", 3))
    assert "WS_MAX_PER_TOKEN" in await refused(c, first)
    # the same token sent in an auth message after an anonymous connect is counted too
    d, hello = await opened(client=("198.51.100.4", 4))
    assert hello["type"] == "welcome"
    await d.send_json_to({"type": "auth", "token": raw})
    first = json.loads(await d.receive_from(timeout=5))
    assert "WS_MAX_PER_TOKEN" in await refused(d, first)
    await a.disconnect()
    await b.disconnect()

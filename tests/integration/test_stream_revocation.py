"""A WebSocket loses its private channels and order entry the moment its credentials
end: its token revoked (REST), its token past its expiry, or its account deactivated.
It says `not_authenticated` and closes with 4001 (docs/stream.md)."""

from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator
from django.test import Client
from django.utils import timezone

from gridbid.asgi import application
from tests.conftest import bid_body

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def connect(headers: list[tuple[bytes, bytes]]) -> WebsocketCommunicator:
    comm = WebsocketCommunicator(application, "/ws/v1/stream", headers=headers)
    connected, _ = await comm.connect(timeout=5)
    assert connected
    assert json.loads(await comm.receive_from(timeout=5))["type"] == "welcome"
    return comm


def bearer(raw: str) -> list[tuple[bytes, bytes]]:
    return [(b"authorization", f"Bearer {raw}".encode())]


async def recv(comm: WebsocketCommunicator) -> dict[str, Any]:
    return json.loads(await comm.receive_from(timeout=5))


async def subscribed_to_orders(comm: WebsocketCommunicator) -> None:
    await comm.send_json_to({"type": "subscribe", "channel": "orders"})
    assert (await recv(comm))["type"] == "snapshot"


async def shut_out(comm: WebsocketCommunicator, *, timeout: float = 5) -> str:
    """The socket's last words: a not_authenticated error, then close 4001. Returns the message."""
    error = json.loads(await comm.receive_from(timeout=timeout))
    assert error["type"] == "error" and error["code"] == "not_authenticated", error
    close = await comm.receive_output(timeout=5)
    assert close == {"type": "websocket.close", "code": 4001}, close
    return error["message"]


def token_for(user: Any, **kwargs: Any) -> tuple[int, str]:
    from market import services

    token, raw = services.token_create(user=user, name="bot", scopes=["read", "trade"], **kwargs)
    return token.pk, raw


def bids_of(user: Any) -> int:
    from market.models import Bid

    return Bid.objects.filter(buyer=user).count()


async def test_a_token_revoked_over_rest_closes_its_open_socket_at_once(buyer, client_for):
    token_id, raw = await sync_to_async(token_for)(buyer)
    comm = await connect(bearer(raw))
    await subscribed_to_orders(comm)
    admin = await sync_to_async(client_for)(buyer, ["read", "trade", "tokens"])
    response = await sync_to_async(admin.post)(f"/api/v1/tokens/{token_id}/revoke/")
    assert response.status_code == 200, response.content
    assert "revoked" in await shut_out(comm)
    again = WebsocketCommunicator(application, "/ws/v1/stream", headers=bearer(raw))
    assert (await again.connect(timeout=5))[0]
    assert (await recv(again))["code"] == "not_authenticated"
    assert (await again.receive_output(timeout=5))["code"] == 4001


async def test_a_revocation_the_socket_never_heard_of_still_refuses_its_next_order(buyer):
    """The token is revoked behind the announcement's back (a row update, no group message):
    the check before each private action catches it."""
    from market.models import ApiToken

    token_id, raw = await sync_to_async(token_for)(buyer)
    comm = await connect(bearer(raw))
    await sync_to_async(ApiToken.objects.filter(pk=token_id).update)(revoked_at=timezone.now())
    await comm.send_json_to({"type": "place_bid", "client_order_id": "late", "bid": bid_body()})
    assert "revoked" in await shut_out(comm)
    assert await sync_to_async(bids_of)(buyer) == 0


async def test_a_token_past_its_expiry_places_no_bid(buyer):
    from market.models import ApiToken

    token_id, raw = await sync_to_async(token_for)(buyer, expires_at=timezone.now() + timedelta(days=1))
    comm = await connect(bearer(raw))
    await sync_to_async(ApiToken.objects.filter(pk=token_id).update)(expires_at=timezone.now() - timedelta(seconds=1))
    await comm.send_json_to({"type": "place_bid", "client_order_id": "late", "bid": bid_body()})
    assert "expired" in await shut_out(comm)
    assert await sync_to_async(bids_of)(buyer) == 0


async def test_a_socket_closes_by_itself_when_its_token_expires(buyer):
    """No message needed: the consumer holds a timer set to the token's own expiry."""
    _, raw = await sync_to_async(token_for)(buyer, expires_at=timezone.now() + timedelta(seconds=1))
    comm = await connect(bearer(raw))
    await subscribed_to_orders(comm)
    assert "expired" in await shut_out(comm, timeout=15)


async def test_deactivating_an_account_closes_its_token_and_session_sockets(buyer):
    from market import services

    _, raw = await sync_to_async(token_for)(buyer)
    by_token = await connect(bearer(raw))
    browser = Client()
    await sync_to_async(browser.force_login)(buyer)
    by_session = await connect([(b"cookie", f"sessionid={browser.cookies['sessionid'].value}".encode())])
    await subscribed_to_orders(by_token)
    await subscribed_to_orders(by_session)
    await sync_to_async(services.user_deactivate)(user=buyer)
    assert "disabled" in await shut_out(by_token)
    assert "disabled" in await shut_out(by_session)


async def test_a_session_socket_of_a_deactivated_account_places_no_bid(buyer):
    """Deactivated behind the service's back (a row update): the next order still finds out."""
    from market.models import User

    browser = Client()
    await sync_to_async(browser.force_login)(buyer)
    comm = await connect([(b"cookie", f"sessionid={browser.cookies['sessionid'].value}".encode())])
    await sync_to_async(User.objects.filter(pk=buyer.pk).update)(is_active=False)
    await comm.send_json_to({"type": "place_bid", "client_order_id": "late", "bid": bid_body()})
    assert "disabled" in await shut_out(comm)
    assert await sync_to_async(bids_of)(buyer) == 0


async def test_another_token_of_the_same_account_stays_open(buyer, client_for):
    revoked_id, revoked_raw = await sync_to_async(token_for)(buyer)
    _, kept_raw = await sync_to_async(token_for)(buyer)
    revoked, kept = await connect(bearer(revoked_raw)), await connect(bearer(kept_raw))
    admin = await sync_to_async(client_for)(buyer, ["read", "trade", "tokens"])
    assert (await sync_to_async(admin.post)(f"/api/v1/tokens/{revoked_id}/revoke/")).status_code == 200
    await shut_out(revoked)
    await kept.send_json_to({"type": "ping", "ref": 1})
    pong = await recv(kept)
    assert (pong["type"], pong["ref"]) == ("pong", 1)

"""The WebSocket stream, driven through Channels' communicator against the real app
(routing, Origin check, token and session auth) and the database."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from gridbid.asgi import application
from tests.conftest import bid_body

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def connect(token: str | None = None, origin: str | None = None) -> WebsocketCommunicator:
    headers = []
    if token:
        headers.append((b"authorization", f"Bearer {token}".encode()))
    if origin:
        headers.append((b"origin", origin.encode()))
    comm = WebsocketCommunicator(application, "/ws/v1/stream", headers=headers)
    connected, _ = await comm.connect(timeout=5)
    assert connected
    return comm


async def recv(comm: WebsocketCommunicator) -> dict[str, Any]:
    return json.loads(await comm.receive_from(timeout=5))


async def welcome(comm: WebsocketCommunicator) -> dict[str, Any]:
    msg = await recv(comm)
    assert msg["type"] == "welcome"
    return msg


@pytest.fixture
def token_of(client_for):
    def make(user, scopes=None) -> str:
        return client_for(user, scopes).raw_token

    return make


async def test_ping_gets_pong():
    comm = await connect()
    await welcome(comm)
    await comm.send_json_to({"type": "ping", "ref": 7})
    assert await recv(comm) == {"type": "pong", "ref": 7}
    await comm.disconnect()


async def test_book_subscription_gives_a_snapshot_then_sequenced_updates(provider_user, make_offer):
    offer = await sync_to_async(make_offer)(provider_user, price=2_000_000, count=8)
    comm = await connect()
    await welcome(comm)
    await comm.send_json_to({"type": "subscribe", "channel": "book.H100-SXM-80GB.us-east"})
    snap = await recv(comm)
    assert snap["type"] == "snapshot" and snap["data"]["best_ask"] == 2_000_000 and snap["data"]["asks"] == [[2_000_000, 8]]
    from market import services

    await sync_to_async(services.offer_update)(user=provider_user, offer=offer, price=1_900_000)
    update = await recv(comm)
    assert update["type"] == "update" and update["seq"] == snap["seq"] + 1
    assert update["data"]["best_ask"] == 1_900_000
    await comm.disconnect()


async def test_place_and_cancel_bid_over_the_socket_with_acks_and_order_updates(buyer, token_of):
    comm = await connect(await sync_to_async(token_of)(buyer))
    await welcome(comm)
    await comm.send_json_to({"type": "subscribe", "channel": "orders"})
    assert (await recv(comm))["data"] == {"orders": []}
    await comm.send_json_to({"type": "place_bid", "client_order_id": "bot-1", "bid": bid_body()})
    replies = [await recv(comm), await recv(comm)]
    ack = next(r for r in replies if r["type"] == "ack")
    update = next(r for r in replies if r["type"] == "update")
    assert ack["client_order_id"] == "bot-1" and ack["bid"]["state"] == "open"
    assert update["channel"] == "orders" and update["data"]["order"]["client_order_id"] == "bot-1"
    await comm.send_json_to({"type": "cancel_bid", "bid_id": ack["bid"]["id"]})
    replies = [await recv(comm), await recv(comm)]
    assert any(r["type"] == "ack" and r["bid"]["state"] == "cancelled" for r in replies)
    await comm.disconnect()


async def test_invalid_bid_over_the_socket_gets_the_same_field_errors_as_rest(buyer, token_of):
    comm = await connect(await sync_to_async(token_of)(buyer))
    await welcome(comm)
    await comm.send_json_to({"type": "place_bid", "client_order_id": "x", "bid": bid_body(gpus=0, gpu_models=["H9000"])})
    err = await recv(comm)
    assert err["type"] == "error" and err["code"] == "invalid" and "gpus" in err["fields"] and err["ref"] == "x"


async def test_anonymous_and_read_only_clients_cannot_trade_or_read_private_channels(buyer, token_of):
    anon = await connect()
    await welcome(anon)
    await anon.send_json_to({"type": "subscribe", "channel": "orders"})
    assert (await recv(anon))["code"] == "forbidden"
    await anon.send_json_to({"type": "place_bid", "bid": bid_body()})
    assert (await recv(anon))["code"] == "forbidden"
    reader = await connect(await sync_to_async(token_of)(buyer, ["read"]))
    await welcome(reader)
    await reader.send_json_to({"type": "place_bid", "bid": bid_body()})
    assert (await recv(reader))["code"] == "forbidden"


async def test_a_user_never_receives_another_users_orders(buyer, stranger, token_of, make_bid):
    snoop = await connect(await sync_to_async(token_of)(stranger))
    await welcome(snoop)
    await snoop.send_json_to({"type": "subscribe", "channel": "orders"})
    assert (await recv(snoop))["data"] == {"orders": []}
    await sync_to_async(make_bid)(buyer)
    assert await snoop.receive_nothing(timeout=0.5)


async def test_token_in_the_first_message_authenticates(buyer, token_of):
    comm = await connect()
    await welcome(comm)
    await comm.send_json_to({"type": "auth", "token": await sync_to_async(token_of)(buyer)})
    assert (await recv(comm))["type"] == "authenticated"
    await comm.send_json_to({"type": "auth", "token": "gb_nope_nope"})
    assert (await recv(comm))["code"] == "not_authenticated"


async def test_a_bad_token_in_the_header_is_refused_with_a_reason():
    comm = await connect("gb_bad_token")
    assert (await recv(comm))["code"] == "not_authenticated"
    assert (await comm.receive_output(timeout=5))["type"] == "websocket.close"


async def test_a_foreign_origin_is_refused():
    comm = WebsocketCommunicator(application, "/ws/v1/stream", headers=[(b"origin", b"https://evil.example")])
    connected, _ = await comm.connect(timeout=5)
    assert not connected


async def test_malformed_unknown_and_oversized_messages_get_typed_errors():
    comm = await connect()
    await welcome(comm)
    await comm.send_to(text_data="{nope")
    assert (await recv(comm))["code"] == "parse_error"
    await comm.send_json_to({"type": "launch_missiles"})
    assert (await recv(comm))["code"] == "unknown_type"
    await comm.send_json_to({"type": "subscribe", "channel": "book.../../etc"})
    assert (await recv(comm))["code"] == "invalid_channel"
    await comm.send_json_to({"type": "cancel_bid", "bid_id": "1"})
    assert (await recv(comm))["code"] in ("forbidden", "invalid")
    await comm.send_to(text_data=json.dumps({"type": "ping", "pad": "x" * 70_000}))
    assert (await recv(comm))["code"] == "message_too_big"
    assert (await comm.receive_output(timeout=5))["code"] == 1009


async def test_a_flooding_client_is_rate_limited_then_disconnected():
    from market.streams.consumers import RATE_BURST, RATE_STRIKES

    comm = await connect()
    await welcome(comm)
    for _ in range(int(RATE_BURST) + RATE_STRIKES + 5):
        await comm.send_json_to({"type": "ping"})
    codes = []
    while True:
        out = await comm.receive_output(timeout=5)
        if out["type"] == "websocket.close":
            assert out["code"] == 4008
            break
        codes.append(json.loads(out["text"]).get("code"))
    assert "rate_limited" in codes


async def test_round_clearing_publishes_rounds_trades_and_the_buyers_order(buyer, provider_user, token_of, make_offer, make_bid):
    await sync_to_async(make_offer)(provider_user, price=2_000_000)
    comm = await connect(await sync_to_async(token_of)(buyer))
    await welcome(comm)
    for channel in ("rounds", "trades", "orders"):
        await comm.send_json_to({"type": "subscribe", "channel": channel})
        assert (await recv(comm))["type"] == "snapshot"
    await sync_to_async(make_bid)(buyer, gpus=2)
    from market.rounds import round_clear

    await sync_to_async(round_clear)()
    seen: dict[str, list[dict[str, Any]]] = {}
    for _ in range(6):
        try:
            msg = await recv(comm)
        except Exception:
            break
        seen.setdefault(msg["channel"], []).append(msg["data"])
    assert seen["rounds"][0]["round"]["trades"] == 1
    assert seen["trades"][0]["trade"]["gpus"] == 2
    assert any(o["order"]["state"] == "matched" for o in seen["orders"])


async def test_a_client_that_stops_reading_is_cut_off_with_4009_and_nothing_piles_up():
    """A stalled transport (the client's TCP window is full) makes the server's send wait;
    here the consumer's send waits forever, as it would on such a socket."""
    from market.streams.consumers import CLOSE_SLOW, StreamConsumer
    from market.streams.publish import publish

    class StalledTransport(StreamConsumer):
        outbox_limit = 8

        async def send_json(self, data):
            if data.get("type") == "update":
                await asyncio.Event().wait()  # never drains
            await super().send_json(data)

    comm = WebsocketCommunicator(StalledTransport.as_asgi(), "/ws/v1/stream")
    comm.scope["user"] = None
    assert (await comm.connect(timeout=5))[0]
    await welcome(comm)
    await comm.send_json_to({"type": "subscribe", "channel": "rounds"})
    assert (await recv(comm))["type"] == "snapshot"
    for i in range(12):
        await sync_to_async(publish)("rounds", {"round": {"number": i}})
    out = await comm.receive_output(timeout=5)
    assert out == {"type": "websocket.close", "code": CLOSE_SLOW}


async def test_a_jobs_progress_from_heartbeats_reaches_its_buyer_and_nobody_else(buyer, stranger, provider_user, token_of, make_offer, make_bid):
    from market.models import Job
    from market.rounds import round_clear
    from providers.jobs import job_event, machine_heartbeat

    offer = await sync_to_async(make_offer)(provider_user, price=2_000_000)
    await sync_to_async(make_bid)(buyer, gpus=2)
    await sync_to_async(round_clear)()
    job = await sync_to_async(Job.objects.get)()
    mine, theirs = await connect(await sync_to_async(token_of)(buyer)), await connect(await sync_to_async(token_of)(stranger))
    for comm in (mine, theirs):
        await welcome(comm)
        await comm.send_json_to({"type": "subscribe", "channel": "jobs"})
        assert (await recv(comm))["type"] == "snapshot"
    await sync_to_async(job_event)(user=provider_user, job_id=job.pk, event="started")
    await sync_to_async(machine_heartbeat)(user=provider_user, machine_id=offer.machine_id, gpus=[], jobs=[{"job": job.pk, "progress": 0.4}])
    started, progress = (await recv(mine))["data"]["job"], (await recv(mine))["data"]["job"]
    assert (started["state"], progress["progress"], progress["trade_state"]) == ("running", 0.4, "pending")
    assert await theirs.receive_nothing(timeout=0.3)
    await mine.disconnect()
    await theirs.disconnect()

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


async def connect_anonymous(consumer: Any) -> WebsocketCommunicator:
    """An anonymous socket served by `consumer` (a StreamConsumer made quicker or stuck for
    the test), welcomed."""
    comm = WebsocketCommunicator(consumer.as_asgi(), "/ws/v1/stream")
    comm.scope["user"] = None
    assert (await comm.connect(timeout=5))[0]
    await welcome(comm)
    return comm


@pytest.fixture
def token_of(client_for):
    def make(user, scopes=None) -> str:
        return client_for(user, scopes).raw_token

    return make


async def test_ping_gets_pong():
    comm = await connect()
    await welcome(comm)
    await comm.send_json_to({"type": "ping", "ref": 7})
    pong = await recv(comm)
    assert {k: pong[k] for k in ("type", "ref")} == {"type": "pong", "ref": 7} and "time" in pong
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
    assert (await recv(comm))["data"] == {"orders": [], "open_truncated": False}
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
    assert (await recv(snoop))["data"] == {"orders": [], "open_truncated": False}
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
    codes: list[str | None] = []
    close: dict[str, Any] | None = None
    # A flood goes on until it is cut off. The limit is in wall time: a 50 ms pause between
    # two refusals earns a token and starts the strike count over, and a CPU shared with a
    # parallel run pauses that long, so one burst of 65 was not always enough (a flake
    # under xdist on a loaded 2-core box). Bounded: 40 bursts at most.
    for _ in range(40):
        for _ in range(int(RATE_BURST) + RATE_STRIKES + 5):
            await comm.send_json_to({"type": "ping"})
        while close is None and not await comm.receive_nothing(timeout=0.2):
            out = await comm.receive_output(timeout=5)
            if out["type"] == "websocket.close":
                close = out
            else:
                codes.append(json.loads(out["text"]).get("code"))
        if close is not None:
            break
    assert close is not None and close["code"] == 4008, "a client that keeps flooding is disconnected"
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

        async def send_update(self, text):
            await asyncio.Event().wait()  # never drains

    comm = await connect_anonymous(StalledTransport)
    await comm.send_json_to({"type": "subscribe", "channel": "rounds"})
    assert (await recv(comm))["type"] == "snapshot"
    for i in range(12):
        await sync_to_async(publish)("rounds", {"round": {"number": i}})
    out = await comm.receive_output(timeout=5)
    assert out == {"type": "websocket.close", "code": CLOSE_SLOW}


async def test_a_jobs_progress_from_heartbeats_reaches_its_buyer_and_nobody_else(buyer, stranger, provider_user, token_of, make_offer, make_bid):
    from market.jobs import job_event
    from market.models import Job
    from market.rounds import round_clear
    from providers.jobs import machine_heartbeat

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
    await sync_to_async(machine_heartbeat)(user=provider_user, machine_id=offer.machine_id, gpus=[],
                                           jobs=[{"job": job.pk, "progress": 0.4, "log_tail": "epoch 1 loss 0.9\n"}])
    started, progress = (await recv(mine))["data"]["job"], (await recv(mine))["data"]["job"]
    assert (started["state"], progress["progress"], progress["trade_state"]) == ("running", 0.4, "pending")
    assert progress["log_tail"] == "epoch 1 loss 0.9\n", "the log's end, live on the socket (issue 32)"
    assert await theirs.receive_nothing(timeout=0.3)
    await mine.disconnect()
    await theirs.disconnect()


# --- provider and operator channels ---------------------------------------------------------
TELEMETRY = [{"index": 0, "utilisation": 37.0, "memory_used_mib": 1024, "memory_total_mib": 81559, "temperature_c": 46.8, "power_w": 180.0},
             {"index": 1, "utilisation": 91.0, "memory_used_mib": 60000, "memory_total_mib": 81559, "temperature_c": 68.4, "power_w": 610.0}]


async def subscribed(token: str, *channels: str) -> tuple[WebsocketCommunicator, dict[str, dict[str, Any]]]:
    """A connection subscribed to `channels`; returns it and each channel's snapshot data."""
    comm = await connect(token)
    await welcome(comm)
    snaps = {}
    for channel in channels:
        await comm.send_json_to({"type": "subscribe", "channel": channel})
        msg = await recv(comm)
        assert msg["type"] == "snapshot", msg
        snaps[channel] = msg["data"]
    return comm, snaps


async def updates(comm: WebsocketCommunicator, channel: str, n: int) -> list[dict[str, Any]]:
    """The data of the next `n` updates on `channel`, skipping other channels' messages."""
    out = []
    while len(out) < n:
        msg = await recv(comm)
        if msg.get("channel") == channel:
            assert msg["type"] == "update"
            out.append(msg["data"])
    return out


async def test_a_provider_watches_its_machine_come_online_with_per_gpu_telemetry(provider_user, other_provider_user, token_of, make_machine):
    from providers.jobs import machine_heartbeat

    machine = await sync_to_async(make_machine)(provider_user, count=2, name="rack-7")
    mine, snaps = await subscribed(await sync_to_async(token_of)(provider_user), "machines")
    [row] = snaps["machines"]["machines"]
    assert (row["name"], row["state"], row["gpus"], row["telemetry"], row["gpu_util"]) == ("rack-7", "offline", 2, [], None)
    theirs, their_snaps = await subscribed(await sync_to_async(token_of)(other_provider_user), "machines")
    assert their_snaps["machines"] == {"machines": []}

    await sync_to_async(machine_heartbeat)(user=provider_user, machine_id=machine.pk, gpus=TELEMETRY, jobs=[], agent_version="1.0")
    [update] = await updates(mine, "machines", 1)
    m = update["machine"]
    assert (m["id"], m["state"], m["gpu_util"]) == (machine.pk, "online", 64.0)
    assert [g["utilisation"] for g in m["telemetry"]] == [37.0, 91.0] and m["last_heartbeat"]
    assert "history" not in m  # updates carry the point, the snapshot the history
    assert await theirs.receive_nothing(timeout=0.3)

    again, snaps = await subscribed(await sync_to_async(token_of)(provider_user), "machines")
    assert snaps["machines"]["machines"][0]["history"][-1][1] == 64.0
    for comm in (mine, theirs, again):
        await comm.disconnect()


async def test_a_machine_that_goes_quiet_shows_offline_to_its_owner_and_the_operator(provider_user, operator, token_of, make_machine):
    from datetime import timedelta

    from django.utils import timezone

    from providers.models import Machine
    from providers.tasks import machines_mark_offline

    machine = await sync_to_async(make_machine)(provider_user, count=1)
    await sync_to_async(Machine.objects.filter(pk=machine.pk).update)(state="online", last_heartbeat=timezone.now() - timedelta(minutes=5))
    owner, _ = await subscribed(await sync_to_async(token_of)(provider_user), "machines")
    ops, snaps = await subscribed(await sync_to_async(token_of)(operator), "operator")
    assert snaps["operator"]["offline_count"] == 0

    assert await sync_to_async(machines_mark_offline)() == 1
    [update] = await updates(owner, "machines", 1)
    assert update["machine"]["state"] == "offline" and update["machine"]["reliability"] < machine.reliability
    [overview] = await updates(ops, "operator", 1)
    assert overview["offline_count"] == 1 and overview["offline"][0]["name"] == machine.name
    await owner.disconnect()
    await ops.disconnect()


async def test_a_sale_its_jobs_progress_and_the_new_totals_reach_the_provider(buyer, provider_user, other_provider_user, token_of, make_offer, make_bid):
    from market.jobs import job_event
    from market.models import Job
    from market.rounds import round_clear
    from market.streams import snapshots
    from providers.jobs import machine_heartbeat

    offer = await sync_to_async(make_offer)(provider_user, price=2_000_000)
    seller, snaps = await subscribed(await sync_to_async(token_of)(provider_user), "sales", "machines")
    assert snaps["sales"] == {"totals": {"sold": 0, "pending": 0, "trades": 0, "settled": 0, "paid": 0, "held": 0, "free": 0, "withdrawn": 0, "stake": 0}, "sales": []}
    rival, _ = await subscribed(await sync_to_async(token_of)(other_provider_user), "sales")
    await sync_to_async(make_bid)(buyer, gpus=2, duration_s=3600)
    await sync_to_async(round_clear)()

    [sold] = await updates(seller, "sales", 1)
    assert (sold["sale"]["gpus"], sold["sale"]["state"], sold["sale"]["job"]["state"]) == (2, "pending", "assigned")
    assert sold["totals"]["sold"] == sold["sale"]["amount"] == 4_000_000 and sold["totals"]["pending"] == 4_000_000
    # the round's publish builds the sale from the trades it loaded: as the sales list shows it
    assert [sold["sale"]] == await sync_to_async(snapshots.sales_rows)(provider_user.provider.pk)
    [booked] = await updates(seller, "machines", 1)
    assert (booked["machine"]["busy"], booked["machine"]["booked_pct"]) == (2, 25)

    job = await sync_to_async(Job.objects.get)()
    await sync_to_async(job_event)(user=provider_user, job_id=job.pk, event="started")
    await sync_to_async(machine_heartbeat)(user=provider_user, machine_id=offer.machine_id, gpus=[], jobs=[{"job": job.pk, "progress": 0.5}])
    started, progress = await updates(seller, "sales", 2)
    assert started["sale"]["job"]["state"] == "running" and progress["sale"]["job"]["progress"] == 0.5
    assert await rival.receive_nothing(timeout=0.3)
    await seller.disconnect()
    await rival.disconnect()


async def test_the_operator_sees_each_new_round_and_the_settlement_queue(buyer, provider_user, operator, token_of, make_offer, make_bid):
    from ledger.models import Deployment, RecordBatch
    from ledger.services import batch_fail
    from market.rounds import round_clear

    await sync_to_async(make_offer)(provider_user, price=2_000_000)
    ops, snaps = await subscribed(await sync_to_async(token_of)(operator), "operator")
    assert snaps["operator"]["rounds"] == [] and snaps["operator"]["trade_states"] == {}
    await sync_to_async(make_bid)(buyer, gpus=1)
    rnd = await sync_to_async(round_clear)()

    [overview] = await updates(ops, "operator", 1)
    assert overview["rounds"][0]["number"] == rnd.number and overview["rounds"][0]["state"] == "cleared"
    assert overview["rounds"][0]["trades"] == 1 and overview["trade_states"] == {"pending": 1} and overview["job_states"] == {"assigned": 1}

    deployment = await sync_to_async(Deployment.objects.create)(chain_id=31337, market_address="0x" + "1" * 40, token_address="0x" + "2" * 40)
    batch = await sync_to_async(RecordBatch.objects.create)(deployment=deployment, root="0x" + "3" * 64)
    await sync_to_async(batch_fail)(batch=batch, error="reverted: escrow: insufficient")
    [overview] = await updates(ops, "operator", 1)
    assert overview["record_batches"] == {"failed": 1}
    await ops.disconnect()


@pytest.mark.parametrize("channel", ["machines", "sales", "operator"])
async def test_anonymous_clients_are_refused_provider_and_operator_channels(channel):
    comm = await connect()
    await welcome(comm)
    await comm.send_json_to({"type": "subscribe", "channel": channel})
    err = await recv(comm)
    assert (err["type"], err["code"], err["ref"]) == ("error", "forbidden", channel) and "authenticate" in err["message"]
    await comm.disconnect()


@pytest.mark.parametrize("channel", ["machines", "sales"])
async def test_a_buyer_is_refused_a_providers_channels_in_words(buyer, token_of, channel):
    comm = await connect(await sync_to_async(token_of)(buyer))
    await welcome(comm)
    await comm.send_json_to({"type": "subscribe", "channel": channel})
    err = await recv(comm)
    assert err["code"] == "forbidden" and "does not sell GPU time" in err["message"]
    await comm.disconnect()


async def test_a_provider_token_without_read_is_refused_its_machines(provider_user, token_of):
    comm = await connect(await sync_to_async(token_of)(provider_user, ["provide"]))
    await welcome(comm)
    await comm.send_json_to({"type": "subscribe", "channel": "machines"})
    assert (await recv(comm))["code"] == "forbidden"
    await comm.disconnect()


@pytest.mark.parametrize("who", ["buyer", "provider"])
async def test_only_operators_may_watch_the_operator_channel(buyer, provider_user, token_of, who):
    comm = await connect(await sync_to_async(token_of)({"buyer": buyer, "provider": provider_user}[who]))
    await welcome(comm)
    await comm.send_json_to({"type": "subscribe", "channel": "operator"})
    err = await recv(comm)
    assert err["code"] == "forbidden" and "operators only" in err["message"]
    await comm.disconnect()


async def test_an_operator_token_without_the_operate_scope_is_refused_the_operator_channel(operator, token_of):
    comm = await connect(await sync_to_async(token_of)(operator, ["read"]))
    await welcome(comm)
    await comm.send_json_to({"type": "subscribe", "channel": "operator"})
    assert (await recv(comm))["code"] == "forbidden"
    await comm.disconnect()


# --- fan-out (issue 33) -------------------------------------------------------------------


async def test_an_update_published_from_a_worker_thread_reaches_an_idle_socket_at_once():
    """The embedded server publishes from its in-process workers' threads while its event loop
    sleeps. channels' in-memory layer filled the socket's queue from the worker's thread
    without waking the loop: the update waited for the loop's next I/O or timer (here, the
    test's own 5 s timeout)."""
    import threading
    import time

    from market.streams.publish import publish

    comm = await connect()
    await welcome(comm)
    await comm.send_json_to({"type": "subscribe", "channel": "rounds"})
    assert (await recv(comm))["type"] == "snapshot"
    worker = threading.Thread(target=publish, args=("rounds", {"round": {"number": 1}}))
    start = time.monotonic()
    worker.start()
    update = await recv(comm)
    took = time.monotonic() - start
    worker.join(5)
    assert update["type"] == "update" and update["data"] == {"round": {"number": 1}}
    assert took < 1.0, f"the update waited {took:.1f} s for the loop to wake"
    await comm.disconnect()


async def test_a_book_no_round_moved_is_not_sent_again_and_takes_no_sequence_number(provider_user, make_offer):
    """Every round re-sent every active book whole, though almost all were as before."""
    from django.core.cache import cache

    from market.events import BookChanged
    from market.streams import handlers
    from market.streams.publish import publish

    await sync_to_async(cache.clear)()  # what earlier tests sent of the same book
    await sync_to_async(make_offer)(provider_user, price=2_000_000, count=8)  # its book is sent as it commits
    channel = "book.H100-SXM-80GB.us-east"
    comm = await connect()
    await welcome(comm)
    await comm.send_json_to({"type": "subscribe", "channel": channel})
    snap = await recv(comm)
    again = BookChanged(gpu_model="H100-SXM-80GB", region="us-east")
    await sync_to_async(handlers.book_changed)(again)  # as a round that moved nothing in it would
    assert await comm.receive_nothing(timeout=0.3)
    await sync_to_async(make_offer)(provider_user, price=1_900_000, count=2)
    moved = await recv(comm)
    assert moved["seq"] == snap["seq"] + 1 and moved["data"]["best_ask"] == 1_900_000  # no gap for what was not sent
    sent = [await sync_to_async(publish)(channel, {"v": v}, unchanged_key="other") for v in (1, 1, 1, 2)]
    assert sent == [True, False, False, True]
    assert [(await recv(comm))["seq"] for _ in range(2)] == [snap["seq"] + 2, snap["seq"] + 3]
    assert await comm.receive_nothing(timeout=0.3)
    await comm.disconnect()


async def test_an_idle_socket_is_sent_a_heartbeat():
    from market.streams.consumers import StreamConsumer

    class Quick(StreamConsumer):
        heartbeat_s = 0.2

    comm = await connect_anonymous(Quick)
    beat = await recv(comm)
    assert beat["type"] == "heartbeat" and "time" in beat
    await comm.disconnect()


async def test_a_heartbeat_to_a_client_that_has_gone_ends_the_writer_quietly():
    """The server learns a client vanished when a send fails (uvicorn's ClientDisconnected):
    the writer ended with an exception nobody read, logged as 'Task exception was never
    retrieved' with a traceback in the server's log."""
    from uvicorn.protocols.utils import ClientDisconnected

    from market.streams.consumers import StreamConsumer

    class Gone(StreamConsumer):
        heartbeat_s = 0.1
        instance = None

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            Gone.instance = self

        async def send_update(self, text):
            if '"heartbeat"' in text:
                raise ClientDisconnected()
            await super().send_update(text)

    comm = await connect_anonymous(Gone)
    writer = Gone.instance.writer
    await asyncio.wait_for(asyncio.shield(writer), 5)  # ends, and not with the exception
    assert writer.done() and writer.exception() is None
    await comm.disconnect()


async def test_a_client_that_keeps_an_update_waiting_too_long_is_cut_off_with_4009_and_the_others_keep_theirs():
    """A client that does not take what it is sent: the send to it stays blocked past
    slow_after_s, and the next update closes the socket with 4009; a socket beside it gets
    every update, in order."""
    from market.streams.consumers import CLOSE_SLOW, StreamConsumer
    from market.streams.publish import publish

    other = await connect()
    await welcome(other)
    await other.send_json_to({"type": "subscribe", "channel": "rounds"})
    first = (await recv(other))["seq"]

    class Stalled(StreamConsumer):
        slow_after_s = 0.3

        async def send_update(self, text):
            await asyncio.Event().wait()  # never drains

    comm = await connect_anonymous(Stalled)
    await comm.send_json_to({"type": "subscribe", "channel": "rounds"})
    assert (await recv(comm))["type"] == "snapshot"
    await sync_to_async(publish)("rounds", {"round": {"number": 1}})
    assert await comm.receive_nothing(timeout=0.5)  # one update waiting is not yet too slow
    await sync_to_async(publish)("rounds", {"round": {"number": 2}})
    assert await comm.receive_output(timeout=5) == {"type": "websocket.close", "code": CLOSE_SLOW}
    await sync_to_async(publish)("rounds", {"round": {"number": 3}})
    got = [await recv(other) for _ in range(3)]
    assert [(m["seq"], m["data"]["round"]["number"]) for m in got] == [(first + 1, 1), (first + 2, 2), (first + 3, 3)]
    await other.disconnect()


async def test_a_socket_open_past_the_layers_group_expiry_still_gets_its_updates(settings):
    """channels' layers forget a group membership after group_expiry (a day by default): a
    bot connected for longer stopped getting updates, with nothing closed and no gap seen."""
    from market.streams.consumers import StreamConsumer
    from market.streams.publish import publish

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "gridbid.channel_layer.LocalChannelLayer",
                                           "CONFIG": {"capacity": 1000, "group_expiry": 1}}}

    class Renewing(StreamConsumer):
        group_refresh_s = 0.3

    comm = await connect_anonymous(Renewing)
    await comm.send_json_to({"type": "subscribe", "channel": "rounds"})
    snap = await recv(comm)
    await asyncio.sleep(2.5)  # past the membership's expiry: renewed meanwhile
    await sync_to_async(publish)("rounds", {"round": {"number": 1}})
    update = await recv(comm)
    assert update["seq"] == snap["seq"] + 1 and update["data"] == {"round": {"number": 1}}
    await comm.disconnect()


async def test_an_update_published_while_its_snapshot_is_taken_arrives_after_the_snapshot():
    """The snapshot's number is read as the socket joins, and the snapshot is then built: an
    update published meanwhile reached the client before the snapshot, the client took the
    snapshot's lower number as its last, and the next update looked like a gap."""
    from market.streams.consumers import StreamConsumer
    from market.streams.publish import publish

    class SlowSnapshot(StreamConsumer):
        async def _snapshot(self, channel: str, group: str) -> str:
            taken = await super()._snapshot(channel, group)
            await sync_to_async(publish)("rounds", {"round": {"number": 1}})  # while it is built
            await asyncio.sleep(0.2)  # time for the writer to send what is queued
            return taken

    comm = await connect_anonymous(SlowSnapshot)
    await comm.send_json_to({"type": "subscribe", "channel": "rounds"})
    first, second = await recv(comm), await recv(comm)
    assert (first["type"], second["type"]) == ("snapshot", "update")
    assert second["seq"] == first["seq"] + 1 and second["data"] == {"round": {"number": 1}}
    await comm.disconnect()


async def test_updates_the_server_itself_held_up_do_not_cut_off_a_client_that_reads():
    """4009 is for a client that does not read (a send to it stays blocked). Updates queued
    while the server is busy (here: held while another channel's snapshot is taken; at 5,000
    sockets, a connect storm) are the server's delay: the old rule, an update queued longer
    than slow_after_s, closed a third of 5,000 reading sockets during the storm."""
    from market.streams.consumers import StreamConsumer
    from market.streams.publish import publish

    class SlowBookSnapshot(StreamConsumer):
        slow_after_s = 0.3

        async def _snapshot(self, channel: str, group: str) -> str:
            taken = await super()._snapshot(channel, group)
            if channel.startswith("book."):
                for n in (1, 2, 3):  # rounds' updates queue meanwhile, held for the snapshot
                    await sync_to_async(publish)("rounds", {"round": {"number": n}})
                    await asyncio.sleep(0.25)
            return taken

    comm = await connect_anonymous(SlowBookSnapshot)
    await comm.send_json_to({"type": "subscribe", "channel": "rounds"})
    first = await recv(comm)
    await comm.send_json_to({"type": "subscribe", "channel": "book.H100-SXM-80GB.us-east"})
    got = [await recv(comm) for _ in range(4)]
    assert [m["type"] for m in got] == ["snapshot", "update", "update", "update"]
    assert [m["seq"] for m in got[1:]] == [first["seq"] + 1, first["seq"] + 2, first["seq"] + 3]
    await comm.disconnect()


async def test_a_resent_client_order_id_returns_the_bid_it_placed_and_places_no_second(buyer, token_of):
    """A bot that resends place_bid after a disconnect (it never saw the ack) gets its bid
    back, marked duplicate, and the account still holds one bid."""
    from market.models import Bid

    comm = await connect(await sync_to_async(token_of)(buyer))
    await welcome(comm)
    await comm.send_json_to({"type": "place_bid", "client_order_id": "bot-9", "bid": bid_body()})
    first = await recv(comm)
    assert (first["type"], first["duplicate"]) == ("ack", False)
    await comm.disconnect()
    again = await connect(await sync_to_async(token_of)(buyer))
    await welcome(again)
    await again.send_json_to({"type": "place_bid", "client_order_id": "bot-9", "bid": bid_body(gpus=3)})
    second = await recv(again)
    assert (second["type"], second["action"], second["duplicate"]) == ("ack", "place_bid", True)
    assert second["bid"]["id"] == first["bid"]["id"] and second["bid"]["gpus"] == first["bid"]["gpus"]
    assert await sync_to_async(Bid.objects.filter(buyer=buyer).count)() == 1
    await again.disconnect()

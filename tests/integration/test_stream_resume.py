"""Resuming a channel after a gap (issue 34): `subscribe` with `since_seq` replays what the
client missed from the channel's kept history, or says why it cannot and sends a snapshot;
and every frame carries the server's time."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from gridbid.asgi import application

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


async def recv(comm: WebsocketCommunicator) -> dict[str, Any]:
    return json.loads(await comm.receive_from(timeout=5))


async def connected() -> WebsocketCommunicator:
    comm = WebsocketCommunicator(application, "/ws/v1/stream")
    assert (await comm.connect(timeout=5))[0]
    assert (await recv(comm))["type"] == "welcome"
    return comm


async def publish_rounds(*numbers: int) -> None:
    from market.streams.publish import publish

    for n in numbers:
        await sync_to_async(publish)("rounds", {"round": {"number": n}})


async def test_a_client_that_missed_updates_gets_them_replayed_in_order_then_the_live_ones():
    first = await connected()
    await first.send_json_to({"type": "subscribe", "channel": "rounds"})
    held = (await recv(first))["seq"]
    await first.disconnect()  # the bot drops; three rounds go by
    await publish_rounds(1, 2, 3)
    again = await connected()
    await again.send_json_to({"type": "subscribe", "channel": "rounds", "since_seq": held})
    resumed = await recv(again)
    assert {k: resumed[k] for k in ("type", "channel", "since_seq", "replayed", "seq")} == {
        "type": "resumed", "channel": "rounds", "since_seq": held, "replayed": 3, "seq": held + 3}
    replay = [await recv(again) for _ in range(3)]
    assert [(m["type"], m["seq"], m["data"]["round"]["number"]) for m in replay] == [
        ("update", held + 1, 1), ("update", held + 2, 2), ("update", held + 3, 3)]
    await publish_rounds(4)
    live = await recv(again)
    assert (live["seq"], live["data"]["round"]["number"]) == (held + 4, 4)
    await again.disconnect()


async def test_nothing_missed_is_an_empty_resume_and_no_snapshot():
    comm = await connected()
    await comm.send_json_to({"type": "subscribe", "channel": "rounds"})
    held = (await recv(comm))["seq"]
    await comm.send_json_to({"type": "subscribe", "channel": "rounds", "since_seq": held})
    resumed = await recv(comm)
    assert (resumed["type"], resumed["replayed"], resumed["seq"]) == ("resumed", 0, held)
    assert await comm.receive_nothing(timeout=0.3)
    await comm.disconnect()


async def test_a_since_seq_older_than_the_history_says_so_and_sends_a_snapshot(settings):
    from market.streams import hub as hub_module

    comm = await connected()
    await comm.send_json_to({"type": "subscribe", "channel": "rounds"})
    held = (await recv(comm))["seq"]
    await comm.disconnect()
    kept, hub_module.HISTORY_LEN = hub_module.HISTORY_LEN, 3
    try:
        hub_module.hub().histories.pop("pub.rounds", None)
        await publish_rounds(1, 2, 3, 4, 5)  # the history keeps the last 3
    finally:
        hub_module.HISTORY_LEN = kept
    again = await connected()
    await again.send_json_to({"type": "subscribe", "channel": "rounds", "since_seq": held})
    resync = await recv(again)
    assert (resync["type"], resync["since_seq"]) == ("resync", held)
    assert "no longer kept" in resync["reason"]
    snap = await recv(again)
    assert (snap["type"], snap["seq"]) == ("snapshot", held + 5)
    await again.send_json_to({"type": "subscribe", "channel": "rounds", "since_seq": held + 2})  # still kept: 3, 4, 5
    assert (await recv(again))["replayed"] == 3
    await again.disconnect()


async def test_a_since_seq_ahead_of_the_channel_resyncs_with_a_snapshot():
    comm = await connected()
    await comm.send_json_to({"type": "subscribe", "channel": "rounds"})
    held = (await recv(comm))["seq"]
    await comm.send_json_to({"type": "subscribe", "channel": "rounds", "since_seq": held + 10})
    resync = await recv(comm)
    assert resync["type"] == "resync" and "ahead" in resync["reason"]
    assert (await recv(comm))["type"] == "snapshot"
    await comm.disconnect()


@pytest.mark.parametrize("bad", [-1, "12", 1.5, True, [3]])
async def test_a_since_seq_that_is_not_a_whole_number_is_invalid_and_subscribes_nothing(bad):
    from market.streams.hub import hub

    comm = await connected()
    await comm.send_json_to({"type": "subscribe", "channel": "trades", "since_seq": bad})
    error = await recv(comm)
    assert (error["type"], error["code"], list(error["fields"])) == ("error", "invalid", ["since_seq"])
    assert "pub.trades" not in hub().members
    await comm.disconnect()


async def test_every_frame_carries_the_servers_time():
    comm = await connected()
    frames = []
    await comm.send_json_to({"type": "ping", "ref": 1})
    frames.append(await recv(comm))
    await comm.send_json_to({"type": "subscribe", "channel": "rounds"})
    frames.append(await recv(comm))
    await publish_rounds(1)
    frames.append(await recv(comm))
    await comm.send_json_to({"type": "nonsense"})
    frames.append(await recv(comm))
    assert [f["type"] for f in frames] == ["pong", "snapshot", "update", "error"]
    for f in frames:
        stamp = datetime.fromisoformat(f["time"])
        assert stamp.utcoffset() is not None and stamp.utcoffset().total_seconds() == 0, f
    await comm.disconnect()

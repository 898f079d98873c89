"""Cancel-on-disconnect (issue 34): a connection may arm a dead-man switch; when it closes, or
sends nothing for the switch's timeout, its open bids (or, with scope "account", all the
account's) are cancelled."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from asgiref.sync import sync_to_async
from channels.testing import WebsocketCommunicator

from tests.conftest import bid_body
from tests.integration.test_streams import connect, recv, welcome

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.fixture
def token_of(client_for: Any) -> Any:
    def make(user: Any, scopes: list[str] | None = None) -> str:
        return client_for(user, scopes).raw_token

    return make


async def armed(token: str, **switch: Any) -> WebsocketCommunicator:
    comm = await connect(token)
    await welcome(comm)
    await comm.send_json_to({"type": "cancel_on_disconnect", **switch})
    answer = await recv(comm)
    assert (answer["type"], answer["armed"]) == ("cancel_on_disconnect", True), answer
    return comm


async def place(comm: WebsocketCommunicator, ref: str) -> int:
    await comm.send_json_to({"type": "place_bid", "client_order_id": ref, "bid": bid_body()})
    while True:
        msg = await recv(comm)
        if msg["type"] == "ack":
            return int(msg["bid"]["id"])


async def states(*ids: int) -> list[str]:
    from market.models import Bid

    rows = await sync_to_async(lambda: dict(Bid.objects.filter(pk__in=ids).values_list("id", "state")))()
    return [rows[i] for i in ids]


async def test_closing_the_connection_cancels_the_bids_it_placed_and_no_others(buyer, token_of, make_bid):
    token = await sync_to_async(token_of)(buyer)
    elsewhere = (await sync_to_async(make_bid)(buyer)).pk  # placed over REST: not this connection's
    comm = await armed(token, timeout_s=60)
    mine = [await place(comm, "a"), await place(comm, "b")]
    await comm.disconnect()
    assert await states(*mine, elsewhere) == ["cancelled", "cancelled", "open"]


async def test_with_scope_account_it_cancels_every_open_bid_of_the_account(buyer, token_of, make_bid):
    token = await sync_to_async(token_of)(buyer)
    elsewhere = (await sync_to_async(make_bid)(buyer)).pk
    comm = await armed(token, timeout_s=60, scope="account")
    mine = await place(comm, "a")
    await comm.disconnect()
    assert await states(mine, elsewhere) == ["cancelled", "cancelled"]


async def test_silence_past_the_timeout_fires_it_and_says_so(buyer, token_of):
    comm = await armed(await sync_to_async(token_of)(buyer), timeout_s=1)
    bid = await place(comm, "a")
    fired = await recv(comm)  # nothing sent for a second
    while fired["type"] != "cancelled_on_disconnect":
        fired = await recv(comm)
    assert fired["bids"] == [bid] and "cancelled" in fired["reason"]
    assert await states(bid) == ["cancelled"]
    await comm.disconnect()


async def test_a_client_that_keeps_talking_keeps_its_bids_and_disarming_leaves_them(buyer, token_of):
    comm = await armed(await sync_to_async(token_of)(buyer), timeout_s=1)
    bid = await place(comm, "a")
    for _ in range(4):  # 1.6 s, never a second of silence
        await asyncio.sleep(0.4)
        await comm.send_json_to({"type": "ping"})
    await comm.send_json_to({"type": "cancel_on_disconnect", "timeout_s": 0})
    replies = [await recv(comm) for _ in range(5)]  # four pongs and the disarm
    assert not any(r["type"] == "cancelled_on_disconnect" for r in replies)
    disarm = next(r for r in replies if r["type"] == "cancel_on_disconnect")
    assert disarm["armed"] is False
    await comm.disconnect()
    assert await states(bid) == ["open"]


@pytest.mark.parametrize(("switch", "field"), [({"timeout_s": -1}, "timeout_s"), ({"timeout_s": 3601}, "timeout_s"), ({"timeout_s": "5"}, "timeout_s"),
                                               ({"timeout_s": True}, "timeout_s"), ({"timeout_s": 5, "scope": "everyone"}, "scope")])
async def test_a_bad_switch_is_invalid_naming_the_field(switch, field, buyer, token_of):
    comm = await connect(await sync_to_async(token_of)(buyer))
    await welcome(comm)
    await comm.send_json_to({"type": "cancel_on_disconnect", **switch})
    error = await recv(comm)
    assert (error["type"], error["code"], list(error["fields"])) == ("error", "invalid", [field])
    await comm.disconnect()


async def test_arming_needs_the_trade_scope(buyer, token_of):
    anonymous = await connect()
    await welcome(anonymous)
    await anonymous.send_json_to({"type": "cancel_on_disconnect", "timeout_s": 5})
    assert (await recv(anonymous))["code"] == "forbidden"
    await anonymous.disconnect()
    reader = await connect(await sync_to_async(token_of)(buyer, ["read"]))
    await welcome(reader)
    await reader.send_json_to({"type": "cancel_on_disconnect", "timeout_s": 5})
    error = await recv(reader)
    assert error["code"] == "forbidden" and "trade" in error["message"]
    await reader.disconnect()

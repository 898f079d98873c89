"""A book channel names a GPU model and a region that exist: anything else is an
`invalid_channel` that names the valid ones, and joins no group."""

from __future__ import annotations

import json

import pytest
from channels.testing import WebsocketCommunicator

from gridbid.asgi import application
from market.streams.hub import hub
from market.streams.publish import group_name

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.asyncio]


@pytest.mark.parametrize(("channel", "named"), [
    ("book.X9.us-east", ["'X9'", "H100-SXM-80GB"]),
    ("book.H100-SXM-80GB.mars-1", ["'mars-1'", "us-east"]),
])
async def test_an_unknown_book_is_an_invalid_channel_naming_the_valid_ones_and_joins_no_group(channel, named):
    comm = WebsocketCommunicator(application, "/ws/v1/stream")
    assert (await comm.connect(timeout=5))[0]
    assert json.loads(await comm.receive_from(timeout=5))["type"] == "welcome"
    await comm.send_json_to({"type": "subscribe", "channel": channel})
    error = json.loads(await comm.receive_from(timeout=5))
    assert error["type"] == "error" and error["code"] == "invalid_channel" and error["ref"] == channel
    for word in named:
        assert word in error["message"], error["message"]
    assert group_name(channel) not in hub().members
    await comm.send_json_to({"type": "subscribe", "channel": "book.H100-SXM-80GB.us-east"})
    assert json.loads(await comm.receive_from(timeout=5))["type"] == "snapshot"
    await comm.disconnect()

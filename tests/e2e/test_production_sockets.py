"""WebSockets under the production configuration: `gridbid up` on PostgreSQL with the
Redis channel layer, a separate `gridbid worker`, and real sockets from this process.

Issue 27, item 2: idle sockets dropped with 1006 every few seconds. redis-py 8 gives every
connection a 5 s socket timeout (redis/_defaults.py), and channels_redis waits for a
socket's next message with a 5 s BZPOPMIN: when Redis answered "nothing" at the 5 s mark
the client's read had already timed out, `redis.exceptions.TimeoutError: Timeout reading`
escaped the layer's receive loop, and the consumer waiting on it died."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.e2e.conftest import start_server, stop_server
from tests.e2e.test_production_mode import production_env  # noqa: F401 - the fixture

pytestmark = [pytest.mark.postgres, pytest.mark.redis, pytest.mark.slow, pytest.mark.timeout(400)]

IDLE_SOCKETS = 50
IDLE_S = 120


def test_fifty_idle_sockets_stay_open_for_two_minutes_on_the_redis_channel_layer(production_env: dict[str, str], tmp_path: Path) -> None:  # noqa: F811
    from websockets.asyncio.client import connect

    data = tmp_path / "data"
    data.mkdir()
    proc, base, _ = start_server(data, demo=False, extra_env=production_env, up_args=("--no-worker",))
    url = base.replace("http://", "ws://") + "/ws/v1/stream"

    async def idle() -> tuple[list[int | None], list[str]]:
        # no client pings: a socket must stay up on the server's own account
        sockets = [await connect(url, ping_interval=None, open_timeout=30) for _ in range(IDLE_SOCKETS)]
        try:
            for ws in sockets:
                assert json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] == "welcome"
            await asyncio.sleep(IDLE_S)
            closed = [ws.close_code for ws in sockets if ws.close_code is not None]
            answers = []
            for ws in sockets:
                if ws.close_code is None:
                    await ws.send(json.dumps({"type": "subscribe", "channel": "rounds"}))
                    answers.append(json.loads(await asyncio.wait_for(ws.recv(), 30))["type"])
            return closed, answers
        finally:
            for ws in sockets:
                await ws.close()

    try:
        closed, answers = asyncio.run(idle())
    finally:
        stop_server(proc)
    log = (data / "server.log").read_text()
    assert closed == [], f"{len(closed)} of {IDLE_SOCKETS} idle sockets closed ({closed}); server log: {log[-3000:]}"
    assert answers == ["snapshot"] * IDLE_SOCKETS
    assert "TimeoutError" not in log, log[-3000:]

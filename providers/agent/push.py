"""Assignment push over a WebSocket, with REST polling as the fallback.

A message from the market only says "look now": the daemon then polls the
assignments endpoint, which stays the one source of truth. So a lost or
duplicated push costs nothing, and without the socket (a proxy that drops it,
a market without the route) the agent still works at the polling interval.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from providers.agent.client import backoff_delays


def push_url(market_url: str, machine_id: int) -> str:
    base = market_url.rstrip("/")
    base = "wss://" + base[len("https://"):] if base.startswith("https://") else "ws://" + base.removeprefix("http://")
    return f"{base}/ws/agent/machines/{machine_id}/"


class PushListener(threading.Thread):
    def __init__(self, url: str, token: str, wake: threading.Event, stop: threading.Event) -> None:
        super().__init__(name="assignment-push", daemon=True)
        self.url, self.token, self.wake, self.stop = url, token, wake, stop
        self.connected = threading.Event()
        self.messages = 0

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        from websockets.asyncio.client import connect

        delays = backoff_delays(1.0, 60.0)
        while not self.stop.is_set():
            try:
                async with connect(self.url, additional_headers={"Authorization": f"Bearer {self.token}"}, open_timeout=10) as ws:
                    self.connected.set()
                    delays = backoff_delays(1.0, 60.0)
                    while not self.stop.is_set():
                        try:
                            await asyncio.wait_for(ws.recv(), timeout=1.0)
                        except TimeoutError:
                            continue
                        self.messages += 1
                        self.wake.set()
            except Exception:  # refused, dropped, no such route: polling carries on meanwhile
                pass
            self.connected.clear()
            await self._sleep(next(delays))

    async def _sleep(self, seconds: float) -> Any:
        end = asyncio.get_running_loop().time() + seconds
        while not self.stop.is_set() and asyncio.get_running_loop().time() < end:
            await asyncio.sleep(min(0.2, seconds))

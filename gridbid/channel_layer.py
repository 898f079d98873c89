"""The Redis channel layer as production runs it (settings.CHANNEL_LAYERS under REDIS_URL).

Two things channels_redis leaves to its caller, and both dropped sockets (issue 27):

* **Timeouts.** A consumer waits for its next message with BZPOPMIN and a 5 s timeout
  (`RedisChannelLayer.brpop_timeout`). redis-py 8 gives every connection a 5 s
  `socket_timeout`, so when Redis answered "nothing yet" at the 5 s mark the client's read
  had already given up: `redis.exceptions.TimeoutError` escaped the layer's receive loop
  and the consumer waiting on it died (1006), one idle socket every few seconds. Reads
  here wait `brpop_timeout + READ_MARGIN_S`; a Redis that stops answering still fails
  them, 10 s later than a command's own bound, and connecting keeps its own 5 s bound.
* **The pool.** channels_redis builds a plain redis-py pool, which raises
  `MaxConnectionsError` once 100 connections are in use: 500 sockets subscribing at once
  ask for 500 (each `group_add` holds one for a round trip). Here the pool *blocks* a
  caller until a connection is free (at most POOL_WAIT_S), so a burst queues instead of
  failing.

Sizing: an idle socket holds no connection. A process's sockets share one blocking
BZPOPMIN (channels_redis multiplexes their channels), and every other operation holds a
connection for one round trip (well under a millisecond to a local Redis). With P
connections a burst of S subscriptions therefore takes about S / P round trips: 500
subscriptions over the default 64 connections are 8 round trips, a few milliseconds. What
bounds P is Redis: `maxclients` (10,000 by default) must exceed P x the number of server
and worker processes plus Celery's own connections, so P = 64 leaves room for over 100
processes. CHANNEL_REDIS_POOL_SIZE sets it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from channels.layers import InMemoryChannelLayer
from channels_redis.core import RedisChannelLayer as _RedisChannelLayer

log = logging.getLogger("gridbid.streams")

READ_MARGIN_S = 10.0  # how much longer than the layer's blocking wait a read may take
CONNECT_TIMEOUT_S = 5.0
POOL_WAIT_S = 10.0  # how long a caller waits for a free connection before an error


class RedisChannelLayer(_RedisChannelLayer):
    """channels_redis' layer with read timeouts above its blocking wait and a blocking pool."""

    def __init__(self, *args: Any, pool_size: int = 64, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pool_size = pool_size

    def create_pool(self, index: int) -> Any:
        from redis.asyncio import BlockingConnectionPool

        host = dict(self.hosts[index])
        address = host.pop("address")
        host.setdefault("socket_timeout", self.brpop_timeout + READ_MARGIN_S)
        host.setdefault("socket_connect_timeout", CONNECT_TIMEOUT_S)
        host.setdefault("socket_keepalive", True)
        return BlockingConnectionPool.from_url(address, max_connections=self.pool_size, timeout=POOL_WAIT_S, **host)


def _hand_over(coro: Any, loop: asyncio.AbstractEventLoop, where: str) -> None:
    """Run ``coro`` on ``loop`` without waiting for it: a worker thread publishing a round's
    many updates is not held up by a busy web loop, and the loop runs what one thread hands
    over in the order it was handed over. A failure is logged, as a publish's own is."""
    def done(fut: Any) -> None:
        if not fut.cancelled() and fut.exception() is not None:
            log.error("sending to %s failed", where, exc_info=fut.exception())

    asyncio.run_coroutine_threadsafe(coro, loop).add_done_callback(done)


class LocalChannelLayer(InMemoryChannelLayer):
    """The embedded mode's layer: channels' in-memory layer, made safe to publish to from
    another thread, and without a task per socket per update.

    The embedded server publishes from its in-process Celery workers' threads (a round
    clears there), while every socket's queue lives on the ASGI server's event loop.
    channels' layer put the message into those queues from the worker's thread: asyncio
    objects are not thread-safe, the server's loop was not woken (an update waited for the
    loop's next I/O or timer), and a socket joining or leaving a group while a worker
    iterated it raised "dictionary changed size during iteration", losing that update for
    every socket. Here a send or group send from another thread is handed to the server's
    loop (the loop that receives), which runs it in the order handed over.

    A group send puts the message into each member's queue directly. channels' layer
    started one task per member and deep-copied the message for each (the messages are
    flat: nothing to copy), and dropped the message silently for a member whose queue was
    full; that is logged here. The streams' updates no longer come this way (one hand-over
    per update through market.streams.hub); revocations and the agents' wake-ups do."""

    CLEAN_EVERY_S = 1.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.cleaned = 0.0

    def _clean_expired(self) -> None:
        """channels' layer looked through every channel and group for expired messages and
        memberships on every receive and send: with 1,000 sockets, each update's 1,000
        receives walked 1,000 queues, a third of the server loop's time in a fan-out. Once a
        second is as good: a message expires after ``expiry`` (60 s), a membership after
        ``group_expiry``."""
        now = time.monotonic()
        if now - self.cleaned >= self.CLEAN_EVERY_S:
            self.cleaned = now
            super()._clean_expired()

    def _elsewhere(self) -> asyncio.AbstractEventLoop | None:
        """The receiving loop, when this call runs on another (running) one."""
        loop = self.loop
        if loop is None or loop.is_closed() or not loop.is_running():
            return None
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:  # pragma: no cover - the layer's methods run in a loop
            here = None
        return None if here is loop else loop

    async def receive(self, channel: str) -> Any:
        self.loop = asyncio.get_running_loop()
        return await super().receive(channel)

    async def send(self, channel: str, message: dict[str, Any]) -> None:
        loop = self._elsewhere()
        if loop is not None:
            _hand_over(super().send(channel, message), loop, channel)
            return
        await super().send(channel, message)

    async def group_send(self, group: str, message: dict[str, Any]) -> None:
        loop = self._elsewhere()
        if loop is not None:
            _hand_over(self._group_send_here(group, message), loop, group)
            return
        await self._group_send_here(group, message)

    async def _group_send_here(self, group: str, message: dict[str, Any]) -> None:
        assert isinstance(message, dict), "Message is not a dict"
        self.require_valid_group_name(group)
        self._clean_expired()
        expires = time.time() + self.expiry
        for channel in list(self.groups.get(group, ())):
            queue = self.channels.setdefault(channel, asyncio.Queue(maxsize=self.get_capacity(channel)))
            try:
                queue.put_nowait((expires, message))
            except asyncio.QueueFull:
                log.warning("channel %s is full: an update to %s was not delivered to it", channel, group)

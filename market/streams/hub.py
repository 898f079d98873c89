"""This server process's stream sockets by group, and the one path an update takes to them.

A round's update went through the channel layer: one message per subscribed socket,
each received by the socket's own task (channels' receive loop, its dispatch, and in
production channels_redis' per-channel futures and lock). With 1,000 sockets that was
1,000 layer messages per update; py-spy put a third of a production server process's
time in that machinery. Here an update reaches each process once, and the process puts
its text into each subscribed socket's outbox in one pass on the server's loop:

* **embedded** (no REDIS_URL): everything is one process. A publish from a Celery
  worker's thread is handed to the server's loop in one call (`call_soon_threadsafe`),
  whatever the number of sockets; on the loop itself it is delivered at once.
* **production** (REDIS_URL): a publish, from any process, is one Redis PUBLISH on this
  deployment's stream channel. Each server process keeps one subscription to it (one
  connection, one listener task) and delivers what arrives to its own sockets. Every
  process receives every update and drops those no socket of its own wants; per-group
  Redis subscriptions would spare that at hundreds of processes, at the cost of a
  subscribe round trip per new group.

Redis pub/sub keeps nothing for a listener that is not connected. When the listener's
connection breaks, every socket of the process that was subscribed to something is told
and closed with 1012 (docs/stream.md): it reconnects and takes fresh snapshots, rather
than stay open with updates silently missing. Credential revocations still travel
through the channel layer (they are rare and address one socket's own channel).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, Protocol

log = logging.getLogger("gridbid.streams")

LISTENER_READY_S = 5.0  # how long a subscribe waits for the process's Redis subscription
IDLE_PING_S = 15.0  # the listener pings Redis after this long without a message
RETRY_MAX_S = 5.0  # the most the listener waits between attempts to reconnect
CLOSE_FEED_LOST = 1012  # "service restart": the process lost its feed; reconnect


_NUMBERS = itertools.count(1)

# KEYS[1]: the channel's counter; ARGV[1..3]: the stream channel, the counter's start when
# absent, its ttl. Django's Redis cache keeps an int as
# its digits, so cache.get reads the counter this leaves. %d, not tostring: Lua prints
# 1.8e15, a double, as "1.8e+15".
# KEYS[2]: the channel's history, a sorted set of frames scored by number. ARGV[4]: the group;
# ARGV[5], ARGV[6]: the frame's text before and after its number; ARGV[7], ARGV[8]: how many
# frames the history keeps, and for how long after the last.
_PUBLISH_NUMBERED = """
redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3], 'NX')
local seq = string.format('%d', redis.call('INCR', KEYS[1]))
local frame = ARGV[5] .. seq .. ARGV[6]
redis.call('PUBLISH', ARGV[1], ARGV[4] .. '\\n' .. frame)
redis.call('ZADD', KEYS[2], seq, frame)
redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -1 - tonumber(ARGV[7]))
redis.call('EXPIRE', KEYS[2], ARGV[8])
return seq
"""
HISTORY_LEN = 200  # updates kept per channel for a resume (subscribe with since_seq)
HISTORY_TTL_S = 900  # ... for at most this long after the channel's last update


class Member(Protocol):
    """A socket as the hub sees it (market.streams.consumers.StreamConsumer)."""

    def push(self, text: str) -> None:
        """Queue an update's text for the client (on the server's loop)."""

    def feed_lost(self, message: str) -> None:
        """The process stopped receiving updates: tell the client and close."""


def stream_channel(redis_url: str) -> str:
    """The Redis pub/sub channel of the deployment on ``redis_url``. Pub/sub ignores the
    database number, so it is part of the name: deployments (and test runs) sharing one
    Redis on different databases do not hear each other."""
    from redis.connection import parse_url

    return f"gridbid.stream.db{parse_url(redis_url).get('db', 0)}"


class Hub:
    def __init__(self, redis_url: str | None = None) -> None:
        self.redis_url = redis_url
        self.members: dict[str, set[Member]] = {}
        self.loop: asyncio.AbstractEventLoop | None = None  # the server's loop, where members live
        self.channel = stream_channel(redis_url) if redis_url else ""
        self._publisher: Any = None
        self._publisher_lock = threading.Lock()
        self._numbered: Any = None  # the registered _PUBLISH_NUMBERED script
        self._order_lock = threading.Lock()
        # the embedded mode's histories: group -> (number, when, frame), the last HISTORY_LEN
        self.histories: dict[str, deque[tuple[int, float, str]]] = {}
        self._listener: asyncio.Task[None] | None = None
        self._ready: asyncio.Event | None = None
        self.delivered = 0  # updates this process received (and delivered where wanted)
        # the listener's Redis connection, as CLIENT LIST names it
        self.name = f"gridbid-stream-{os.getpid()}-{next(_NUMBERS)}"

    # --- the sockets' side, on the server's loop ------------------------------------------
    async def join(self, group: str, member: Member) -> None:
        """Add ``member`` to ``group``; when this returns, every update published from now on
        reaches it (in production: once this process's subscription is live). Raises
        ConnectionError when the process cannot hear Redis."""
        self.loop = asyncio.get_running_loop()
        if self.redis_url:
            await self._listening()
        self.add(group, member)

    def add(self, group: str, member: Member) -> None:
        """Add ``member`` to ``group`` as it stands (join, without waiting for a subscription)."""
        self.members.setdefault(group, set()).add(member)

    def leave(self, group: str, member: Member) -> None:
        members = self.members.get(group)
        if members is not None:
            members.discard(member)
            if not members:
                del self.members[group]

    def leave_all(self, groups: Iterable[str], member: Member) -> None:
        for group in groups:
            self.leave(group, member)

    def deliver(self, group: str, text: str) -> None:
        """Queue ``text`` for every member of ``group`` in this process (on the server's loop)."""
        self.delivered += 1
        members = self.members.get(group)
        if not members:
            return
        for member in list(members):  # a slow member leaves the group as it is pushed
            try:
                member.push(text)
            except Exception:  # one socket's fault (its loop closed under it) is not the others'
                log.exception("a stream socket could not take an update of %s; it leaves the group", group)
                members.discard(member)
        if not members and self.members.get(group) is members:
            del self.members[group]

    # --- the publishers' side: any thread, any process -------------------------------------
    def publish(self, group: str, text: str) -> None:
        """Send ``text`` to every socket of ``group``, in every server process. Raises what
        Redis raises when it cannot take it."""
        if self.redis_url:
            self._redis().publish(self.channel, f"{group}\n{text}")
            return
        loop = self.loop
        if loop is None or loop.is_closed() or not loop.is_running():
            self.deliver(group, text)  # no server loop: no socket but what joined without one
            return
        try:
            here = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        if here is loop:
            self.deliver(group, text)
        else:  # one hand-over per update, in the order published, whatever the number of sockets
            loop.call_soon_threadsafe(self.deliver, group, text)

    def publish_numbered(self, group: str, head: str, tail: str, *, seq_key: str, start: int, ttl: int,
                         next_seq: Callable[[], int]) -> int:
        """Number an update and send it in one step; its number. The socket's text is
        ``head + number + tail``. Two publishers of one channel (a round's book update from a
        Celery worker, an offer's from a server process) that took numbers N and N+1 could
        send them in the other order: the sockets saw a gap at N+1 and dropped N as old.
        Here the numbers are taken in the order the updates are sent: in production one
        Redis script increments the channel's counter (``seq_key``, the cache's key for it,
        created at ``start`` with ``ttl``) and publishes; in the embedded mode
        ``next_seq()`` and the hand-over to the loop run under one lock."""
        if self.redis_url:
            if self._numbered is None:
                self._numbered = self._redis().register_script(_PUBLISH_NUMBERED)
            return int(self._numbered(keys=[seq_key, self._history_key(group)],
                                      args=[self.channel, start, ttl, group, head, tail, HISTORY_LEN, HISTORY_TTL_S]))
        with self._order_lock:
            seq = next_seq()
            text = f"{head}{seq}{tail}"
            kept = self.histories.get(group)
            if kept is None:
                kept = self.histories[group] = deque(maxlen=HISTORY_LEN)
            kept.append((seq, time.monotonic(), text))
            self.publish(group, text)
        return seq

    def publish_numbered_many(self, items: list[tuple[str, str, str, str, int, int, Callable[[], int]]]) -> list[int]:
        """``publish_numbered`` of each (group, head, tail, seq_key, start, ttl, next_seq), in
        order; their numbers. In production one Redis pipeline carries them all, each still
        numbered and sent by the script in one step, so a round's thousands of updates cost
        one round trip, not one each (issue 39)."""
        if not items:
            return []
        if not self.redis_url:
            return [self.publish_numbered(g, h, t, seq_key=k, start=st, ttl=tl, next_seq=n) for g, h, t, k, st, tl, n in items]
        if self._numbered is None:
            self._numbered = self._redis().register_script(_PUBLISH_NUMBERED)
        pipe = self._redis().pipeline(transaction=False)
        for group, head, tail, seq_key, start, ttl, _ in items:
            self._numbered(keys=[seq_key, self._history_key(group)], args=[self.channel, start, ttl, group, head, tail, HISTORY_LEN, HISTORY_TTL_S],
                           client=pipe)
        return [int(x) for x in pipe.execute()]

    def history(self, group: str, since_seq: int) -> list[tuple[int, str]]:
        """The kept frames of ``group`` numbered above ``since_seq``, oldest first, as (number,
        text). Whether they reach back to ``since_seq + 1`` is the caller's to check: the
        history keeps the last HISTORY_LEN updates, for HISTORY_TTL_S after the last one."""
        if self.redis_url:
            rows = self._redis().zrangebyscore(self._history_key(group), f"({since_seq}", "+inf", withscores=True)
            return [(int(score), frame.decode()) for frame, score in rows]
        with self._order_lock:
            kept = list(self.histories.get(group, ()))
        if kept and time.monotonic() - kept[-1][1] > HISTORY_TTL_S:
            return []
        return [(seq, text) for seq, _, text in kept if seq > since_seq]

    @staticmethod
    def _history_key(group: str) -> str:
        return f"gridbid:stream-history:{group}"

    def _redis(self) -> Any:
        if self._publisher is None:
            import redis

            with self._publisher_lock:
                if self._publisher is None:
                    self._publisher = redis.Redis.from_url(self.redis_url, socket_timeout=5, socket_connect_timeout=5)
        return self._publisher

    # --- production: the process's one subscription ----------------------------------------
    async def _listening(self) -> None:
        """Start the listener on this loop if it is not running, and wait until it hears."""
        loop = asyncio.get_running_loop()
        if self._listener is None or self._listener.done() or self._listener.get_loop() is not loop:
            self._ready = asyncio.Event()
            self._listener = loop.create_task(self._listen(), name="gridbid-stream-hub")
        assert self._ready is not None
        if self._ready.is_set():
            return
        try:
            await asyncio.wait_for(self._ready.wait(), LISTENER_READY_S)
        except TimeoutError:
            raise ConnectionError("this server cannot reach Redis for the live feed") from None

    async def _listen(self) -> None:
        from redis.asyncio import Redis

        retry = 0.25
        while True:
            client = Redis.from_url(self.redis_url, socket_connect_timeout=5, socket_keepalive=True, client_name=self.name)
            pubsub = client.pubsub()
            try:
                await pubsub.subscribe(self.channel)
                waiting_pong = False
                while True:
                    message = await pubsub.get_message(timeout=IDLE_PING_S)
                    if message is None:
                        if waiting_pong:  # no answer to the last ping within IDLE_PING_S
                            raise ConnectionError("Redis did not answer the stream listener's ping")
                        await pubsub.ping()
                        waiting_pong = True
                        continue
                    waiting_pong = False
                    kind = message["type"]
                    if kind == "subscribe":
                        retry = 0.25
                        assert self._ready is not None
                        self._ready.set()
                    elif kind == "message":
                        group, _, text = message["data"].decode().partition("\n")
                        self.deliver(group, text)
            except asyncio.CancelledError:
                await _close_quietly(pubsub, client)
                raise
            except Exception as exc:  # noqa: BLE001 - a lost connection, whatever redis-py calls it
                log.warning("the stream listener lost Redis (%r); closing this process's subscribed sockets", exc)
                assert self._ready is not None
                self._ready.clear()
                self._feed_lost()
                await _close_quietly(pubsub, client)
                await asyncio.sleep(retry)
                retry = min(RETRY_MAX_S, retry * 2)

    def _feed_lost(self) -> None:
        lost: set[Member] = set()
        for members in self.members.values():
            lost |= members
        self.members.clear()
        for member in lost:
            member.feed_lost("This server lost its live feed (Redis) and cannot say what you missed: "
                             "reconnect and subscribe again for fresh snapshots.")

    async def stop(self) -> None:
        """End the listener (tests, and a server shutting down)."""
        if self._listener is not None and not self._listener.done():
            self._listener.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._listener
        self._listener = None


async def _close_quietly(pubsub: Any, client: Any) -> None:
    for closing in (pubsub.aclose, client.aclose):
        with contextlib.suppress(Exception):  # the connection is already gone
            await closing()


_HUB: Hub | None = None
_HUB_LOCK = threading.Lock()


def hub() -> Hub:
    """This process's hub, set up from settings.STREAM_REDIS_URL on first use."""
    global _HUB
    if _HUB is None:
        from django.conf import settings

        with _HUB_LOCK:
            if _HUB is None:
                _HUB = Hub(getattr(settings, "STREAM_REDIS_URL", None))
    return _HUB

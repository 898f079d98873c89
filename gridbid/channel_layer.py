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

from typing import Any

from channels_redis.core import RedisChannelLayer as _RedisChannelLayer

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

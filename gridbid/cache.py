"""Django's Redis cache, with one connection pool per process and server.

Django keeps a cache object per thread and, under ASGI, per request (``caches`` is an
asgiref Local), and its Redis client keeps its connection pools on that object. So every
request of the ASGI server made a new pool, opened a new TCP connection to Redis for its
throttle counters and the markets list, and dropped it when it ended: /api/v1/markets/
spent more time connecting to Redis than reading from it (tests/bench/bench_round.py;
Django ticket 35757). Here the pools are kept per process, keyed by server and options,
and every cache object of the process draws from them. redis-py's pools are thread-safe
and reset themselves in a forked child.
"""

from __future__ import annotations

import threading
from typing import Any

from django.core.cache.backends import redis as django_redis

_POOLS: dict[tuple[str, str], Any] = {}
_LOCK = threading.Lock()


class SharedPoolClient(django_redis.RedisCacheClient):
    def _get_connection_pool(self, write: bool) -> Any:
        index = self._get_connection_pool_index(write)
        key = (self._servers[index], repr(sorted(self._pool_options.items(), key=lambda kv: kv[0])))
        pool = _POOLS.get(key)
        if pool is None:
            with _LOCK:
                pool = _POOLS.get(key)
                if pool is None:
                    pool = _POOLS[key] = self._pool_class.from_url(self._servers[index], **self._pool_options)
        return pool


class RedisCache(django_redis.RedisCache):
    def __init__(self, server: str, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = SharedPoolClient

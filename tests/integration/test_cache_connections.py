"""The Redis cache reuses its connections from one request to the next (issue 39).

Django keeps a cache object per thread and, under ASGI, per request (its cache handler is an
asgiref Local). Its Redis backend keeps a connection pool per cache object, so every request
of `gridbid up` opened a new TCP connection to Redis for its throttle counters and the markets
list, and dropped it at the end: in tests/bench/bench_round.py, /api/v1/markets/ spent more of
its time connecting to Redis than reading from it. gridbid.cache.RedisCache shares one pool
per process and server among all of them."""

from __future__ import annotations

import asyncio

import redis
from asgiref.sync import sync_to_async
from django.core.cache import CacheHandler
from django.test import override_settings

REQUESTS = 20


def connections_made(url: str) -> int:
    with redis.Redis.from_url(url) as client:
        return int(client.info("stats")["total_connections_received"])


def test_requests_each_with_their_own_cache_object_share_one_pool_of_connections(redis_url: str) -> None:
    with override_settings(CACHES={"default": {"BACKEND": "gridbid.cache.RedisCache", "LOCATION": redis_url}}):
        handler = CacheHandler()

        async def request(i: int) -> None:
            # a request's context: its own cache object, as Django's handler gives each one
            await sync_to_async(lambda: (handler["default"].set(f"k{i}", i), handler["default"].get(f"k{i}")), thread_sensitive=False)()

        async def requests() -> None:
            for i in range(REQUESTS):
                await asyncio.create_task(request(i))

        before = connections_made(redis_url)
        asyncio.run(requests())
        made = connections_made(redis_url) - before - 1  # less the one that counted them
    assert made <= 2, f"{made} Redis connections for {REQUESTS} requests"

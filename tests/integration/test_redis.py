"""Celery over the real Redis broker and the channels_redis layer, each with a round trip."""

from __future__ import annotations

import asyncio
import uuid


def test_celery_task_round_trips_through_the_redis_broker(redis_url):
    from celery import Celery
    from celery.contrib.testing.worker import start_worker

    app = Celery(f"gridbid-test-{uuid.uuid4().hex[:6]}", broker=redis_url, backend=redis_url)
    app.conf.task_default_queue = f"test-{uuid.uuid4().hex[:8]}"

    @app.task(name="tests.price_total")
    def price_total(price: int, gpus: int, seconds: int) -> int:
        return price * gpus * seconds // 3600

    app.loader.import_module("celery.contrib.testing.tasks")
    try:
        with start_worker(app, pool="solo", perform_ping_check=False, shutdown_timeout=20):
            assert price_total.delay(2_000_000, 8, 5400).get(timeout=20) == 24_000_000
    finally:
        # start_worker makes this app the process's current and default one; a later
        # test's in-process worker of the project's app then never received a task
        from gridbid.celery import app as project_app

        project_app.set_current()
        project_app.set_default()


def test_channels_redis_layer_delivers_a_group_message(redis_url):
    from gridbid.channel_layer import RedisChannelLayer  # the production layer

    async def round_trip() -> dict:
        layer = RedisChannelLayer(hosts=[redis_url], prefix=f"gbtest{uuid.uuid4().hex[:6]}")
        channel = await layer.new_channel()
        await layer.group_add("book.H100-SXM-80GB.us-east", channel)
        await layer.group_send("book.H100-SXM-80GB.us-east", {"type": "book.update", "seq": 1, "best_ask": 2_100_000})
        message = await asyncio.wait_for(layer.receive(channel), timeout=5)
        await layer.group_discard("book.H100-SXM-80GB.us-east", channel)
        await layer.flush()
        return message

    assert asyncio.run(round_trip()) == {"type": "book.update", "seq": 1, "best_ask": 2_100_000}


def test_the_layer_waits_past_its_blocking_receive_without_a_read_timeout(redis_url):
    """Issue 27, item 2: redis-py 8's 5 s socket timeout equals the layer's 5 s BZPOPMIN, so an
    idle receive raised redis TimeoutError (and its socket died). One receive that waits
    past the blocking wait: nothing arrives for 6 s, then the message does."""
    from gridbid.channel_layer import RedisChannelLayer

    async def idle_then_message() -> dict:
        layer = RedisChannelLayer(hosts=[redis_url], prefix=f"gbtest{uuid.uuid4().hex[:6]}")
        channel = await layer.new_channel()

        async def later() -> None:
            await asyncio.sleep(layer.brpop_timeout + 1)
            await layer.send(channel, {"type": "late"})

        sender = asyncio.create_task(later())
        try:
            return await asyncio.wait_for(layer.receive(channel), timeout=30)
        finally:
            await sender
            await layer.flush()

    assert asyncio.run(idle_then_message()) == {"type": "late"}


def test_a_burst_of_subscriptions_queues_for_the_pool_instead_of_failing(redis_url):
    """Issue 27, item 3: 500 sockets subscribing at once asked channels_redis' plain pool for
    500 connections and got MaxConnectionsError past 100. The layer's pool blocks a caller
    until a connection is free: 300 group_adds over 4 connections all succeed."""
    from gridbid.channel_layer import RedisChannelLayer

    async def burst() -> int:
        layer = RedisChannelLayer(hosts=[redis_url], prefix=f"gbtest{uuid.uuid4().hex[:6]}", pool_size=4)
        channels = [f"{layer.client_prefix}.burst{i}" for i in range(300)]
        try:
            await asyncio.gather(*(layer.group_add("rounds", c) for c in channels))
            async with layer.connection(0) as conn:
                return int(await conn.zcard(layer._group_key("rounds")))
        finally:
            await layer.flush()

    assert asyncio.run(burst()) == 300

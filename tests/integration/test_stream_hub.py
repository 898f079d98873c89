"""market.streams.hub against the real Redis: every server process hears each update once
and takes it to its own sockets; a process that loses Redis closes its subscribed sockets
(1012) instead of leaving them open with updates silently missing, and hears again after."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest


class Socket:
    """What the hub takes updates to: a socket's outbox, and its close."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self.lost: list[str] = []
        self.arrived = asyncio.Event()

    def push(self, text: str) -> None:
        self.texts.append(text)
        self.arrived.set()

    def feed_lost(self, message: str) -> None:
        self.lost.append(message)
        self.arrived.set()


async def until(check: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not within the time"
        await asyncio.sleep(0.02)


def publish_from_another_thread(hub: Any, group: str, text: str) -> None:
    """As a Celery worker (another process in production) publishes: synchronously, off the loop."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            hub.publish(group, text)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(10)
    assert not errors, errors


def test_each_process_hears_an_update_once_and_takes_it_to_its_own_sockets_only(redis_url: str) -> None:
    from market.streams.hub import Hub

    async def scenario() -> None:
        web1, web2, worker = Hub(redis_url), Hub(redis_url), Hub(redis_url)  # two server processes, a Celery worker
        a, b, c, other_book = Socket(), Socket(), Socket(), Socket()
        try:
            await web1.join("pub.rounds", a)
            await web1.join("pub.rounds", b)
            await web2.join("pub.rounds", c)
            await web2.join("pub.book.H100-SXM-80GB.us-east", other_book)
            for n in range(3):
                publish_from_another_thread(worker, "pub.rounds", f'{{"n":{n}}}')
            await until(lambda: all(len(s.texts) == 3 for s in (a, b, c)))
            assert a.texts == b.texts == c.texts == ['{"n":0}', '{"n":1}', '{"n":2}']  # in the order published
            assert other_book.texts == []
            assert web1.delivered == web2.delivered == 3  # once per process, not once per socket
            web1.leave("pub.rounds", a)
            publish_from_another_thread(worker, "pub.rounds", '{"n":3}')
            await until(lambda: len(b.texts) == 4 and len(c.texts) == 4)
            assert len(a.texts) == 3
        finally:
            for hub in (web1, web2):
                await hub.stop()

    asyncio.run(scenario())


def test_a_deployment_on_another_redis_database_is_not_heard(redis_url: str) -> None:
    from redis.connection import parse_url

    from market.streams.hub import Hub, stream_channel

    db = int(parse_url(redis_url).get("db", 0))
    elsewhere = redis_url.rsplit("/", 1)[0] + f"/{(db + 1) % 16}"
    assert stream_channel(redis_url) != stream_channel(elsewhere)

    async def scenario() -> None:
        here, there = Hub(redis_url), Hub(elsewhere)
        mine, theirs = Socket(), Socket()
        try:
            await here.join("pub.rounds", mine)
            await there.join("pub.rounds", theirs)
            publish_from_another_thread(Hub(redis_url), "pub.rounds", "{}")
            await until(lambda: mine.texts == ["{}"])
            await asyncio.sleep(0.2)
            assert theirs.texts == []
        finally:
            await here.stop()
            await there.stop()

    asyncio.run(scenario())


def test_a_process_that_loses_redis_closes_its_subscribed_sockets_and_hears_again_after(redis_url: str) -> None:
    import redis

    from market.streams.hub import Hub

    async def scenario() -> None:
        web, worker = Hub(redis_url), Hub(redis_url)
        before, after = Socket(), Socket()
        try:
            await web.join("pub.rounds", before)
            publish_from_another_thread(worker, "pub.rounds", '{"n":1}')
            await until(lambda: before.texts == ['{"n":1}'])
            with redis.Redis.from_url(redis_url) as admin:  # the listener's connection breaks
                ids = [c["id"] for c in admin.client_list(_type="pubsub") if c["name"] == web.name]
                assert len(ids) == 1
                admin.client_kill_filter(_id=ids[0])
            await until(lambda: before.lost != [])
            assert "reconnect" in before.lost[0]
            assert "pub.rounds" not in web.members  # it is out: nothing more reaches it
            await web.join("pub.rounds", after)  # waits for the listener to hear again
            publish_from_another_thread(worker, "pub.rounds", '{"n":2}')
            await until(lambda: after.texts == ['{"n":2}'])
            assert before.texts == ['{"n":1}']
        finally:
            await web.stop()

    asyncio.run(scenario())


def race(hub: Any, group: str, next_seq: Any, seq_key: str, start: int, publishers: int = 3, each: int = 150) -> None:
    """``publishers`` threads (Celery workers, server processes) number and send to one group at once."""
    errors: list[BaseException] = []

    def run(p: int) -> None:
        try:
            for i in range(each):
                hub.publish_numbered(group, '{"seq":', f',"from":[{p},{i}]}}', seq_key=seq_key, start=start, ttl=60, next_seq=next_seq)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in range(publishers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors, errors


@pytest.mark.parametrize("mode", ["production", "embedded"])
def test_racing_publishers_reach_every_socket_in_the_order_of_their_numbers(mode: str, redis_url: str) -> None:
    """Numbers N and N+1 taken by two publishers used to be sent in either order: the
    sockets saw a gap at N+1 and dropped N as older than what they had."""
    import json
    import uuid

    from django.core.cache.backends.redis import RedisCache

    from market.streams.hub import Hub

    cache = RedisCache(redis_url, {})
    key = f"stream-seq:race-{uuid.uuid4().hex[:8]}"
    start = time.time_ns() // 1000

    def next_seq() -> int:  # market.cache_counters.cache_count_up, on this cache
        cache.add(key, start, 60)
        return int(cache.incr(key))

    async def scenario() -> list[int]:
        hub = Hub(redis_url if mode == "production" else None)
        socket = Socket()
        try:
            await hub.join("pub.rounds", socket)
            await asyncio.to_thread(race, hub, "pub.rounds", next_seq, cache.make_key(key), start)
            await until(lambda: len(socket.texts) == 3 * 150)
        finally:
            await hub.stop()
        return [json.loads(t)["seq"] for t in socket.texts]

    seqs = asyncio.run(scenario())
    assert seqs == list(range(start + 1, start + 1 + 3 * 150))  # from the counter's start, none out of order
    assert cache.get(key) == seqs[-1]  # what a snapshot reads (publish.current_seq)
    cache.delete(key)


def test_the_redis_history_keeps_the_last_updates_of_a_channel_for_a_resume(redis_url: str, monkeypatch: Any) -> None:
    import uuid

    from django.core.cache.backends.redis import RedisCache

    from market.streams import hub as hub_module

    monkeypatch.setattr(hub_module, "HISTORY_LEN", 3)
    cache = RedisCache(redis_url, {})
    group, key = f"pub.book.test-{uuid.uuid4().hex[:8]}", f"stream-seq:hist-{uuid.uuid4().hex[:8]}"
    start = time.time_ns() // 1000
    worker = hub_module.Hub(redis_url)
    for n in range(5):
        worker.publish_numbered(group, '{"seq":', f',"n":{n}}}', seq_key=cache.make_key(key), start=start, ttl=60, next_seq=lambda: 0)
    kept = worker.history(group, start)  # asks from the first: only the last 3 are kept
    assert [seq for seq, _ in kept] == [start + 3, start + 4, start + 5]
    assert [json_n(text) for _, text in kept] == [2, 3, 4]
    assert worker.history(group, start + 4) == [(start + 5, kept[-1][1])]
    import redis

    with redis.Redis.from_url(redis_url) as admin:
        ttl = admin.ttl(f"gridbid:stream-history:{group}")
        assert 0 < ttl <= hub_module.HISTORY_TTL_S
        admin.delete(f"gridbid:stream-history:{group}")
    cache.delete(key)


def json_n(text: str) -> int:
    import json

    return int(json.loads(text)["n"])


def test_many_updates_go_in_one_pipeline_numbered_in_order(redis_url: str) -> None:
    """Issue 39: a round's write publishes thousands of updates; in production they go in one
    Redis pipeline, each numbered and sent by the script as publish_numbered does it, in the
    order given, and a server process's socket gets them in that order."""
    import json
    import uuid

    from django.core.cache.backends.redis import RedisCache

    from market.streams.hub import Hub

    async def scenario() -> None:
        cache = RedisCache(redis_url, {})
        group, key = f"pub.book.many-{uuid.uuid4().hex[:8]}", f"stream-seq:many-{uuid.uuid4().hex[:8]}"
        start = time.time_ns() // 1000
        web, worker = Hub(redis_url), Hub(redis_url)
        sock = Socket()
        try:
            await web.join(group, sock)
            items = [(group, '{"seq":', f',"n":{n}}}', cache.make_key(key), start, 60, lambda: 0) for n in range(50)]
            numbers = await asyncio.to_thread(worker.publish_numbered_many, items)
            assert numbers == list(range(start + 1, start + 51))
            await until(lambda: len(sock.texts) == 50)
            assert [json_n(t) for t in sock.texts] == list(range(50))
            assert [json.loads(t)["seq"] for t in sock.texts] == numbers
            assert worker.publish_numbered_many([]) == []
        finally:
            await web.stop()
            cache.delete(key)

    asyncio.run(scenario())

"""Fan-out of one book update to N subscribers over the real Redis channel layer.

For N = 100, 1,000, 5,000 subscribers of one group, publish a sequence of
round results and measure, per message, the time until each subscriber has
received it: p50, p99 and max over all deliveries, and whether any subscriber
missed or reordered a message (sequence check). Two layers in the same run:
channels_redis's core layer (`group_send`, one Redis list per consumer) and its
pub/sub layer (one PUBLISH per group). Target at 1,000: p99 <= 150 ms, nothing lost.

    python tests/bench/bench_fanout.py [--sizes 100,1000,5000] [--messages 5]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid

REDIS_URL = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15")
TARGET_N, TARGET_P99_MS = 1000, 150.0


def make_layer(kind: str):  # type: ignore[no-untyped-def]
    prefix = f"fanbench{uuid.uuid4().hex[:6]}"
    if kind == "core":
        from channels_redis.core import RedisChannelLayer

        return RedisChannelLayer(hosts=[REDIS_URL], prefix=prefix, capacity=10_000, group_expiry=600)
    from channels_redis.pubsub import RedisPubSubChannelLayer

    return RedisPubSubChannelLayer(hosts=[REDIS_URL], prefix=prefix)


async def one_run(kind: str, n: int, messages: int) -> dict[str, float | int | str]:
    layer = make_layer(kind)
    group = "pub.book.H100-SXM-80GB.us-east"
    channels = [await layer.new_channel() for _ in range(n)]
    for c in channels:  # sequential: a burst of thousands would exhaust the connection pool
        await layer.group_add(group, c)
    latencies: list[float] = []
    lost = reordered = 0

    async def subscriber(channel: str) -> None:
        nonlocal lost, reordered
        expected = 1
        for _ in range(messages):
            try:
                msg = await asyncio.wait_for(layer.receive(channel), timeout=30)
            except TimeoutError:
                lost += messages - expected + 1
                return
            latencies.append(time.perf_counter() - msg["sent"])
            if msg["seq"] != expected:
                if msg["seq"] > expected:
                    lost += msg["seq"] - expected
                else:
                    reordered += 1
            expected = msg["seq"] + 1

    tasks = [asyncio.create_task(subscriber(c)) for c in channels]
    await asyncio.sleep(0.5)  # let every receive() reach Redis before publishing
    for seq in range(1, messages + 1):
        await layer.group_send(group, {"type": "stream.update", "channel": "book.H100-SXM-80GB.us-east", "seq": seq, "sent": time.perf_counter(), "data": {"best_ask": 2_000_000 + seq}})
        await asyncio.sleep(0.25)
    await asyncio.gather(*tasks)
    for c in channels:
        await layer.group_discard(group, c)
    if hasattr(layer, "flush"):
        await layer.flush()
    if hasattr(layer, "close_pools"):
        await layer.close_pools()
    latencies.sort()
    ms = [x * 1000 for x in latencies]
    return {
        "layer": kind,
        "n": n,
        "deliveries": len(ms),
        "p50": statistics.median(ms) if ms else float("nan"),
        "p99": ms[min(len(ms) - 1, int(0.99 * len(ms)))] if ms else float("nan"),
        "max": ms[-1] if ms else float("nan"),
        "lost": lost,
        "reordered": reordered,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="100,1000,5000")
    ap.add_argument("--messages", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="100 and 1,000 subscribers only")
    args = ap.parse_args()
    try:
        import redis

        redis.Redis.from_url(REDIS_URL, socket_connect_timeout=2).ping()
    except Exception as exc:
        print(f"Redis at {REDIS_URL} is unreachable ({exc}); set TEST_REDIS_URL")
        return 2
    sizes = [100, 1000] if args.quick else [int(s) for s in args.sizes.split(",")]
    print(f"fan-out of one book channel over Redis ({REDIS_URL}), {args.messages} messages per run")
    print(f"{'layer':<8}{'subscribers':>12}{'deliveries':>12}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'lost':>6}{'reord':>7}")
    results = []
    for n in sizes:
        for kind in ("core", "pubsub"):
            r = asyncio.run(one_run(kind, n, args.messages))
            results.append(r)
            print(f"{r['layer']:<8}{r['n']:>12,}{r['deliveries']:>12,}{r['p50']:>9.1f}{r['p99']:>9.1f}{r['max']:>9.1f}{r['lost']:>6}{r['reordered']:>7}", flush=True)
    by = {(r["layer"], r["n"]): r for r in results}
    for n in sizes:
        core, ps = by[("core", n)], by[("pubsub", n)]
        if ps["p99"]:
            print(f"  {n:,} subscribers: p99 ratio core/pubsub = {core['p99'] / ps['p99']:.2f} (above 1: pub/sub is faster)")
    failed = [r for r in results if r["lost"] or r["reordered"]]
    target = by.get(("core", TARGET_N)) or {}
    if target and target["p99"] > TARGET_P99_MS:
        failed.append(target)
        print(f"MISSED: core layer p99 at {TARGET_N:,} subscribers is {target['p99']:.1f} ms > {TARGET_P99_MS:g} ms")
    for r in failed:
        if r["lost"] or r["reordered"]:
            print(f"MISSED: {r['layer']} at {r['n']:,} lost {r['lost']} and reordered {r['reordered']}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

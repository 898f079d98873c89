"""A channel's sequence numbers: what a client checks every update against (docs/stream.md).

A client ignores an update numbered at or below the last it applied (it came before its
snapshot) and resubscribes on a gap. A counter that restarted from 1 (lost from the cache)
made every client ignore that channel's updates until the new numbers passed the old: the
browser tour's buyer never saw its payment settle."""

from __future__ import annotations

import pytest
from django.core.cache import cache

pytestmark = pytest.mark.django_db


def test_a_busy_embedded_market_never_loses_a_channels_sequence():
    """The embedded server's cache (local memory) kept at most 300 entries and then dropped a
    third of them: the demo's per-bid digests pushed the buyers' sequence counters out."""
    from market.streams.publish import next_seq, publish

    cache.clear()
    first = next_seq("user.1.jobs")
    for n in range(2_000):
        publish("orders", {"order": {"id": n, "state": "open"}}, user_id=2, unchanged_key=f"bid:{n}")
    assert next_seq("user.1.jobs") == first + 1


def test_a_counter_lost_anyway_never_goes_back():
    """A counter can still go: Redis restarted without persistence, or evicted it. The next
    number is then above every earlier one, a gap the client recovers from with a
    snapshot, never a number it would ignore."""
    from market.streams.publish import _seq_key, next_seq

    cache.clear()
    numbers = [next_seq("pub.rounds") for _ in range(5)]
    assert numbers == list(range(numbers[0], numbers[0] + 5))
    cache.delete(_seq_key("pub.rounds"))
    after = next_seq("pub.rounds")
    assert after > numbers[-1] + 1, (numbers, after)
    assert next_seq("pub.rounds") == after + 1
    assert after < 2**53, "a JavaScript number holds it exactly"


def test_updates_batched_go_out_in_order_and_an_unchanged_one_once():
    """Issue 39: inside ``batched`` a round's updates go out together at the end, in the order
    published and numbered consecutively; data unchanged under its key is sent once, within
    the batch as across batches."""
    from market.streams.hub import hub
    from market.streams.publish import batched, current_seq, publish

    cache.clear()
    group = "user.7.orders"
    before = current_seq(group)
    with batched():
        publish("orders", {"order": {"id": 1, "state": "open"}}, user_id=7, unchanged_key="bid:1")
        publish("orders", {"order": {"id": 2, "state": "open"}}, user_id=7, unchanged_key="bid:2")
        publish("orders", {"order": {"id": 1, "state": "open"}}, user_id=7, unchanged_key="bid:1")  # the same again
        assert current_seq(group) == before, "nothing is sent before the block ends"
        publish("orders", {"order": {"id": 1, "state": "matched"}}, user_id=7, unchanged_key="bid:1")
    frames = [text for _, text in hub().history(group, before)]
    assert [(f'"id":{n}' in t, '"matched"' in t) for n, t in zip((1, 2, 1), frames, strict=True)] == [(True, False), (True, False), (True, True)]
    assert current_seq(group) == before + 3
    with batched():
        publish("orders", {"order": {"id": 2, "state": "open"}}, user_id=7, unchanged_key="bid:2")  # sent last batch
    assert current_seq(group) == before + 3

"""The uniform pricing rule as pricing.py documents it (issue 29): one price per
bucket whenever the traded asks and max prices allow one (``lo <= hi``), each
trade clamped to its own limits when they do not, and never a trade outside
[its offer's ask, its bid's max price]."""

from __future__ import annotations

from collections import defaultdict

import pytest

from market.engine import RoundInput, RoundResult, Trade, Weights, clear_round
from tests.bench.instances import FAMILIES
from tests.unit.engine.engine_builders import bid, offer, round_of, with_config

FLAT = Weights(0.0, 0.0, 0.0, 0.0)  # a pure price market: no bonus lifting a bid above its max


def paid(res: RoundResult) -> dict[int, int]:
    return {t.bid_id: t.price for t in res.trades}


def bucket_price(res: RoundResult) -> int | None:
    (p,) = [p for p in res.prices if p.trades]
    return p.price


def test_a_bucket_with_room_between_winners_and_losers_pays_one_price_just_above_the_best_loser() -> None:
    # winners: bids 1 and 2 on offers of 1.00 and 1.20 (lo 1.20, hi 1.80); the loser
    # bid 3 at 1.30 could have traded (ub), the unsold offer asks 1.40 (ua)
    offers = [offer(i, gpus=1, ask=a) for i, a in ((1, 1_000_000), (2, 1_200_000), (3, 1_400_000))]
    bids = [bid(i, max_price=m, weights=FLAT) for i, m in ((1, 2_000_000), (2, 1_800_000), (3, 1_300_000))]
    inp = round_of(offers, bids)
    res = clear_round(inp)
    assert paid(res) == {1: 1_300_001, 2: 1_300_001}
    assert bucket_price(res) == 1_300_001
    mid = clear_round(with_config(inp, price_point=0.5))
    assert paid(mid) == {1: 1_350_000, 2: 1_350_000}  # 1,300,001 + int(99,998 * 0.5)


def test_an_empty_interval_with_room_in_lo_hi_still_pays_one_price() -> None:
    # bid 3 (8 GPUs, max 2.00) lost to bids 1 and 2 (4 GPUs each, max 1.80 and 2.50) on
    # surplus, not price: ub = 2.00 > hi = 1.80, so the interval is empty; [lo, hi] is not
    offers = [offer(1, gpus=8, ask=1_000_000)]
    bids = [
        bid(1, gpus=4, max_price=1_800_000, weights=FLAT),
        bid(2, gpus=4, max_price=2_500_000, weights=FLAT),
        bid(3, gpus=8, max_price=2_000_000, weights=FLAT),
    ]
    inp = round_of(offers, bids)
    res = clear_round(inp)
    assert paid(res) == {1: 1_000_000, 2: 1_000_000}  # lo
    mid = clear_round(with_config(inp, price_point=0.5))
    assert paid(mid) == {1: 1_400_000, 2: 1_400_000}  # lo + (hi - lo) / 2


def test_a_bucket_whose_cheap_bid_trades_below_a_dear_ask_pays_each_trade_clamped_to_its_limits() -> None:
    # bid 2 (max 3.00) needs reliability 0.95, which only offer 2 (2.00) has; bid 1 (max 1.50)
    # can afford only offer 1 (1.00): lo = 2.00 > hi = 1.50, so no one price fits both trades
    offers = [offer(1, gpus=1, ask=1_000_000, reliability=0.90), offer(2, gpus=1, ask=2_000_000)]
    bids = [
        bid(1, max_price=1_500_000, weights=FLAT),
        bid(2, max_price=3_000_000, weights=FLAT, min_reliability=0.95),
    ]
    inp = round_of(offers, bids)
    res = clear_round(inp)
    assert {(t.bid_id, t.offer_id) for t in res.trades} == {(1, 1), (2, 2)}
    assert paid(res) == {1: 1_500_000, 2: 2_000_000}  # min(lo, max price)
    assert bucket_price(res) == 2_000_000  # lo
    mid = clear_round(with_config(inp, price_point=0.5))
    assert bucket_price(mid) == 1_750_000  # lo + int((hi - lo) * 0.5)
    assert paid(mid) == {1: 1_500_000, 2: 2_000_000}  # 1.75 clamped to [1.00, 1.50] and [2.00, 3.00]


SWEEP = ("heavy_tailed", "narrow_models", "multi_machine", "fair_share", "ties", "all_spot")


def test_spot_is_priced_apart_from_the_classes_above_it() -> None:
    # issue 31: spot may be preempted, so it clears at its own price. On one 2-GPU offer at
    # 1.00, on-demand bid 1 (1 GPU, up to 3.00) beats on-demand bid 2 (both GPUs, up to 1.90),
    # which could have traded: the on-demand price is 1.900001; spot bid 3 takes the other GPU
    # and, with no spot bid against it, pays the ask (before: 1.50, the on-demand price
    # clamped to its own max)
    offers = [offer(1, gpus=2, ask=1_000_000)]
    bids = [bid(1, max_price=3_000_000, weights=FLAT), bid(2, gpus=2, max_price=1_900_000, weights=FLAT),
            bid(3, max_price=1_500_000, weights=FLAT, klass="spot")]
    res = clear_round(round_of(offers, bids))
    assert paid(res) == {1: 1_900_001, 3: 1_000_000}
    (p,) = res.prices
    assert (p.price, p.spot_price) == (1_900_001, 1_000_000)
    assert "spot clearing price 1.00 USDC/GPU-h" in next(t.reason for t in res.trades if t.bid_id == 3)
    # a losing spot bid that could have traded lifts the spot price, not the on-demand one
    res = clear_round(round_of(offers, [*bids, bid(4, max_price=1_200_000, weights=FLAT, klass="spot")]))
    assert paid(res) == {1: 1_900_001, 3: 1_200_001}
    # only spot traded: the bucket's price is spot's
    res = clear_round(round_of(offers, [bids[2]]))
    assert (res.prices[0].price, res.prices[0].spot_price) == (1_000_000, 1_000_000)


def check_rule(inp: RoundInput, res: RoundResult) -> tuple[int, int]:
    """Asserts the documented rule on every traded bucket; returns (buckets, buckets with lo > hi)."""
    offers = {o.id: o for o in inp.offers}
    bids = {b.id: b for b in inp.bids}
    pp = inp.config.price_point
    # spot is priced apart: its trades are a group of their own (pricing.py)
    spot = {(p.gpu_model, p.region, True): p.spot_price for p in res.prices}
    published = {(p.gpu_model, p.region, False): p.price for p in res.prices} | spot
    by_bucket: defaultdict[tuple[str, str, bool], list[Trade]] = defaultdict(list)
    for t in res.trades:
        # (a) never outside the trade's own limits
        assert offers[t.offer_id].ask <= t.price <= bids[t.bid_id].max_price, t
        by_bucket[(t.gpu_model, t.region, bids[t.bid_id].klass == "spot")].append(t)
    for (m, r, is_spot) in by_bucket:
        if is_spot and (m, r, False) not in by_bucket:  # only spot traded: its price is the bucket's
            assert next(p.price for p in res.prices if (p.gpu_model, p.region) == (m, r)) == spot[(m, r, True)]
    clamped = 0
    for key, trades in by_bucket.items():
        lo = max(offers[t.offer_id].ask for t in trades)
        hi = min(bids[t.bid_id].max_price for t in trades)
        price = published[key]
        assert price is not None
        if lo <= hi:
            # (b) one price for the bucket, inside [lo, hi] (the interval, when not empty, lies within)
            assert lo <= price <= hi, key
            assert {t.price for t in trades} == {price}, key
        else:
            # (c) the fallback: the point of [lo, hi], each trade clamped to its limits
            clamped += 1
            assert price == lo + int((hi - lo) * pp), key
            for t in trades:
                assert t.price == min(max(price, offers[t.offer_id].ask), bids[t.bid_id].max_price), t
    return len(by_bucket), clamped


@pytest.mark.parametrize("price_point", [0.0, 0.5])
def test_seeded_rounds_follow_the_documented_rule_in_every_bucket(price_point: float) -> None:
    buckets = clamped = 0
    for name in SWEEP:
        for seed in (0, 1):
            inp = with_config(FAMILIES[name](seed, 40), price_point=price_point)
            b, c = check_rule(inp, clear_round(inp))
            buckets += b
            clamped += c
    assert buckets > 0
    assert 0 < clamped < buckets  # both branches of the rule ran

"""Pricing rules, explanations, validation, empty rounds, determinism."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from market.engine import (
    DEFAULT_WEIGHTS,
    Bid,
    EngineInputError,
    RunningJob,
    Weights,
    clear_round,
)
from market.engine.serialize import digest, input_from_dict, input_to_dict, result_to_dict
from tests.bench.instances import make_round
from tests.unit.engine.engine_builders import bid, offer, round_of, with_config


def market_round() -> object:
    offers = [offer(i, gpus=1, ask=1_000_000 + 100_000 * i) for i in range(1, 6)]
    # a pure price market: no reliability bonus lifting a bid above its max
    flat = Weights(0.0, 0.0, 0.0, 0.0)
    bids = [bid(i, max_price=1_050_000 + 150_000 * i, weights=flat) for i in range(1, 6)]
    return round_of(offers, bids)


@pytest.mark.parametrize("rule", ["uniform", "pay_as_ask"])
def test_every_trade_is_individually_rational_and_budget_balanced(rule: str) -> None:
    inp = with_config(make_round(120, 120, seed=3), pricing=rule)
    res = clear_round(inp)
    offers = {o.id: o for o in inp.offers}
    bids = {b.id: b for b in inp.bids}
    assert res.trades
    for t in res.trades:
        assert offers[t.offer_id].ask <= t.price <= bids[t.bid_id].max_price
        assert t.amount == t.price * t.gpus * t.duration_s // 3600


def test_uniform_price_is_one_price_between_marginal_orders() -> None:
    inp = market_round()
    res = clear_round(inp)  # type: ignore[arg-type]
    prices = {t.price for t in res.trades}
    assert len(prices) == 1
    price = prices.pop()
    matched_bids = {t.bid_id for t in res.trades}
    matched_offers = {t.offer_id for t in res.trades}
    for b in inp.bids:  # type: ignore[attr-defined]
        if b.id not in matched_bids:
            assert b.max_price < price, "an unmatched bid would have paid the price"
    for o in inp.offers:  # type: ignore[attr-defined]
        if o.id not in matched_offers:
            assert o.ask > price, "an unmatched offer would have accepted the price"
    bucket = [p for p in res.prices if p.price is not None]
    assert bucket[0].price == price and bucket[0].volume_gpus == len(res.trades)


def test_pay_as_ask_charges_each_offer_its_ask() -> None:
    res = clear_round(with_config(market_round(), pricing="pay_as_ask"))  # type: ignore[arg-type]
    assert all(t.price == 1_000_000 + 100_000 * t.offer_id for t in res.trades)


def test_unmatched_bid_hears_price_and_latency_reasons_with_nearest_offer() -> None:
    offers = [offer(1, ask=2_400_000), offer(2, ask=2_000_000, region="us-east")]
    b = bid(1, gpus=8, max_price=2_100_000, location_region="eu-west", max_latency_ms=40.0)
    res = clear_round(round_of(offers, [b]))
    (u,) = res.unmatched
    text = " | ".join(u.reasons)
    assert "cheapest ask 2.40 USDC/GPU-h" in text and "your max 2.10 USDC/GPU-h" in text
    assert "85 ms" in text and "40 ms" in text
    assert u.nearest is not None and "offer 1" in u.nearest


def test_outbid_bid_is_told_it_lost_to_higher_scoring_bids() -> None:
    res = clear_round(round_of([offer(1, gpus=1)], [bid(1, max_price=5_000_000), bid(2)]))
    (u,) = res.unmatched
    assert any("outbid" in r for r in u.reasons)


def test_trade_says_why_its_offer_won() -> None:
    res = clear_round(round_of([offer(1)], [bid(1)]))
    assert "ask 2.00 USDC/GPU-h within your max 3.00 USDC/GPU-h" in res.trades[0].reason


def test_spot_job_is_suggested_for_preemption_by_a_waiting_reserved_bid() -> None:
    running = (RunningJob(trade_id=77, offer_id=1, machine_id=1001, gpus=4, klass="spot", price=1),)
    inp = dataclasses.replace(round_of([offer(1, gpus=4)], [bid(1, gpus=8, klass="reserved")]), running=running)
    res = clear_round(inp)
    assert [(p.trade_id, p.for_bid_id) for p in res.preemptions] == [(77, 1)]


def spot(trade_id: int, offer_id: int, gpus: int, price: int = 1_000_000, stopping: bool = False) -> RunningJob:
    return RunningJob(trade_id=trade_id, offer_id=offer_id, machine_id=1000 + offer_id, gpus=gpus, klass="spot", price=price, stopping=stopping)


def test_an_offer_spot_jobs_fill_is_seen_and_only_the_spot_gpus_a_bid_needs_are_preempted() -> None:
    # issue 31: an offer whose GPUs spot jobs hold all of had no free GPU, so it was not in the
    # round at all, and the waiting bid read "no offers of ..."; now it is ``occupied``
    full = offer(1, gpus=4)
    jobs = (spot(71, 1, 1, price=900_000), spot(72, 1, 2, price=800_000), spot(73, 1, 1, price=1_100_000))
    inp = dataclasses.replace(round_of([], [bid(1, gpus=3, klass="on_demand")]), running=jobs, occupied=(full,))
    res = clear_round(inp)
    # the cheapest spot jobs first, until the bid's 3 GPUs are there: 72 (2) then 71 (1)
    assert [(p.trade_id, p.for_bid_id) for p in res.preemptions] == [(72, 1), (71, 1)]
    assert "blocks on_demand bid 1 for 3 GPUs" in res.preemptions[0].reason
    assert "2 spot jobs are told to stop for you" in " ".join(res.unmatched[0].reasons), res.unmatched
    # jobs already told to stop count first, and are not preempted again
    res = clear_round(dataclasses.replace(inp, running=(spot(71, 1, 1, price=900_000, stopping=True), *jobs[1:])))
    assert [p.trade_id for p in res.preemptions] == [72]
    res = clear_round(dataclasses.replace(inp, running=tuple(dataclasses.replace(j, stopping=True) for j in jobs)))
    assert res.preemptions == (), "enough GPUs are on their way back already"


def test_free_gpus_count_and_the_offer_needing_the_fewest_preempted_wins() -> None:
    # offer 1: 1 GPU free and a 1-GPU spot job; offer 2 (cheaper): none free, a 2-GPU spot job
    inp = dataclasses.replace(round_of([offer(1, gpus=1, ask=1_500_000)], [bid(1, gpus=2, klass="reserved", max_price=3_000_000)]),
                              running=(spot(81, 1, 1), spot(82, 2, 2)), occupied=(offer(2, gpus=2, ask=1_000_000),))
    res = clear_round(inp)
    assert [(p.trade_id, p.for_bid_id) for p in res.preemptions] == [(81, 1)]
    # a spot bid never preempts, and a bid that cannot use the offer does not either
    for b in (bid(1, gpus=2, klass="spot"), bid(1, gpus=2, klass="on_demand", max_price=900_000), bid(1, gpus=2, gpu_models=("A100",))):
        assert clear_round(dataclasses.replace(inp, bids=(b,))).preemptions == (), b


def test_an_occupied_offer_is_validated_replayed_and_never_traded() -> None:
    inp = dataclasses.replace(round_of([offer(1, gpus=1)], [bid(1, gpus=1), bid(2, gpus=1)]), running=(spot(91, 2, 1),), occupied=(offer(2, gpus=1),))
    res = clear_round(inp)
    assert {t.offer_id for t in res.trades} == {1}, "nothing is free on an occupied offer"
    (waiting,) = [u.bid_id for u in res.unmatched]
    assert [(p.trade_id, p.for_bid_id) for p in res.preemptions] == [(91, waiting)]
    assert input_from_dict(input_to_dict(inp)) == inp
    assert digest(result_to_dict(clear_round(input_from_dict(input_to_dict(inp))))) == digest(result_to_dict(res))
    with pytest.raises(EngineInputError) as err:
        clear_round(dataclasses.replace(inp, occupied=(offer(1, gpus=1),)))
    assert err.value.field == "occupied[0].id"
    with pytest.raises(EngineInputError) as err:
        clear_round(dataclasses.replace(inp, occupied=(offer(2, gpus=1, ask=-5),)))
    assert err.value.field == "occupied[0].ask"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda b: dataclasses.replace(b, max_price=-1), "bids[0].max_price"),
        (lambda b: dataclasses.replace(b, gpus=0), "bids[0].gpus"),
        (lambda b: dataclasses.replace(b, allowed_regions=("mars",)), "bids[0].allowed_regions[0]"),
        (
            lambda b: dataclasses.replace(b, weights=Weights(math.nan, 0.0, 0.0, 0.0)),
            "bids[0].weights.latency_per_ms",
        ),
        (lambda b: dataclasses.replace(b, klass="vip"), "bids[0].klass"),
    ],
)
def test_bad_bid_raises_one_error_naming_the_field(change: object, field: str) -> None:
    bad: Bid = change(bid(1))  # type: ignore[operator]
    with pytest.raises(EngineInputError) as err:
        clear_round(round_of([offer(1)], [bad]))
    assert err.value.field == field


def test_bad_offer_raises_naming_the_field() -> None:
    with pytest.raises(EngineInputError) as err:
        clear_round(round_of([offer(1), offer(2, ask=-5)], []))
    assert err.value.field == "offers[1].ask"


def test_bad_shape_from_dict_raises_naming_the_field() -> None:
    d = input_to_dict(round_of([offer(1)], [bid(1)]))
    del d["bids"][0]["max_price"]
    with pytest.raises(EngineInputError) as err:
        input_from_dict(d)
    assert err.value.field == "input.bids[0].max_price"


@pytest.mark.parametrize(("n_offers", "n_bids"), [(0, 0), (0, 3), (3, 0)])
def test_round_without_both_sides_is_a_valid_empty_round(n_offers: int, n_bids: int) -> None:
    res = clear_round(round_of([offer(i) for i in range(1, n_offers + 1)], [bid(i) for i in range(1, n_bids + 1)]))
    assert res.trades == () and res.stats.surplus == 0
    assert len(res.unmatched) == n_bids


def test_same_input_in_any_order_gives_the_same_digest() -> None:
    inp = make_round(150, 150, seed=5)
    first = digest(result_to_dict(clear_round(inp)))
    rng = random.Random(1)
    offers, bids = list(inp.offers), list(inp.bids)
    rng.shuffle(offers)
    rng.shuffle(bids)
    shuffled = dataclasses.replace(inp, offers=tuple(offers), bids=tuple(bids))
    assert digest(result_to_dict(clear_round(shuffled))) == first
    replayed = input_from_dict(input_to_dict(inp))
    assert digest(result_to_dict(clear_round(replayed))) == first


def test_price_point_places_the_uniform_price_within_the_clearing_interval() -> None:
    import dataclasses

    from market.engine import RoundConfig

    inp = market_round()
    bottom = {t.price for t in clear_round(inp).trades}  # type: ignore[arg-type]
    middle = {t.price for t in clear_round(dataclasses.replace(inp, config=RoundConfig(price_point=0.5))).trades}  # type: ignore[arg-type]
    top = {t.price for t in clear_round(dataclasses.replace(inp, config=RoundConfig(price_point=1.0))).trades}  # type: ignore[arg-type]
    assert len(bottom) == len(middle) == len(top) == 1
    assert bottom.pop() <= middle.pop() <= top.pop()


def test_a_lone_generous_buyer_pays_the_ask_by_default_not_halfway_to_its_max() -> None:
    from tests.unit.engine.engine_builders import bid, offer, round_of

    res = clear_round(round_of([offer(1, ask=1_370_000, gpus=1)], [bid(1, max_price=9_000_000)]))
    assert [t.price for t in res.trades] == [1_370_000]


def test_screen_sets_aside_each_bad_order_with_its_field_and_keeps_the_rest() -> None:
    from market.engine import limits, screen

    inp = round_of(
        [offer(1), offer(2, ask=limits.MAX_PRICE + 1)],
        [bid(1), bid(2, max_price=10**15), bid(3, weights=dataclasses.replace(DEFAULT_WEIGHTS, reliability=1e15))],
    )
    kept, aside = screen(inp)
    assert [o.id for o in kept.offers] == [1] and [b.id for b in kept.bids] == [1]
    assert [(a.kind, a.id, a.field) for a in aside] == [
        ("offer", 2, "ask"), ("bid", 2, "max_price"), ("bid", 3, "weights.reliability")]
    assert "at most 1,000,000,000,000" in aside[1].message
    assert clear_round(kept).trades, "the rest still clears"


def test_screen_still_refuses_what_no_order_owner_could_fix() -> None:
    from market.engine import screen

    inp = round_of([offer(1), offer(1)], [bid(1)])
    with pytest.raises(EngineInputError) as err:
        screen(inp)
    assert err.value.field == "offers[1].id"


def test_screen_of_a_clean_round_is_the_round() -> None:
    from market.engine import screen

    inp = round_of([offer(1), offer(2)], [bid(1), bid(2)])
    kept, aside = screen(inp)
    assert kept == inp and aside == ()


def test_screen_names_a_duplicate_by_its_place_in_the_input_after_a_set_aside() -> None:
    from market.engine import limits, screen

    inp = round_of([offer(1, ask=limits.MAX_PRICE + 1), offer(2), offer(2)], [bid(1)])
    with pytest.raises(EngineInputError) as err:
        screen(inp)
    assert err.value.field == "offers[2].id"


def test_free_gpus_are_promised_to_one_waiting_bid_only() -> None:
    # review: an offer with 1 GPU free and two 1-GPU spot jobs; two on-demand bids for 2 GPUs
    # each both counted the free GPU, so both jobs were preempted though one bid fits
    inp = dataclasses.replace(round_of([offer(1, gpus=1)], [bid(1, gpus=2, klass="on_demand"), bid(2, gpus=2, klass="on_demand")]),
                              running=(spot(101, 1, 1), spot(102, 1, 1)))
    res = clear_round(inp)
    assert len(res.preemptions) == 1, res.preemptions

"""Issue 29's reproducers: overflow, a crash, a price a losing bid could move,
wrong explanations and validation gaps, each on input the engine accepts."""

from __future__ import annotations

import dataclasses

import pytest

from market.engine import EngineInputError, Region, Weights, clear_round, limits
from tests.unit.engine.engine_builders import LATENCY, REGIONS, bid, offer, round_of

FLAT = Weights(0.0, 0.0, 0.0, 0.0)
TEN_YEARS = limits.MAX_DURATION_S


# 2. a crash explaining an unmatched bid ---------------------------------------------


def test_unmatched_bid_with_location_but_no_latency_row_is_explained_not_crashed() -> None:
    regions = (*REGIONS, Region("ap-south", 600.0))
    inp = dataclasses.replace(
        round_of([offer(1, region="ap-south")], [bid(1, location_region="eu-west")]),
        regions=regions,
    )
    res = clear_round(inp)
    assert not res.trades
    (u,) = res.unmatched
    text = " ".join(u.reasons)
    assert "ap-south" in text and "latency" in text
    assert "None" not in text


# 3. a losing bid that could never trade moves the price -------------------------------


def test_a_bid_no_offer_can_serve_does_not_move_the_uniform_price() -> None:
    shill = bid(2, max_price=4_900_000, min_reliability=1.0, weights=FLAT)
    winner = bid(1, max_price=5_000_000, weights=FLAT)
    honest = clear_round(round_of([offer(1, gpus=1, ask=1_000_000)], [winner]))
    shilled = clear_round(round_of([offer(1, gpus=1, ask=1_000_000)], [winner, shill]))
    assert [t.price for t in honest.trades] == [1_000_000]
    assert [(t.bid_id, t.price) for t in shilled.trades] == [(1, 1_000_000)]


def test_a_bid_of_the_wrong_class_does_not_move_the_uniform_price() -> None:
    winner = bid(1, max_price=5_000_000, weights=FLAT, klass="reserved")
    shill = bid(2, max_price=4_900_000, weights=FLAT, klass="spot")
    res = clear_round(round_of([offer(1, gpus=1, ask=1_000_000, spot_allowed=False)], [winner, shill]))
    assert [(t.bid_id, t.price) for t in res.trades] == [(1, 1_000_000)]


def test_a_losing_bid_that_could_have_traded_still_sets_the_price() -> None:
    winner = bid(1, max_price=5_000_000, weights=FLAT)
    loser = bid(2, max_price=4_900_000, weights=FLAT)
    res = clear_round(round_of([offer(1, gpus=1, ask=1_000_000)], [winner, loser]))
    assert [(t.bid_id, t.price) for t in res.trades] == [(1, 4_900_001)]


# 4. explanations ----------------------------------------------------------------------


def test_a_bid_past_its_deadline_is_not_told_its_penalties_exceed_its_margin() -> None:
    inp = round_of([offer(1)], [bid(1, duration_s=7200)])
    inp = dataclasses.replace(inp, bids=(dataclasses.replace(inp.bids[0], deadline=inp.now + 3600),))
    (u,) = clear_round(inp).unmatched
    text = " ".join(u.reasons)
    assert "deadline" in text
    assert "penalties" not in text and "outbid" not in text


def test_a_region_is_zero_ms_from_itself_without_a_latency_row() -> None:
    no_self = tuple(row for row in LATENCY if row[0] != row[1])
    inp = dataclasses.replace(
        round_of([offer(1, region="eu-west")], [bid(1, location_region="eu-west", max_latency_ms=5.0)]),
        latency_ms=no_self,
    )
    res = clear_round(inp)
    assert [t.bid_id for t in res.trades] == [1]
    assert "0 ms from eu-west" in res.trades[0].reason


# 5. validation gaps -------------------------------------------------------------------


def test_none_among_the_bids_is_a_validation_error() -> None:
    inp = round_of([offer(1)], [bid(1)])
    with pytest.raises(EngineInputError) as err:
        clear_round(dataclasses.replace(inp, bids=(inp.bids[0], None)))  # type: ignore[arg-type]
    assert err.value.field == "bids[1]"


def test_none_among_the_offers_is_a_validation_error() -> None:
    inp = round_of([offer(1)], [bid(1)])
    with pytest.raises(EngineInputError) as err:
        clear_round(dataclasses.replace(inp, offers=(None, inp.offers[0])))  # type: ignore[arg-type]
    assert err.value.field == "offers[0]"


def test_generators_of_orders_clear_like_tuples() -> None:
    inp = round_of([offer(1), offer(2)], [bid(1), bid(2)])
    want = clear_round(inp)
    lazy = dataclasses.replace(
        inp,
        offers=(o for o in inp.offers),  # type: ignore[arg-type]
        bids=(b for b in inp.bids),  # type: ignore[arg-type]
        latency_ms=(row for row in inp.latency_ms),  # type: ignore[arg-type]
    )
    got = clear_round(lazy)
    assert got == want and len(got.trades) == 2


def test_orders_that_are_not_a_collection_are_a_validation_error() -> None:
    inp = round_of([offer(1)], [bid(1)])
    with pytest.raises(EngineInputError) as err:
        clear_round(dataclasses.replace(inp, bids=None))  # type: ignore[arg-type]
    assert err.value.field == "bids"

"""Issue 29's reproducers: overflow, a crash, a price a losing bid could move,
wrong explanations and validation gaps, each on input the engine accepts."""

from __future__ import annotations

import dataclasses

import pytest

from market.engine import EngineInputError, Weights, clear_round, limits
from tests.unit.engine.engine_builders import bid, offer, round_of

FLAT = Weights(0.0, 0.0, 0.0, 0.0)
TEN_YEARS = limits.MAX_DURATION_S


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

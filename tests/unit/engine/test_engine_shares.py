"""Shares of one GPU (issue 38, engine 1.16.0, ``market/engine/shares.py``): a bid for part of a
GPU, taken in eighths from an offer that sells its GPUs in parts. Worked out by hand."""

from __future__ import annotations

import pytest

from market.engine import EngineInputError, clear_round, screen, serialize, shares
from tests.unit.engine.engine_builders import bid, offer, round_of

# offer 1 sells its 4 H100s in eighths: 8 free on GPU 0, 3 on GPU 1, none on GPU 2, 5 on GPU 3,
# at 2.00 USD per GPU-hour (0.25 an eighth); offer 2 sells 2 whole H100s at 1.00
SHARED = offer(1, gpus=4, shares=(8, 3, 0, 5), ask=2_000_000)
WHOLE = offer(2, gpus=2, ask=1_000_000)


def trades(offers, bids):  # type: ignore[no-untyped-def]
    res = clear_round(round_of(offers, bids))
    return {t.bid_id: t for t in res.trades}, res


def test_eighths_rounded_up() -> None:
    assert [shares.units(m) for m in (1, 125, 126, 300, 500, 875, 999)] == [1, 1, 2, 3, 4, 7, 8]


def test_shares_land_on_gpus_with_room_and_pay_their_part_of_the_price() -> None:
    # 4, 3 and 5 eighths: GPU 0 (8) takes the 4, GPU 1 (3) the 3, GPU 3 (5) the 5
    got, res = trades([SHARED, WHOLE], [bid(1, gpu_milli=500), bid(2, gpu_milli=300), bid(3, gpu_milli=600), bid(4, max_price=1_500_000)])
    assert {b: (t.offer_id, t.gpu_index, t.gpus, t.gpu_milli) for b, t in got.items()} == {
        1: (1, 0, 1, 500), 2: (1, 1, 1, 375), 3: (1, 3, 1, 625), 4: (2, None, 1, 1000)}
    share = got[1]
    assert share.gpu_model == "H100"
    # the eighths' bucket clears at its ask, 0.25 an eighth-hour: 2.00 per whole GPU-hour, and
    # half a GPU for an hour costs 1.00
    assert share.price == 2_000_000 and share.amount == 1_000_000
    assert got[2].amount == 750_000 and got[3].amount == 1_250_000
    assert got[4].price == 1_000_000 and got[4].gpu_milli == 1000, "the whole bid takes the whole GPUs"
    prices = {p.gpu_model: p for p in res.prices}
    assert prices["H100/8"].price == 250_000 and prices["H100/8"].volume_gpus == 12


def test_no_gpu_is_sold_past_its_free_eighths() -> None:
    # 11 eighths free on two GPUs (8 and 3): two bids of 5 eighths fit in the total, but only one
    # fits on a GPU; the other is told why, in eighths
    two = offer(1, gpus=2, shares=(8, 3), ask=2_000_000)
    got, res = trades([two], [bid(1, gpu_milli=600), bid(2, gpu_milli=600)])
    assert len(got) == 1
    (t,) = got.values()
    assert (t.gpu_index, t.gpu_milli) == (0, 625)
    (lost,) = res.unmatched
    assert lost.bid_id != t.bid_id
    assert "fewer than 5 eighths free on one GPU (largest 3); ask for a smaller share" in lost.reasons[0], lost.reasons
    assert lost.nearest == "offer 1 GPU 1: 3 eighths of an H100 in eu-west at 2.00 USDC/GPU-h", "in the buyer's terms: the offer it bid on, prices per GPU-hour"
    assert "pays the H100 shares' eu-west clearing price 2.00 USDC/GPU-h" in t.reason


def test_whole_bids_and_share_bids_keep_to_their_own_offers() -> None:
    got, res = trades([SHARED], [bid(1, max_price=9_000_000)])
    assert not got, "a whole GPU is not sold from a partitioned one"
    got, res = trades([WHOLE], [bid(1, gpu_milli=500, max_price=9_000_000)])
    assert not got, "a share bid takes offers that sell shares"
    # a whole bid that names no model takes no share model
    got, _ = trades([SHARED, WHOLE], [bid(1, gpu_models=(), max_price=9_000_000)])
    assert {b: t.offer_id for b, t in got.items()} == {1: 2}


def test_a_share_bid_never_pays_more_than_its_limit() -> None:
    # a limit of 1.999999 per GPU-hour is 0.249999 an eighth, under the 0.25 asked
    got, _ = trades([SHARED], [bid(1, gpu_milli=500, max_price=1_999_999)])
    assert not got
    got, _ = trades([SHARED], [bid(1, gpu_milli=500, max_price=2_000_000)])
    assert got[1].price == 2_000_000


def test_a_share_needs_its_memory_of_the_share() -> None:
    # an eighth of an 80 GB H100 is 10 GB: 4 eighths give 40, not 41
    got, _ = trades([SHARED], [bid(1, gpu_milli=500, min_memory_gib=41)])
    assert not got
    got, _ = trades([SHARED], [bid(1, gpu_milli=500, min_memory_gib=40)])
    assert got[1].gpu_milli == 500


def test_a_round_without_shares_is_cleared_as_it_was() -> None:
    inp = round_of([WHOLE], [bid(1)])
    assert shares.split(inp) == (inp, None)


def test_bad_shares_are_refused_by_name() -> None:
    cases = [
        ([offer(1, gpus=2, shares=(8,))], [], "offers[0].shares"),
        ([offer(1, gpus=2, shares=(8, 9))], [], "offers[0].shares[1]"),
        ([offer(1, gpus=2, shares=(0, 0))], [], "offers[0].shares"),
        ([WHOLE], [bid(1, gpus=2, gpu_milli=500)], "bids[0].gpu_milli"),
        ([WHOLE], [bid(1, gpu_milli=0)], "bids[0].gpu_milli"),
        ([WHOLE], [bid(1, gpu_milli=1001)], "bids[0].gpu_milli"),
    ]
    for offers, bids, field in cases:
        with pytest.raises(EngineInputError) as err:
            clear_round(round_of(offers, bids))
        assert err.value.field == field, (field, err.value)
    kept, aside = screen(round_of([WHOLE], [bid(1, gpus=2, gpu_milli=500), bid(2)]))
    assert [b.id for b in kept.bids] == [2] and aside[0].field == "gpu_milli" and "gpus must be 1" in aside[0].message


def test_a_round_with_shares_replays_from_its_stored_form() -> None:
    inp = round_of([SHARED, WHOLE], [bid(1, gpu_milli=500), bid(2, gpu_milli=300), bid(3)])
    again = serialize.input_from_dict(serialize.input_to_dict(inp))
    assert again == inp
    assert serialize.digest(clear_round(again)) == serialize.digest(clear_round(inp))

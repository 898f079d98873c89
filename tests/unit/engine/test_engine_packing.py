"""Packing (issue 38, engine 1.14.0): a trade moves to another offer of its bucket that
leaves the bucket less fragmented for the book, within a tie band of value and at no more
than the price its buyer pays. Worked out by hand."""

from __future__ import annotations

from market.engine import RoundConfig, clear_round, serialize
from market.engine.pack import demand_of, fragmentation
from tests.unit.engine.engine_builders import bid, offer, round_of

# A: 4 GPUs at 1.90; B: 1 GPU at 1.95, reliability 0.5; C: a whole 8-GPU machine at 2.00.
# Two 4-GPU bids take A and half of C; the 1-GPU bid prefers C to B: reliability is worth
# 0.2 USD x (0.99 - 0.5) = 0.098 per GPU-hour to it, 0.048 more than B's 0.05 lower ask.
# An 8-GPU bid cannot pay (max 1.00): it loses, and tells the book 8-GPU jobs are coming.
OFFERS = [offer(1, gpus=4, ask=1_900_000), offer(2, gpus=1, ask=1_950_000, reliability=0.5), offer(3, gpus=8, ask=2_000_000)]
BIDS = [bid(1, gpus=4), bid(2, gpus=4), bid(3, gpus=1), bid(4, gpus=8, max_price=1_000_000)]


def placed(band: int) -> tuple[dict[int, int], object]:
    res = clear_round(round_of(OFFERS, BIDS, config=RoundConfig(pack_band=band)))
    return {t.bid_id: t.offer_id for t in res.trades}, res


def test_the_fragmentation_of_an_offer_for_the_books_demand() -> None:
    res = round_of(OFFERS, BIDS)
    from market.engine.market import build_market

    demand = demand_of(build_market(res))
    assert demand == {1: 0.25, 4: 0.5, 8: 0.25}
    assert fragmentation(3, demand) == 0.5 * 3 + 0.25 * 3  # 3 free: no use to 4- or 8-GPU jobs
    assert fragmentation(4, demand) == 0.25 * 4
    assert fragmentation(8, demand) == 0.0


def test_without_packing_the_one_gpu_job_breaks_the_whole_machine() -> None:
    where, res = placed(0)
    assert where == {1: 1, 2: 3, 3: 3} or where == {1: 3, 2: 1, 3: 3}
    assert "packing" not in res.stats.method  # type: ignore[attr-defined]


def test_packing_moves_it_to_the_single_gpu_at_the_same_price() -> None:
    """Left on C, C keeps 3 GPUs free (lost to 4- and 8-GPU jobs: 2.25 GPUs expected) and B 1
    (0.75); moved to B, C keeps 4 (lost to 8-GPU jobs only: 1.0) and B none: 2.0 GPUs fewer
    stranded, for 0.048 USD per GPU-hour of the bid's value, inside a band of 0.05."""
    before, base = placed(0)
    where, res = placed(50_000)
    assert where[3] == 2, where
    t = next(t for t in res.trades if t.bid_id == 3)  # type: ignore[attr-defined]
    t0 = next(t for t in base.trades if t.bid_id == 3)  # type: ignore[attr-defined]
    assert t.price == t0.price == 2_000_000, "the buyer pays the bucket's price, as it did"
    assert "packed: placed here rather than on offer 3, at the same price" in t.reason
    stats = res.stats  # type: ignore[attr-defined]
    assert "packing (1 moved, 2.00 GPUs less fragmented)" in stats.method
    assert stats.surplus == base.stats.surplus - 48_000  # type: ignore[attr-defined]
    assert stats.upper_bound == base.stats.upper_bound and stats.gap > base.stats.gap  # type: ignore[attr-defined]


def test_outside_the_band_or_above_the_price_nothing_moves() -> None:
    where, res = placed(40_000)  # the move would cost 0.048: more than the band
    assert where[3] == 3 and "packing" not in res.stats.method  # type: ignore[attr-defined]
    dear = [OFFERS[0], offer(2, gpus=1, ask=2_010_000, reliability=0.5), OFFERS[2]]  # above the price the bid pays
    res = clear_round(round_of(dear, BIDS, config=RoundConfig(pack_band=500_000)))
    assert {t.bid_id: t.offer_id for t in res.trades}[3] == 3


def test_packing_replays_the_same_and_an_old_round_reads_without_it() -> None:
    inp = round_of(OFFERS, BIDS, config=RoundConfig(pack_band=50_000))
    a, b = clear_round(inp), clear_round(inp)
    assert serialize.digest(serialize.result_to_dict(a)) == serialize.digest(serialize.result_to_dict(b))
    stored = serialize.input_to_dict(round_of(OFFERS, BIDS))
    del stored["config"]["pack_band"]  # a round stored before 1.14.0
    assert serialize.input_from_dict(stored).config.pack_band == 0


def test_a_bid_that_needs_nvlink_takes_only_an_offer_whose_free_gpus_share_a_domain() -> None:
    """Two machines of 4 free GPUs: on one they are two NVLink pairs (2 in one domain), on the
    other an NVSwitch joins all 4; the cheaper is the pairs. A 4-GPU bid that needs NVLink
    takes the switch; one that does not, the cheaper."""
    pairs = offer(1, gpus=4, ask=1_900_000, nvlink_gpus=2)
    switch = offer(2, gpus=4, ask=2_100_000, nvlink_gpus=4)
    res = clear_round(round_of([pairs, switch], [bid(1, gpus=4, needs_nvlink=True)]))
    assert [t.offer_id for t in res.trades] == [2]
    res = clear_round(round_of([pairs, switch], [bid(1, gpus=4)]))
    assert [t.offer_id for t in res.trades] == [1]
    res = clear_round(round_of([pairs], [bid(1, gpus=4, needs_nvlink=True)]))
    assert not res.trades
    assert any("fewer than 4 free GPUs in one NVLink domain (largest 2)" in r for r in res.unmatched[0].reasons), res.unmatched[0].reasons


def test_needs_nvlink_across_machines_is_refused() -> None:
    import pytest

    from market.engine import EngineInputError

    with pytest.raises(EngineInputError, match="needs same_machine"):
        clear_round(round_of([offer(1)], [bid(1, gpus=2, needs_nvlink=True, same_machine=False)]))
    with pytest.raises(EngineInputError, match="nvlink_gpus"):
        clear_round(round_of([offer(1, gpus=2, nvlink_gpus=3)], [bid(1)]))

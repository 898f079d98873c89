"""Pairs of equal score (issue 35): each bid breaks the tie its own way, by ids.

At 10k orders a side of the ties family (one reliability, two asks per model), every
bid kept the same first offers of each view, in ask-then-id order: the LP's first
columns reached 199 of 8,633 offers with room, and the round cleared 0.717 of its bound.
"""

from __future__ import annotations

import numpy as np

from market.engine import clear_round
from market.engine.market import (
    Candidates,
    Market,
    build_market,
    price_out,
    tie_key,
    top_candidates,
)
from tests.unit.engine.engine_builders import bid, offer, round_of

# one view: 60 identical 8-GPU H100 offers, 30 identical 1-GPU bids
OFFERS = [offer(i) for i in range(1, 61)]
BIDS = [bid(i, buyer_id=500) for i in range(1, 31)]


def by_id(mkt: Market, c: Candidates) -> dict[int, list[int]]:
    """Each bid's kept offers, by the ids of both."""
    return {int(mkt.bids_id[i]): sorted(int(mkt.o_id[o]) for o in c.offers[i]) for i in range(len(mkt.bids))}


def test_bids_with_equal_scores_keep_different_offers_not_the_first_ones_of_the_view() -> None:
    mkt = build_market(round_of(OFFERS, BIDS))
    c = top_candidates(mkt, 2)
    kept = set(c.pair_offer.tolist())
    assert len(set(c.pair_score.tolist())) == 1  # every kept pair scores the same
    assert len(kept) >= 30, f"30 bids keeping 2 of 60 equal offers each reached only {sorted(kept)}"
    assert all(len(o) == 2 for o in c.offers)
    assert all(c.truncated)  # equal offers were left out: the bound must still cover them


def test_pricing_out_spreads_equal_reduced_scores_over_the_offers() -> None:
    mkt = build_market(round_of(OFFERS, BIDS))
    views = top_candidates(mkt, 2).views
    bids = np.arange(len(mkt.bids), dtype=np.int64)
    zero = np.zeros(len(mkt.offers), dtype=np.int64)
    red, nb, no, _ = price_out(mkt, bids, zero, np.zeros(len(bids), dtype=np.int64), views, mkt.o_gpus, width=2)
    assert len(set(red.tolist())) == 1 and len(nb) == 60
    assert len(set(no.tolist())) >= 30


def test_a_bids_choice_among_equal_offers_depends_on_ids_alone() -> None:
    """The same pairs whatever the order the book lists them in, and a bid keeps its
    offers when an offer it did not keep leaves the book."""
    a = top_candidates(build_market(round_of(OFFERS, BIDS)), 2)
    shuffled = [OFFERS[i] for i in np.random.default_rng(1).permutation(len(OFFERS)).tolist()]
    mkt_b = build_market(round_of(shuffled, BIDS[::-1]))
    b = top_candidates(mkt_b, 2)

    first = by_id(build_market(round_of(OFFERS, BIDS)), a)
    assert by_id(mkt_b, b) == first
    used = {o for v in first.values() for o in v}
    gone = next(o.id for o in OFFERS if o.id not in used)
    fewer = build_market(round_of([o for o in OFFERS if o.id != gone], BIDS))
    assert by_id(fewer, top_candidates(fewer, 2)) == first
    assert clear_round(round_of(OFFERS, BIDS)) == clear_round(round_of(OFFERS, BIDS))


def test_the_tie_key_is_a_fixed_function_of_the_two_ids() -> None:
    b = np.asarray([[1], [2], [3]], dtype=np.int64)
    o = np.asarray([[10, 11, 12, 13]], dtype=np.int64)
    k = tie_key(b, o)
    assert k.shape == (3, 4) and k.dtype == np.int64 and (k >= 0).all()
    assert (k == tie_key(b, o)).all()
    assert len({tuple(r) for r in np.argsort(k, axis=1).tolist()}) > 1  # not one order for every bid
    assert int(tie_key(np.asarray([1]), np.asarray([10]))[0]) == int(k[0, 0])

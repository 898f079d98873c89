"""A round cleared right after the round before it, as a running market clears it, gives
the result it gives alone, byte for byte (issue 35: whatever one round carries over to the
next, a replay from stored inputs must give the same trades)."""

from __future__ import annotations

from market.engine import RoundConfig, clear_round
from market.engine.serialize import digest, input_to_dict, result_to_dict
from tests.bench.instances import make_round, next_round


def test_the_next_round_changes_about_a_tenth_of_the_book_and_is_seeded() -> None:
    first = make_round(400, 400, seed=3, config=RoundConfig())
    nxt = next_round(first, seed=4)
    before, after = {b.id for b in first.bids}, {b.id for b in nxt.bids}
    assert len(after) == len(before) and len(before - after) == len(after - before) == 20  # 5% of the bids
    assert sum(1 for a, b in zip(first.offers, nxt.offers, strict=True) if a != b) == 20  # 5% of the offers
    assert digest(input_to_dict(next_round(first, seed=4))) == digest(input_to_dict(nxt))


def test_a_round_cleared_after_its_predecessor_equals_it_cleared_alone() -> None:
    first = make_round(300, 300, seed=5, config=RoundConfig())
    nxt = next_round(first, seed=6)
    clear_round(first)
    after = result_to_dict(clear_round(nxt))
    alone = result_to_dict(clear_round(nxt))
    clear_round(make_round(150, 150, seed=9, config=RoundConfig()))  # an unrelated round between
    again = result_to_dict(clear_round(nxt))
    assert digest(after) == digest(alone) == digest(again)

"""A big class's LP starts from the greedy's pairs too (issue 35): every bid of a view
ranks its offers alike, so their best pairs crowd onto the same cheapest offers, and the
LP over those alone was worth 0.43 of what the round then placed (all-spot, 10k a side)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from market.engine import assign, bound
from market.engine.assign import Solver, State, fair_share_limits, priority_order
from market.engine.market import build_market, top_candidates
from tests.bench.instances import all_spot

KMAX = 16


def solver_for(n: int) -> tuple[Solver, list[int]]:
    mkt = build_market(all_spot(0, n))
    cand = top_candidates(mkt, KMAX)
    state = State(free=mkt.o_gpus.tolist(), limits=fair_share_limits(mkt, cand, 1.0))
    solver = Solver(mkt, cand, state, scan_fallback=False)
    live = [b for b in range(len(mkt.bids)) if cand.offers[b] or cand.truncated[b]]
    return solver, priority_order(mkt, cand, live)


def test_a_big_class_lp_is_worth_at_least_what_the_greedy_places_before_any_column_generation(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    greedy, order = solver_for(1500)
    greedy.refresh(order, KMAX)
    greedy.greedy(order)
    same = [b for b in order if greedy.mkt.b_same[b]]
    greedy.refill(same, KMAX)
    placed = sum(p[2] for b in same for p in greedy.assigned.get(b, ()))

    solver, order = solver_for(1500)
    first: list[bound.ClassLP] = []

    def no_rounds(*a: Any, **k: Any) -> bound.ClassLP | None:
        got = bound.class_lp(*a, **{**k, "rounds": 0})
        assert got is not None
        first.append(got)
        return got

    monkeypatch.setattr(assign, "class_lp", no_rounds)
    rest = solver.refresh(order, KMAX)
    solver.lp_class(order, rest)
    (lp,) = first
    assert placed > 0
    assert lp.value >= placed, f"the LP over its first columns is worth {lp.value / placed:.3f} of the greedy"
    assert lp.bound >= lp.value
    offers = len(set(lp.po[lp.x > 1e-6].tolist()))
    assert offers >= len({p[0] for b in same for p in greedy.assigned.get(b, ())}) * 0.9
    assert np.isfinite(lp.x).all()

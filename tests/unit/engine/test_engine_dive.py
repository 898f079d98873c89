"""The dive's LP at the validated limits (issue 35).

``data/at_limits_rest.npz`` is a quarter of the fractional rest that the LP of a 10k-a-side
round of the at_limits family (tests/bench/instances.py, seed 0) left to its rounding:
4,762 pairs of same-machine bids with scores from 146 to 5.3e15. Unscaled, HiGHS returned
that LP unsolved: the dive had no bound, so its pick could not be proven close and the
MILP started from it ran 23 s of the round's 29 s.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np

from market.engine.bound import dive_pick, objective_scale

DATA = os.path.join(os.path.dirname(__file__), "data", "at_limits_rest.npz")


def rest() -> tuple[SimpleNamespace, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    d = np.load(DATA)
    bids, bi = np.unique(d["bid"], return_inverse=True)
    offs, oi = np.unique(d["offer"], return_inverse=True)
    gpus = np.zeros(len(bids), dtype=np.int64)
    gpus[bi] = d["gpus"]
    same = np.zeros(len(bids), dtype=np.bool_)
    same[bi] = d["same"]
    free = np.zeros(len(offs), dtype=np.int64)
    free[oi] = d["free"]
    # the arrays of a Market that dive_pick reads
    mkt = SimpleNamespace(b_gpus=gpus, b_same=same, bids_id=bids, o_id=offs)
    return mkt, bi.astype(np.int64), oi.astype(np.int64), d["score"].astype(np.int64), free


def test_the_dive_bounds_a_rest_whose_scores_span_thirteen_orders_of_magnitude() -> None:
    mkt, pb, po, ps, free = rest()
    assert ps.max() / ps.min() > 1e13
    pick, bound = dive_pick(mkt, pb, po, ps, free)  # type: ignore[arg-type]
    assert np.isfinite(bound), "the dive's LP came back unsolved: no bound for its pick"
    got = int(ps[pick].sum())
    assert got <= bound * (1 + 1e-9)
    assert got >= (1 - 5e-3) * bound  # DIVE_ACCEPT: the pick is proven close and no MILP runs
    used = np.zeros(len(free), dtype=np.int64)
    np.add.at(used, po[pick], mkt.b_gpus[pb[pick]])
    assert (used <= free).all() and len(np.unique(pb[pick])) == len(pick)


def test_the_objective_scale_is_a_power_of_two_that_brings_scores_near_a_million() -> None:
    assert objective_scale(np.asarray([5_000_000_000_000_000], dtype=np.int64)) == 2.0**33
    assert objective_scale(np.asarray([999_999], dtype=np.int64)) == 1.0
    assert objective_scale(np.zeros(0, dtype=np.int64)) == 1.0
    s = objective_scale(np.asarray([3, 10**12], dtype=np.int64))
    assert 1e6 / 2 < 10**12 / s <= 1e6 and np.log2(s) == int(np.log2(s))

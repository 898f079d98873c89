"""An upper bound on the best total surplus: the LP relaxation, by HiGHS.

Relax "whole or nothing" to a fraction ``x`` of each (bid, offer) pair:
maximise sum(score * x) subject to each bid's fractions summing to at most 1
and each offer's GPUs used (``bid gpus * x``) staying within its free GPUs.
Every integral assignment the engine could make is feasible here, including
multi-machine ones (a part on an offer is the fraction ``part / gpus``), and
class priority and the fair-share cap only remove assignments, so the LP
optimum bounds the true optimum from above. Over all feasible pairs it is a
bound on the whole round; over a pruned candidate set, on that set only.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linprog, milp
from scipy.sparse import coo_matrix

from .market import F64, I64, BidViews, Candidates, Market, reduced_max


def lp_bound(mkt: Market, pair_bid: I64, pair_offer: I64, pair_score: I64) -> int | None:
    """Ceiling of the LP relaxation's optimum, or None if HiGHS gave up."""
    sol = lp_solve(mkt, pair_bid, pair_offer, pair_score, mkt.o_gpus)
    return None if sol is None else sol[0]


def lp_solve(
    mkt: Market, pair_bid: I64, pair_offer: I64, pair_score: I64, free: I64
) -> tuple[int, F64, F64] | None:
    """(bound, x per pair, shadow price per offer GPU) of the LP relaxation."""
    n = len(pair_bid)
    if n == 0:
        return 0, np.zeros(0), np.zeros(len(mkt.offers))
    nb, no = len(mkt.bids), len(mkt.offers)
    g = mkt.b_gpus[pair_bid].astype(np.float64)
    rows = np.concatenate([pair_bid, nb + pair_offer])
    cols = np.concatenate([np.arange(n), np.arange(n)])
    vals = np.concatenate([np.ones(n), g])
    a = coo_matrix((vals, (rows, cols)), shape=(nb + no, n)).tocsr()
    rhs = np.concatenate([np.ones(nb), free.astype(np.float64)])
    upper = np.minimum(1.0, np.maximum(free[pair_offer], 0).astype(np.float64) / g)
    res = linprog(
        -pair_score.astype(np.float64),
        A_ub=a,
        b_ub=rhs,
        bounds=np.stack([np.zeros(n), upper], axis=1),
        method="highs",
    )
    if res.status != 0:
        return None
    # HiGHS's tolerance is relative; round outwards generously
    val = -float(res.fun)
    duals = -np.asarray(res.ineqlin.marginals, dtype=np.float64)[nb:]
    return math.ceil(val * (1 + 1e-9) + 1), np.asarray(res.x, dtype=np.float64), duals


def milp_pick(
    mkt: Market, pair_bid: I64, pair_offer: I64, pair_score: I64, free: I64, node_limit: int
) -> I64:
    """Indices of the pairs an exact MILP (HiGHS) picks; a node limit, not a
    time limit, bounds it so the answer does not depend on the machine."""
    n = len(pair_bid)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    bids, bi = np.unique(pair_bid, return_inverse=True)
    offs, oi = np.unique(pair_offer, return_inverse=True)
    nb, no = len(bids), len(offs)
    g = mkt.b_gpus[pair_bid].astype(np.float64)
    a = coo_matrix(
        (np.concatenate([np.ones(n), g]), (np.concatenate([bi, nb + oi]), np.r_[np.arange(n), np.arange(n)])),
        shape=(nb + no, n),
    ).tocsr()
    rhs = np.concatenate([np.ones(nb), np.maximum(free[offs], 0).astype(np.float64)])
    res = milp(
        -pair_score.astype(np.float64),
        constraints=LinearConstraint(a, -np.inf, rhs),
        integrality=np.ones(n),
        bounds=Bounds(0, 1),
        options={"node_limit": node_limit, "mip_rel_gap": 1e-6},
    )
    if res.x is None:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(np.asarray(res.x) > 0.5).astype(np.int64)


def dual_bound(
    mkt: Market, cand: Candidates, lower: int, iters: int = 60, tighten: bool = False
) -> tuple[int, I64]:
    """A Lagrangian upper bound on the best surplus over *every* feasible pair.

    Price each offer's GPUs at ``lam[o] >= 0`` and drop the capacity rows:
    each bid then takes, alone, its pair of best ``score - gpus * lam[o]``
    (or nothing), so for any such prices::

        UB(lam) = sum_b max(0, max_o score[b, o] - gpus[b] * lam[o], rest[b])
                  + sum_o gpus[o] * lam[o]

    bounds every assignment that respects capacity: whole-or-nothing, class
    priority and the fair-share cap only remove assignments. ``rest[b]``
    bounds the pairs the candidate search pruned (their price is at least 0),
    and a multi-machine bid adds ``gpus + 1`` for rounding each part's score
    separately. The prices are improved by projected subgradient steps
    (Polyak's rule, aiming at ``lower``); the bound is evaluated in integers
    at the best integral prices found, so it is exact arithmetic, not a
    floating-point estimate. ``tighten`` replaces ``rest`` by a scan of the
    pruned pairs at the final prices (slower, never looser).
    """
    rest = cand.rest if cand.rest is not None else np.zeros(len(mkt.bids), dtype=np.int64)
    cap = mkt.o_gpus
    no = len(mkt.offers)
    pb, po, ps = cand.pair_bid, cand.pair_offer, cand.pair_score
    slack = np.where(mkt.b_same, 0, mkt.b_gpus + 1).astype(np.int64)
    base = int(slack.sum())
    if len(pb) == 0:
        return int(np.maximum(rest, 0).sum()) + base, np.zeros(no, dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, pb[1:] != pb[:-1]])
    owners = pb[starts]
    g = mkt.b_gpus[pb]
    floor_b = np.maximum(rest, 0)
    lone = int(floor_b.sum()) - int(floor_b[owners].sum())  # bids with no kept pair
    floor_o = floor_b[owners]

    def evaluate(lam: I64) -> tuple[int, I64, I64]:
        red = ps - g * lam[po]
        best = np.maximum.reduceat(red, starts)
        term = np.maximum(best, floor_o)
        return int(term.sum()) + lone + base + int((cap * lam).sum()), red, best

    lam_f = np.zeros(no, dtype=np.float64)
    lam = np.zeros(no, dtype=np.int64)
    ub, red, best = evaluate(lam)
    best_lam = lam
    mu = 1.0
    stall = 0
    for _ in range(iters):
        # each bid's chosen pair: the first (best-ranked) attaining its max
        take = (red == np.repeat(best, np.diff(np.r_[starts, len(pb)]))) & (
            red > np.repeat(floor_o, np.diff(np.r_[starts, len(pb)]))
        )
        idx = np.flatnonzero(take)
        if len(idx):
            first = np.r_[True, pb[idx][1:] != pb[idx][:-1]]
            idx = idx[first]
        use = np.bincount(po[idx], weights=g[idx].astype(np.float64), minlength=no)
        sub = cap.astype(np.float64) - use
        sub = np.where((lam_f <= 0) & (sub > 0), 0.0, sub)
        norm = float(sub @ sub)
        if norm <= 0:
            break
        step = mu * max(ub - lower, 1) / norm
        lam_f = np.maximum(0.0, lam_f - step * sub)
        cur, red_c, best_c = evaluate(np.floor(lam_f).astype(np.int64))
        if cur < ub:
            ub, red, best, best_lam = cur, red_c, best_c, np.floor(lam_f).astype(np.int64)
            stall = 0
        else:
            red, best = red_c, best_c
            stall += 1
            if stall >= 3:
                mu /= 2
                stall = 0
    # the pruned pairs at these prices: only bids whose ``rest`` could matter
    views = cand.views
    if tighten and isinstance(views, BidViews) and int(rest.max(initial=0)) > 0:
        best_b = np.zeros(len(mkt.bids), dtype=np.int64)
        _, _, best = evaluate(best_lam)
        best_b[owners] = np.maximum(best, 0)
        loose = np.flatnonzero(rest > best_b).astype(np.int64)
        if len(loose):
            tight = rest.copy()
            tight[loose] = reduced_max(mkt, loose, best_lam, best_b[loose], views)
            floor_b = np.maximum(tight, 0)
            lone = int(floor_b.sum()) - int(floor_b[owners].sum())
            floor_o = floor_b[owners]
            ub = min(ub, evaluate(best_lam)[0])
    return ub, best_lam

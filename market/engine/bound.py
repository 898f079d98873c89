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

from .market import F64, I64, Market


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

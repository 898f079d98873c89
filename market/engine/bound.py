"""Per-class upper bounds on surplus: the LP relaxation, by HiGHS.

The engine's problem is lexicographic - reserved first, then on-demand, then
spot - so the bound is too: for each class, on the capacity the classes
before it left, relax "whole or nothing" to a fraction ``x`` of each (bid,
offer) pair: maximise sum(score * x) subject to each bid's fractions summing
to at most 1 and each offer's GPUs used (``bid gpus * x``) staying within its
free GPUs, and within the divisibility rows (``market.size_tier``): jobs of
multiples of 2, 4, 8 or 16 GPUs together use at most the offer's free GPUs
rounded down to that multiple. Every integral assignment of the class is feasible here, including
multi-machine ones (a part on an offer is the fraction ``part / gpus``), and
the fair-share cap only removes assignments, so the LP optimum bounds the
class's best surplus from above. The bound is read off a dual solution and
covers every feasible pair, kept or pruned (``class_lp``, ``bound_at``); a
multi-machine bid's term is then its exact whole-bucket fill at those prices
(``best_fills``), never more than the LP's. Multi-machine bids may enter the
LP as whole placements (``Fills``) instead of pairs, which keeps each in one
bucket (``class_lp``). Classes too big for the LP
get the same bound at prices found by subgradient steps (``lagrange_bound``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, linprog, milp
from scipy.sparse import coo_matrix, csc_matrix

from .market import (
    CUT_TIERS,
    F64,
    I64,
    BidViews,
    Market,
    cut_caps,
    price_out,
    size_tier,
    tier_prices,
)


def milp_pick(
    mkt: Market, pair_bid: I64, pair_offer: I64, pair_score: I64, free: I64, node_limit: int,
    rel_gap: float = 1e-6, start: I64 | None = None,
) -> I64:
    """Indices of the pairs an exact MILP (HiGHS) picks; a node limit, not a
    time limit, bounds it so the answer does not depend on the machine. The
    divisibility rows (``market.size_tier``) are written too: they cut off
    fractional points only, and tighten every node's relaxation. ``start``, a
    feasible pick, is HiGHS's first incumbent."""
    n = len(pair_bid)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    bids, bi = np.unique(pair_bid, return_inverse=True)
    offs, oi = np.unique(pair_offer, return_inverse=True)
    nb, no = len(bids), len(offs)
    g = mkt.b_gpus[pair_bid].astype(np.float64)
    jp = size_tier(mkt.b_gpus[pair_bid], mkt.b_same[pair_bid])
    caps = cut_caps(free[offs])
    rows = [bi, nb + oi]
    cols = [np.arange(n), np.arange(n)]
    vals = [np.ones(n), g]
    rhs = [np.ones(nb), caps[:, 0].astype(np.float64)]
    top = nb + no
    for j in range(1, CUT_TIERS):
        sel = np.flatnonzero((jp >= j) & (caps[oi, j] < caps[oi, 0]))
        if not len(sel):
            continue
        used, local = np.unique(oi[sel], return_inverse=True)
        rows.append(top + local)
        cols.append(sel)
        vals.append(g[sel])
        rhs.append(caps[used, j].astype(np.float64))
        top += len(used)
    a = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(top, n)).tocsc()
    hi = np.concatenate(rhs)
    x0 = None
    if start is not None:
        x0 = np.zeros(n, dtype=np.float64)
        x0[start] = 1.0
    x = _mip(a, pair_score.astype(np.float64), np.ones(n), np.full(len(hi), -np.inf), hi, node_limit, rel_gap, x0)
    if x is None:
        return np.zeros(0, dtype=np.int64)
    return np.flatnonzero(x > 0.5).astype(np.int64)


def objective_scale(scores: I64 | F64) -> float:
    """The power of two that brings the largest of ``scores`` near 1e6, where HiGHS
    solves well (1 where they are smaller): dividing by it is exact."""
    top = float(np.abs(scores).max()) if len(scores) else 1.0
    return 2.0 ** max(0, math.ceil(math.log2(max(top, 1.0) / 1e6)))


DIVE_BATCH = 0.1  # per LP of a dive: the share of the pairs the LP uses that it fixes


def dive_pick(mkt: Market, pair_bid: I64, pair_offer: I64, pair_score: I64, free: I64) -> tuple[I64, float]:
    """A feasible pick of pairs (indices) by diving on the LP relaxation, and that
    relaxation's optimum, which bounds every pick: the same model as ``milp_pick``,
    with a divisibility row for every offer and tier. Each step solves the LP
    (warm-started from the last), then fixes a tenth of the pairs it uses, biggest
    bids first, among them those the LP holds at one half or more first, then by
    LP value and score; a fixed pair takes its GPUs off its offer's rows, and every
    pair that can no longer fit, or whose bid is placed, leaves the model. What is
    left at the end is filled greedily by score.

    Why biggest first: the LP shares a machine between a whole small job and half a
    big one, so fixing its integral part first (every small job where the LP put
    it) left the big jobs nowhere whole. On the 1,000-a-side bench rounds' fractional
    rests (2,500-22,000 pairs) this reaches 0.9986-0.9999 of HiGHS's MILP in 0.05-0.8 s,
    where the MILP took 0.6-38 s; fixing the integral part first reached 0.97-0.9999.
    Each step fixes or removes at least one pair, so it ends within ``len(pairs)``
    LPs; a count of steps, not a clock, so a replay dives the same way."""
    n = len(pair_bid)
    none_i = np.zeros(0, dtype=np.int64)
    if n == 0 or _highs is None:  # pragma: no cover - no HiGHS binding: the MILP alone
        return none_i, 0.0 if n == 0 else math.inf
    _, bi = np.unique(pair_bid, return_inverse=True)
    offs, oi = np.unique(pair_offer, return_inverse=True)
    nb, no = int(bi.max()) + 1, len(offs)
    g = mkt.b_gpus[pair_bid].astype(np.int64)
    gf = g.astype(np.float64)
    jp = size_tier(mkt.b_gpus[pair_bid], mkt.b_same[pair_bid])
    rows, cols, vals = [bi, nb + oi], [np.arange(n), np.arange(n)], [np.ones(n), gf]
    top = nb + no
    tiers: list[tuple[int, I64, int]] = []
    for j in range(1, CUT_TIERS):
        sel = np.flatnonzero(jp >= j)
        if not len(sel):
            continue
        used, local = np.unique(oi[sel], return_inverse=True)
        rows.append(top + local)
        cols.append(sel)
        vals.append(gf[sel])
        tiers.append((j, used, top))
        top += len(used)
    a = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(top, n)).tocsc()
    cap = np.maximum(free[offs].astype(np.int64), 0)

    def rhs() -> F64:
        out = np.empty(top, dtype=np.float64)
        out[:nb] = 1.0
        out[nb:nb + no] = cap
        for j, used, first in tiers:
            out[first:first + len(used)] = (cap[used] >> j) << j
        return out

    h = _highs._Highs()
    for k, v in (("output_flag", False), ("threads", 1), ("random_seed", 0), ("presolve", "off")):
        h.setOptionValue(k, v)
    none = np.zeros(0, dtype=np.int32)
    hi = rhs()
    h.addRows(top, np.full(top, -np.inf), hi, 0, none, none, np.zeros(0))
    # HiGHS wants costs near 1e6: at the validated limits scores reach 1e16 and its LP
    # came back unsolved, so no bound and a MILP of 23 s on the dive's pick (a power of
    # two: exact, the same optimum)
    scale = objective_scale(pair_score)
    h.addCols(n, pair_score.astype(np.float64) / scale, np.zeros(n), np.ones(n), a.nnz,
              a.indptr[:-1].astype(np.int32), a.indices.astype(np.int32), a.data)
    h.changeObjectiveSense(_highs.ObjSense.kMaximize)
    chosen = np.zeros(n, dtype=np.bool_)
    gone = np.zeros(n, dtype=np.bool_)
    placed = np.zeros(nb, dtype=np.bool_)
    ids_b, ids_o = mkt.bids_id[pair_bid], mkt.o_id[pair_offer]
    bound = math.inf
    for step in range(n + 1):
        h.run()
        if h.getModelStatus() != _highs.HighsModelStatus.kOptimal:
            break
        x = np.asarray(h.getSolution().col_value, dtype=np.float64)
        if step == 0:
            bound = float(h.getInfo().objective_function_value) * scale
        cand = np.flatnonzero((x > 1e-6) & ~gone)
        if not len(cand):
            break
        xr = np.round(x[cand], 6)
        order = cand[np.lexsort((ids_o[cand], ids_b[cand], -pair_score[cand], -xr, xr < 0.5, -g[cand]))]
        take = max(1, math.ceil(DIVE_BATCH * len(cand)))
        fixed: list[int] = []
        for i in order.tolist():
            if len(fixed) >= take:
                break
            b, o = int(bi[i]), int(oi[i])
            if placed[b] or cap[o] < g[i]:
                continue
            placed[b] = True
            cap[o] -= g[i]
            fixed.append(i)
        chosen[fixed] = True
        dead = np.flatnonzero(~gone & (placed[bi] | (g > cap[oi])))
        if not fixed and not len(dead):
            break
        gone[dead] = True
        h.changeColsBounds(len(dead), dead.astype(np.int32), np.zeros(len(dead)), np.zeros(len(dead)))
        new = rhs()
        for r in np.flatnonzero(new != hi).tolist():
            h.changeRowBounds(r, -np.inf, float(new[r]))
        hi = new
    for i in np.lexsort((ids_o, ids_b, -pair_score)).tolist():
        b, o = int(bi[i]), int(oi[i])
        if not placed[b] and cap[o] >= g[i]:
            placed[b] = True
            cap[o] -= g[i]
            chosen[i] = True
    return np.flatnonzero(chosen).astype(np.int64), bound


MIP_CHECKPOINTS = 500  # per MIP: how many times HiGHS may stop to ask whether to go on (``run_counted``)
# A MIP started from a feasible pick (the dive's, ``assign``) stops at its first improvement on
# it. Checkpoints do not bound HiGHS's root, where its sub-MIP heuristics ran: a 10k-a-side
# all-spot round's fractional rest (24k pairs) took 20 s to gain 0.57% on the dive; stopped at
# the first improvement, 2.8 s for 0.56%. The round had taken 66 s, two such MIPs.
START_IMPROVEMENTS = 1


def run_counted(h: Any, checkpoints: int) -> None:
    """Run HiGHS model ``h`` (a MIP), stopping it at its ``checkpoints``-th interrupt
    check: HiGHS makes one between the steps of its search (nodes, cut rounds, root
    heuristics), so the count bounds a solve's work where its node limit alone does not
    (a 1,000-a-side ties round's fractional-rest MILP ran for many minutes at its root
    without reaching a node). A count, not a clock: a replay stops where the first run
    did. The solve keeps its best solution so far."""
    seen = [0]

    def checkpoint(kind: int, message: str, out: object, into: object, data: object) -> None:
        seen[0] += 1
        if seen[0] > checkpoints:
            into.user_interrupt = True  # type: ignore[attr-defined]

    h.setCallback(checkpoint, None)
    h.startCallback(_highs.cb.HighsCallbackType.kCallbackMipInterrupt)
    try:
        h.run()
    finally:
        h.stopCallback(_highs.cb.HighsCallbackType.kCallbackMipInterrupt)


def _mip(a: csc_matrix, obj: F64, ub: F64, lo: F64, hi: F64, node_limit: int, rel_gap: float,
         start: F64 | None = None) -> F64 | None:
    """Maximise ``obj @ x`` over integers ``0 <= x <= ub``, ``lo <= a @ x <= hi``
    (``a`` in CSC) with HiGHS, single-threaded, seeded and node-limited so the
    answer does not depend on the machine. HiGHS's root reduced-cost heuristic
    is off: on these assignment models it took more than half the time for
    incumbents no better than the other heuristics'. So is presolve: these models
    come small and tight already, and at 10k orders a side (seeds 0-2, all three
    classes) it took up to two thirds of the time for the same picks or better
    (one reserved round: 3.3 s -> 1.1 s). Without scipy's bundled
    HiGHS, scipy's ``milp`` with the same limits."""
    n = a.shape[1]
    if _highs is None:  # pragma: no cover
        res = milp(-obj, constraints=LinearConstraint(a, lo, hi), integrality=np.ones(n), bounds=Bounds(0, ub),
                   options={"node_limit": node_limit, "mip_rel_gap": rel_gap})
        return None if res.x is None else np.asarray(res.x, dtype=np.float64)
    h = _highs._Highs()
    for k, v in (("output_flag", False), ("threads", 1), ("random_seed", 0), ("mip_max_nodes", node_limit),
                 ("mip_rel_gap", rel_gap), ("mip_heuristic_run_root_reduced_cost", False), ("presolve", "off")):
        h.setOptionValue(k, v)
    none = np.zeros(0, dtype=np.int32)
    h.addRows(a.shape[0], lo, hi, 0, none, none, np.zeros(0))
    h.addCols(n, obj, np.zeros(n), ub, a.nnz, a.indptr[:-1].astype(np.int32), a.indices.astype(np.int32), a.data)
    h.changeObjectiveSense(_highs.ObjSense.kMaximize)
    h.changeColsIntegrality(n, np.arange(n, dtype=np.int32), np.full(n, _highs.HighsVarType.kInteger, dtype=np.uint8))
    if start is not None:
        sol = _highs.HighsSolution()
        sol.col_value = start.tolist()
        sol.value_valid = True
        h.setSolution(sol)
        h.setOptionValue("mip_max_improving_sols", START_IMPROVEMENTS)
    run_counted(h, MIP_CHECKPOINTS)
    sol = np.asarray(h.getSolution().col_value, dtype=np.float64)
    if len(sol) != n or not h.getSolution().value_valid:
        return None
    return sol


CG_TOLERANCE = 1e-3  # column generation stops once the bound is this close to the LP
CG_STALL = 1e-3  # ... or, with multi-machine bids as pairs, once a round narrowed the bound's gap to the LP by less than this share
CG_WIDTH_FILLS = 8  # columns a bid may gain per round when the LP has fills (classes small enough for them)


@dataclass
class Fills:
    """Whole placements of multi-machine bids, each one LP column: fill ``j``
    puts ``gpus[start[j]:start[j+1]]`` GPUs on offers ``off[...]`` (all in one
    bucket) for bid ``bid[j]``, worth ``score[j]`` (the sum of its parts'
    scores, as ``Solver.score_of`` rounds them)."""

    bid: I64
    score: I64
    start: I64
    off: I64
    gpus: I64

    @classmethod
    def of(cls, rows: list[tuple[int, int, list[int], list[int]]]) -> Fills:
        """From (bid, score, offers, GPUs) rows."""
        sizes = [len(r[2]) for r in rows]
        return cls(
            np.asarray([r[0] for r in rows], dtype=np.int64),
            np.asarray([r[1] for r in rows], dtype=np.int64),
            np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64),
            np.asarray([o for r in rows for o in r[2]], dtype=np.int64),
            np.asarray([t for r in rows for t in r[3]], dtype=np.int64),
        )

    def __len__(self) -> int:
        return len(self.bid)

    def parts(self, j: int) -> list[tuple[int, int]]:
        a, z = int(self.start[j]), int(self.start[j + 1])
        return list(zip(self.off[a:z].tolist(), self.gpus[a:z].tolist(), strict=True))

    def key(self, j: int) -> tuple[int, tuple[tuple[int, int], ...]]:
        return int(self.bid[j]), tuple(self.parts(j))

    def row(self, j: int) -> tuple[int, int, list[int], list[int]]:
        a, z = int(self.start[j]), int(self.start[j + 1])
        return int(self.bid[j]), int(self.score[j]), self.off[a:z].tolist(), self.gpus[a:z].tolist()

    def pick(self, keep: I64) -> Fills:
        return Fills.of([self.row(j) for j in keep.tolist()])

    @staticmethod
    def join(parts: list[Fills]) -> Fills:
        return Fills.of([f.row(j) for f in parts for j in range(len(f))])


NO_FILLS = Fills.of([])


@dataclass
class ClassLP:
    """One class's LP relaxation: its columns, solution, prices and bound."""

    bound: int  # proven: no assignment of the class's bids beats it
    value: float  # the LP optimum over the columns kept
    pb: I64
    po: I64
    ps: I64
    x: F64
    lam: F64  # per offer and divisibility row, the shadow price per GPU
    columns_added: int
    fills: Fills  # the multi-machine bids' columns: whole placements
    fx: F64  # the LP's weight on each fill
    limited: bool = False  # column generation stopped at ``LP_WORK_LIMIT``: this is its last whole round
    capped: bool = False  # the fills stopped at ``LP_MAX_FILLS``

    def pair_price(self, mkt: Market) -> F64:
        """Per column, the shadow price per GPU its bid's size pays on its offer."""
        jp = size_tier(mkt.b_gpus[self.pb], mkt.b_same[self.pb])
        out: F64 = np.cumsum(self.lam, axis=1)[self.po, jp]
        return out


def class_lp(
    mkt: Market,
    bids: I64,
    cols: tuple[I64, I64, I64],
    free: I64,
    rest: I64 | None,
    views: BidViews | None,
    rounds: int = 3,
    skip: dict[tuple[int, int], I64] | None = None,
    fills: Sequence[list[tuple[int, int, int]]] | BidViews | None = None,
    whole_fills: bool = True,
) -> ClassLP | None:
    """The LP relaxation of one class on the capacity left by higher classes,
    over its candidate pairs, with a bound that covers every feasible pair.

    HiGHS solves the LP over the candidate pairs (the columns). Its row
    prices ``lam[o, j]`` (floored to integers, still >= 0) give a feasible dual
    of the LP over *all* pairs once each bid's price ``u[b]`` is the best
    reduced score ``score - gpus * P[o, j(b)]`` over all its pairs, where
    ``P[o, j] = lam[o, 0] + ... + lam[o, j]`` and ``j(b)`` is the last
    divisibility row the bid's size counts in, so (weak duality)::

        bound = sum_b max(0, max_o score[b, o] - gpus[b] * P[o, j(b)])
                + sum_o sum_j caps[o, j] * lam[o, j]
                + sum over multi-machine bids (gpus + 1)

    bounds every assignment of the class on ``free``: whole-or-nothing and
    the fair-share cap only remove assignments, and the last term covers
    rounding each part of a split bid separately. Over the kept columns the
    maximum is read off directly; the pruned pairs of a bid matter only if
    ``rest[b]`` (the candidate search's bound on their scores) exceeds it,
    and those bids are priced out by a scan of their views at ``lam``. Pairs
    that beat the columns' maximum join as columns and HiGHS carries on from
    its last basis (column generation, ``_WarmLP``), up to ``rounds`` times or until the bound is
    within ``CG_TOLERANCE`` of the LP over the columns; the last scan's
    maxima stand in the bound, so it holds even when rounds run out.
    All of it is integer arithmetic except HiGHS's prices, which only need
    to be non-negative for the bound to hold. ``skip`` names, per bucket,
    multi-machine bids that bucket cannot fill whole (``unfillable``): their
    pairs there are in no assignment, so they stay out of columns and pricing.

    Multi-machine bids (with ``fills``, the bids' views): as pairs, the LP
    may put half a 16-GPU job on the cheapest 8 GPUs of each of two buckets,
    worth more than any whole placement (at 10k orders a side it did so for
    141 of 171 on-demand jobs). With ``whole_fills`` they enter instead as
    whole placements, one column each (Dantzig-Wolfe: 1 in the bid's row, its
    parts' GPUs in the offers' rows), starting from each bid's best fill per
    bucket, and each round adds the best fill per bucket at the new prices
    that beats the bid's own price (``best_fills``, exact over every feasible
    offer). Either way a multi-machine bid's term in the bound is its exact
    best whole fill at the prices (``best_fills``), not its best pair. Fills
    make the LP tight for these bids but slower to solve, so big classes
    (``assign.LP_FILL_COLUMNS``) keep pairs; there, rounds also stop once a
    round narrowed the gap between the best bound and the LP by less than
    ``CG_STALL`` of it (with fills the bound moves
    in uneven steps as fills come in, so they run until the bound meets the
    LP or ``rounds`` run out).
    """
    pb, po, ps = cols
    added = 0
    last: int | None = None
    last_gap: float | None = None
    lp = _WarmLP(mkt, free)
    multi = np.flatnonzero(~mkt.b_same[bids])
    whole = whole_fills and fills is not None and _highs is not None and len(multi) > 0
    cache: _FillCache = {}  # each multi-machine bid's feasible offers per view, on this ``free``
    if whole:
        assert fills is not None
        keep = mkt.b_same[pb]  # multi-machine bids enter as whole fills only
        pb, po, ps = pb[keep], po[keep], ps[keep]
        if rest is not None:
            rest = rest.copy()
            rest[bids[multi]] = 0  # their fills are priced exactly below, not by pairs
        _, fresh = best_fills(mkt, bids[multi], np.zeros(len(mkt.offers), dtype=np.int64), free, fills, cache)
        lp.add_fills(lp.within_cap(fresh))
    lp.add(pb, po, ps)
    # the last whole round, kept while the next one runs (``done``'s arguments)
    prev: tuple[int, float, tuple[I64, I64, I64], F64, F64, I64, I64, int, int, F64] | None = None

    def done(bound: int, value: float, cols: tuple[I64, I64, I64], x: F64, lam_f: F64, lam: I64, best: I64,
             added: int, parts: int, fx: F64, limited: bool = False) -> ClassLP:
        bound += _multi_correction(mkt, bids[multi], lam, best[multi], free, fills, whole)  # at the last prices
        got = Fills.join(lp.fill_parts[:parts]) if parts else NO_FILLS
        return ClassLP(bound, value, *cols, x, lam_f, added, got, fx, limited=limited, capped=lp.capped)

    for it in range(rounds + 1):
        sol = lp.solve(None if prev is None else LP_WORK_LIMIT - lp.iterations)
        if sol is None:
            return done(*prev, True) if lp.limited and prev is not None else None
        value, x, lam_f, fx, u = sol
        lam = np.floor(np.maximum(lam_f, 0.0) + 1e-9).astype(np.int64)
        bound, (nb_, no_, ns_), best = bound_at(mkt, bids, (pb, po, ps), free, lam, rest, views, skip,
                                                width=CG_WIDTH_FILLS if whole else 4)
        fresh = NO_FILLS
        if whole:
            assert fills is not None
            # a multi-machine bid is whole in one bucket: its term is its exact best fill at these prices
            term, fresh = best_fills(mkt, bids[multi], lam[:, 0], free, fills, cache)
            bound += int((term - best[multi]).sum())
            keep_n = mkt.b_same[nb_]
            nb_, no_, ns_ = nb_[keep_n], no_[keep_n], ns_[keep_n]
            fresh = lp.within_cap(lp.new_fills(fresh, lam[:, 0], u))
        # the gap between the best bound so far and the LP over the columns; a round that
        # narrowed it by less than ``CG_STALL`` of it stalled (the bound alone is no measure:
        # at new prices it may rise while the LP climbs)
        gap = (bound if last is None else min(last, bound)) - value
        stalled = not whole and last_gap is not None and last_gap - gap < CG_STALL * last_gap
        last = bound if last is None else min(last, bound)
        last_gap = gap
        if (len(nb_) or len(fresh)) and it < rounds and bound - value > CG_TOLERANCE * bound and not stalled:
            prev = (bound, value, (pb, po, ps), x, lam_f, lam, best, added, len(lp.fill_parts), fx)
            lp.add_fills(fresh)
            lp.add(nb_, no_, ns_)
            pb = np.concatenate([pb, nb_])
            po = np.concatenate([po, no_])
            ps = np.concatenate([ps, ns_])
            added += len(nb_) + len(fresh)
            continue
        return done(bound, value, (pb, po, ps), x, lam_f, lam, best, added, len(lp.fill_parts), fx)
    return None  # pragma: no cover - the loop always returns


# The class LP's work limits, counted, never timed, so a replay stops where the first run did.
# LP_WORK_LIMIT: simplex iterations over all its rounds of column generation. A round that
# would pass it is stopped and the last whole round stands (its solution, and its bound: any
# prices give one). LP_MAX_FILLS: whole placements of multi-machine bids (``Fills``) in the LP;
# past it those bids keep the fills they have (their bound terms stay exact). The catalogue
# bench round's largest class LP (10k orders a side) takes 97k iterations and 6.6k fills. A
# heavy-tailed round's on-demand LP (10k a side, 1,605 multi-machine bids) grew to 51k fills,
# each iteration 0.9 ms, one round 54k iterations and 47 s: that round took over 300 s in all,
# 42 s with these limits.
LP_WORK_LIMIT = 100_000
LP_MAX_FILLS = 20_000


def _multi_correction(
    mkt: Market, multi: I64, lam: I64, best: I64, free: I64,
    fills: Sequence[list[tuple[int, int, int]]] | BidViews | None, whole: bool,
) -> int:
    """What the bound loses when each multi-machine bid of a class LP with every bid as
    pairs counts its exact best whole fill at prices ``lam`` instead of its best pair
    (``best``); 0 with whole fills, whose terms are already their fills."""
    if whole or fills is None or not len(multi):
        return 0
    fill = multi_fill_bound(mkt, multi, lam[:, 0], free, fills)
    return -int((best - np.minimum(best, fill)).sum())


def bound_at(
    mkt: Market,
    bids: I64,
    cols: tuple[I64, I64, I64],
    free: I64,
    lam: I64,
    rest: I64 | None,
    views: BidViews | None,
    skip: dict[tuple[int, int], I64] | None,
    width: int = 4,
) -> tuple[int, tuple[I64, I64, I64], I64]:
    """The dual bound at offer prices ``lam`` (integers >= 0) over every
    feasible pair of ``bids`` (see ``class_lp``), and the pruned pairs that
    beat the columns' best reduced score (the columns to add)."""
    pb, po, ps = cols
    g_all = mkt.b_gpus
    slack = int((g_all[bids] + 1)[~mkt.b_same[bids]].sum())
    lam2 = lam if lam.ndim == 2 else np.pad(lam[:, None], ((0, 0), (0, CUT_TIERS - 1)))
    price = tier_prices(lam2)
    u = np.zeros(len(mkt.bids), dtype=np.int64)
    if len(pb):
        jp = size_tier(g_all[pb], mkt.b_same[pb])
        np.maximum.at(u, pb, ps - g_all[pb] * price[po, jp])
    best = u[bids]
    empty = np.zeros(0, dtype=np.int64)
    new: tuple[I64, I64, I64] = (empty, empty, empty)
    if rest is not None and views is not None:
        loose = bids[rest[bids] > u[bids]]
        if len(loose):
            red, nb_, no_, ns_ = price_out(mkt, loose, lam2, u[loose], views, free, width=width, skip=skip)
            pos = np.searchsorted(bids, loose)
            best = best.copy()
            best[pos] = np.maximum(best[pos], red)
            new = (nb_, no_, ns_)
    bound = int(best.sum()) + int((cut_caps(free) * lam2).sum()) + slack
    return bound, new, best


def multi_fill_bound(
    mkt: Market, bids: I64, price: I64, free: I64, views: Sequence[list[tuple[int, int, int]]] | BidViews
) -> I64:
    """Per multi-machine bid, an upper bound on its reduced score at offer
    prices ``price`` (per GPU) over every way it can be placed (``best_fills``)."""
    return best_fills(mkt, bids, price, free, views)[0]


_FillCache = dict[tuple[int, tuple[int, int, int]], tuple[I64, F64, I64, F64]]


def best_fills(
    mkt: Market, bids: I64, price: I64, free: I64, views: Sequence[list[tuple[int, int, int]]] | BidViews,
    cache: _FillCache | None = None,
) -> tuple[I64, Fills]:
    """Per multi-machine bid, an upper bound on its reduced score at offer
    prices ``price`` (per GPU) over every way it can be placed: whole, in one
    bucket, at most ``min(free, gpus)`` GPUs per offer; and per bid and bucket
    with room, that best fill (the columns to offer the LP). The best fill
    takes the bucket's GPUs by reduced score per GPU; the best over its
    buckets (or 0) is never more than the best reduced score of a single
    pair, and it is much less when no bucket has room for the whole bid at
    those prices. Scanned over every feasible offer of the bid's buckets,
    kept or pruned; scores per GPU are the whole bid's on the offer over its
    GPUs, and the rounding of each part is in ``bound_at``'s slack. ``cache``
    keeps each (bid, view)'s feasible offers between calls on the same
    ``free`` (column generation calls this every round at new prices)."""
    out = np.zeros(len(bids), dtype=np.int64)
    rows: list[tuple[int, int, list[int], list[int]]] = []
    for i, b in enumerate(bids.tolist()):
        g = int(mkt.b_gpus[b])
        h = float(mkt.b_hours[b])
        best = 0.0
        for key in views[b]:
            got = None if cache is None else cache.get((b, key))
            if got is None:
                offs = mkt.views[key]
                offs = offs[free[offs] > 0]
                v, ok = mkt.values(b, offs)
                sc = np.rint(float(g) * h * v)  # the whole bid's score on each, as pair_scores rounds it
                ok &= sc > 0
                offs, sc, v = offs[ok], sc[ok], v[ok]
                got = (offs, sc / g, np.minimum(free[offs], g), v)
                if cache is not None:
                    cache[(b, key)] = got
            offs, per_gpu, cap, v = got
            if int(cap.sum()) < g:
                continue
            per = per_gpu - price[offs]
            order = np.argsort(-per, kind="stable")
            offs, cap, per, vo = offs[order], cap[order], per[order], v[order]
            before = np.cumsum(cap) - cap
            take = np.clip(g - before, 0, cap)
            best = max(best, float((take * per).sum()))
            n = int(np.count_nonzero(take))  # a prefix
            parts = np.rint(take[:n].astype(np.float64) * h * vo[:n]).astype(np.int64)
            rows.append((b, int(parts.sum()), offs[:n].tolist(), take[:n].tolist()))
        out[i] = math.ceil(best) + 1
    return out, Fills.of(rows)


def lagrange_bound(
    mkt: Market,
    bids: I64,
    cols: tuple[I64, I64, I64],
    free: I64,
    rest: I64 | None,
    views: BidViews | None,
    skip: dict[tuple[int, int], I64] | None,
    lower: int,
    iters: int = 100,
    rounds: int = 5,
) -> int:
    """The same bound as ``class_lp`` at prices found without an LP solver,
    for classes too large to solve as an LP in time: valid at any prices,
    only looser than at the LP's.

    Projected subgradient steps (Polyak's rule, aiming at ``lower``) on the
    Lagrangian over the columns, then the bound over every feasible pair at
    the best prices found (``bound_at``); the pruned pairs that beat the
    columns there join them and the steps go on from those prices, up to
    ``rounds`` times: column generation, as in ``class_lp``. Without it the
    prices of offers no column touches stay 0 and the pruned pairs on them
    keep the bound loose (0.84 of it at 20k orders, 0.95 with it). A
    multi-machine bid's term is its exact best whole fill (``best_fills``).
    Starting from prices read off the greedy (an outsider's best score per
    GPU where it found no room) was tried: a looser bound than from 0."""
    no = len(mkt.offers)
    icaps = cut_caps(free)
    caps = icaps.astype(np.float64)
    lam_f = np.zeros((no, CUT_TIERS), dtype=np.float64)
    pb, po, ps = cols
    best: tuple[int, I64, I64] | None = None
    for _ in range(rounds + 1):
        order = np.argsort(pb, kind="stable")  # each bid's columns in one run, for reduceat
        pb, po, ps = pb[order], po[order], ps[order]
        lam = _subgradient(mkt, (pb, po, ps), caps, icaps, lam_f, lower, iters)
        bound, (nb_, no_, ns_), terms = bound_at(mkt, bids, (pb, po, ps), free, lam, rest, views, skip)
        if best is None or bound < best[0]:
            best = (bound, lam, terms)
        lam_f = lam.astype(np.float64)
        if not len(nb_):
            break
        pb, po, ps = np.concatenate([pb, nb_]), np.concatenate([po, no_]), np.concatenate([ps, ns_])
    assert best is not None
    bound, lam, terms = best
    multi = np.flatnonzero(~mkt.b_same[bids])
    if views is not None and len(multi):  # at the best prices, a multi-machine bid's exact best whole fill
        fill = multi_fill_bound(mkt, bids[multi], lam[:, 0], free, views)
        bound -= int((terms[multi] - np.minimum(terms[multi], fill)).sum())
    return bound


def _subgradient(
    mkt: Market, cols: tuple[I64, I64, I64], caps: F64, icaps: I64, lam_f: F64, lower: int, iters: int
) -> I64:
    """The best integer prices that ``iters`` subgradient steps from
    ``lam_f`` find for the Lagrangian over ``cols`` (sorted by bid)."""
    pb, po, ps = cols
    no = len(mkt.offers)
    g = mkt.b_gpus[pb]
    jp = size_tier(g, mkt.b_same[pb])
    starts = np.flatnonzero(np.r_[True, pb[1:] != pb[:-1]]) if len(pb) else np.zeros(0, dtype=np.int64)
    seglen = np.diff(np.r_[starts, len(pb)])

    def value(lam: I64) -> tuple[int, I64, I64]:
        red = ps - g * tier_prices(lam)[po, jp]
        u = np.maximum.reduceat(red, starts) if len(starts) else np.zeros(0, dtype=np.int64)
        return int(np.maximum(u, 0).sum()) + int((icaps * lam).sum()), red, u

    lam = np.floor(lam_f).astype(np.int64)
    ub, red, u = value(lam)
    best = lam
    mu = 1.0
    stall = 0
    for _ in range(iters if len(pb) else 0):
        take = np.flatnonzero((red == np.repeat(u, seglen)) & (red > 0))
        use = np.zeros((no, CUT_TIERS), dtype=np.float64)
        for j in range(CUT_TIERS):
            t = take[jp[take] >= j]
            use[:, j] = np.bincount(po[t], weights=g[t].astype(np.float64), minlength=no)
        sub = caps - use
        sub = np.where((lam_f <= 0) & (sub > 0), 0.0, sub)
        norm = float((sub * sub).sum())
        if norm <= 0:
            break
        lam_f = np.maximum(0.0, lam_f - mu * max(ub - lower, 1) / norm * sub)
        lam = np.floor(lam_f).astype(np.int64)
        cur, red, u = value(lam)
        if cur < ub:
            ub, best, stall = cur, lam, 0
        else:
            stall += 1
            if stall >= 3:
                mu, stall = mu / 2, 0
    return best


try:  # the HiGHS that scipy ships (what linprog runs), driven directly to keep its basis
    from scipy.optimize._highspy import _core as _highs
except ImportError:  # pragma: no cover - another scipy layout: cold solves through linprog
    _highs = None


class _WarmLP:
    """The class LP kept in one HiGHS model across rounds of column generation: new
    columns join the model and the next solve starts from the last basis (a few simplex
    iterations, not a solve from scratch: about half the engine's time at 10k).

    Rows are written when a column first needs them: a bid's row with its first
    column, an offer's capacity row with the first column on that offer, and a
    divisibility row (``cut_caps``) when a column of that size uses an offer whose
    free GPUs it cuts. A row no column uses is empty and its price is 0, so the LP is
    the same as ``_lp``'s, but HiGHS carries no idle rows: at 10k orders a side, only
    a few hundred of the ~25k divisibility rows that could cut ever do. At 100k the
    idle rows cost a sixth of the LP time; at 10k the big LPs' time is in their
    columns, and it barely moved. Uses the HiGHS bundled with scipy
    (``_highs``); where scipy does not ship it, each round is a cold ``_lp``."""

    def __init__(self, mkt: Market, free: I64) -> None:
        self.mkt, self.free = mkt, free
        self.cols: list[tuple[I64, I64, I64]] = []
        self.iterations = 0  # simplex iterations of every solve so far
        self.limited = False  # the last solve stopped at its iteration limit
        self.nfills = 0  # fills in the LP
        self.capped = False  # fills were left out at ``LP_MAX_FILLS``
        if _highs is None:  # pragma: no cover
            return
        nb, no = len(mkt.bids), len(mkt.offers)
        self.caps = cut_caps(free)
        self.bid_row = np.full(nb, -1, dtype=np.int64)
        self.one = np.ones(nb, dtype=np.int64)  # a bid's row: taken at most once
        self.cut_row = np.full((no, CUT_TIERS), -1, dtype=np.int64)  # column 0: the capacity row
        self.nb, self.no, self.rows = nb, no, 0
        self.xcol: list[I64] = []  # per add(), the HiGHS columns of its pairs
        self.fcol: list[I64] = []  # per add_fills(), those of its fills
        self.fill_parts: list[Fills] = []
        self.seen: set[tuple[int, tuple[tuple[int, int], ...]]] = set()
        self.ncol = 0
        # scores reach 1e10 and more; HiGHS's dual simplex wants costs nearer 1e6
        # (it fails with "excessive dual values" on some rounds otherwise): solve
        # in units of ``scale`` (a power of two, so exact) and read prices back
        self.scale = objective_scale(mkt.b_gpus * mkt.b_hours * mkt.b_maxp)
        h = _highs._Highs()
        h.setOptionValue("output_flag", False)
        h.setOptionValue("threads", 1)
        h.setOptionValue("random_seed", 0)
        h.changeObjectiveSense(_highs.ObjSense.kMaximize)
        self.h = h

    def _rows(self, table: I64, keys: I64, upper: I64) -> I64:
        """The rows of ``keys`` in ``table`` (``bid_row`` or a column of ``cut_row``),
        first writing those missing, with upper limits ``upper[key]``."""
        new = np.unique(keys[table[keys] < 0])
        if len(new):
            table[new] = self.rows + np.arange(len(new))
            none = np.zeros(0, dtype=np.int32)
            self.h.addRows(len(new), np.full(len(new), -_highs.kHighsInf), upper[new].astype(np.float64), 0, none, none,
                           np.zeros(0))
            self.rows += len(new)
        out: I64 = table[keys]
        return out

    def _bid_rows(self, pb: I64) -> I64:
        return self._rows(self.bid_row, pb, self.one)

    def _cap_rows(self, po: I64, j: int) -> I64:
        return self._rows(self.cut_row[:, j], po, self.caps[:, j])

    def add(self, pb: I64, po: I64, ps: I64) -> None:
        n = len(pb)
        self.cols.append((pb, po, ps))
        if n == 0 or _highs is None:
            return
        mkt = self.mkt
        g = mkt.b_gpus[pb].astype(np.float64)
        jp = size_tier(mkt.b_gpus[pb], mkt.b_same[pb])
        col = np.arange(n)
        rows, cols, vals = [self._bid_rows(pb), self._cap_rows(po, 0)], [col, col], [np.ones(n), g]
        for j in range(1, CUT_TIERS):
            sel = np.flatnonzero((jp >= j) & (self.caps[po, j] < self.caps[po, 0]))
            rows.append(self._cap_rows(po[sel], j))
            cols.append(col[sel])
            vals.append(g[sel])
        a = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(self.rows, n)).tocsc()
        self.h.addCols(n, ps.astype(np.float64) / self.scale, np.zeros(n), np.ones(n), a.nnz,
                       a.indptr[:-1].astype(np.int32), a.indices.astype(np.int32), a.data)
        self.xcol.append(self.ncol + np.arange(n))
        self.ncol += n

    @property
    def fills(self) -> Fills:
        return Fills.join(self.fill_parts) if self.fill_parts else NO_FILLS

    def new_fills(self, fills: Fills, price: I64, u: F64) -> Fills:
        """The fills not yet in the LP whose reduced score beats their bid's price."""
        keep = []
        for j in range(len(fills)):
            b = int(fills.bid[j])
            a, z = int(fills.start[j]), int(fills.start[j + 1])
            red = int(fills.score[j]) - int((fills.gpus[a:z] * price[fills.off[a:z]]).sum())
            if red > u[b] + 1 and fills.key(j) not in self.seen:
                keep.append(j)
        return fills.pick(np.asarray(keep, dtype=np.int64)) if keep else NO_FILLS

    def within_cap(self, fills: Fills) -> Fills:
        """The first of ``fills`` that the LP still has room for under ``LP_MAX_FILLS``;
        past it, multi-machine bids keep the fills they have (``capped``)."""
        room = max(LP_MAX_FILLS - self.nfills, 0)
        if len(fills) <= room:
            return fills
        self.capped = True
        return fills.pick(np.arange(room, dtype=np.int64))

    def add_fills(self, fills: Fills) -> None:
        """Whole placements of multi-machine bids as columns: 1 in the bid's
        row, its GPUs in each offer's capacity row (parts of a multi-machine
        bid count in no divisibility row)."""
        n = len(fills)
        if n == 0 or _highs is None:
            return
        self.fill_parts.append(fills)
        self.nfills += n
        self.seen.update(fills.key(j) for j in range(n))
        sizes = np.diff(fills.start)
        col = np.repeat(np.arange(n), sizes)
        rows = np.concatenate([self._bid_rows(fills.bid), self._cap_rows(fills.off, 0)])
        cols = np.concatenate([np.arange(n), col])
        vals = np.concatenate([np.ones(n), fills.gpus.astype(np.float64)])
        a = coo_matrix((vals, (rows, cols)), shape=(self.rows, n)).tocsc()
        self.h.addCols(n, fills.score.astype(np.float64) / self.scale, np.zeros(n), np.ones(n), a.nnz,
                       a.indptr[:-1].astype(np.int32), a.indices.astype(np.int32), a.data)
        self.fcol.append(self.ncol + np.arange(n))
        self.ncol += n

    def solve(self, limit: int | None = None) -> tuple[float, F64, F64, F64, F64] | None:
        """(optimum, x per pair, price per offer and divisibility row, x per
        fill, price per bid row), prices in score units; None, with ``limited``
        set, when ``limit`` simplex iterations did not reach the optimum."""
        nf = self.nfills
        self.limited = False
        if _highs is None:  # pragma: no cover
            pb, po, ps = (np.concatenate(c) for c in zip(*self.cols, strict=True))
            got = _lp(self.mkt, pb, po, ps, self.free)
            return None if got is None else (*got, np.zeros(0), np.zeros(self.nb))
        no = self.no
        if self.ncol == 0:
            npair = sum(len(c[0]) for c in self.cols)
            return 0.0, np.zeros(npair), np.zeros((no, CUT_TIERS)), np.zeros(nf), np.zeros(self.nb)
        self.h.setOptionValue("simplex_iteration_limit", _highs.kHighsIInf if limit is None else max(0, limit))
        self.h.run()
        self.iterations += int(self.h.getInfo().simplex_iteration_count)
        status = self.h.getModelStatus()
        if status != _highs.HighsModelStatus.kOptimal:
            self.limited = status == _highs.HighsModelStatus.kIterationLimit
            return None
        sol = self.h.getSolution()
        # maximising under <= rows, HiGHS's row duals are the prices (>= 0; clip round-off)
        dual = np.maximum(np.asarray(sol.row_dual, dtype=np.float64), 0.0) * self.scale
        lam = np.zeros((no, CUT_TIERS), dtype=np.float64)
        has = self.cut_row >= 0  # a row not written is empty: its price is 0
        lam[has] = dual[self.cut_row[has]]
        u = np.zeros(self.nb, dtype=np.float64)
        u[self.bid_row >= 0] = dual[self.bid_row[self.bid_row >= 0]]
        col = np.asarray(sol.col_value, dtype=np.float64)
        x = col[np.concatenate(self.xcol)] if self.xcol else np.zeros(0)
        fx = col[np.concatenate(self.fcol)] if self.fcol else np.zeros(0)
        value = float(self.h.getInfo().objective_function_value) * self.scale
        return value, x, lam, fx, u


def _lp(mkt: Market, pb: I64, po: I64, ps: I64, free: I64) -> tuple[float, F64, F64] | None:
    """(optimum, x per column, price per offer and divisibility row) of the LP
    over the columns. A divisibility row is only written where it cuts: some
    column of that size uses the offer and its free GPUs are no multiple."""
    n = len(pb)
    nb, no = len(mkt.bids), len(mkt.offers)
    if n == 0:
        return 0.0, np.zeros(0), np.zeros((no, CUT_TIERS))
    g = mkt.b_gpus[pb].astype(np.float64)
    jp = size_tier(mkt.b_gpus[pb], mkt.b_same[pb])
    caps = cut_caps(free)
    rows = [pb, nb + po]
    cols = [np.arange(n), np.arange(n)]
    vals = [np.ones(n), g]
    rhs = [np.ones(nb), caps[:, 0].astype(np.float64)]
    where: list[tuple[int, int, I64]] = []
    top = nb + no
    for j in range(1, CUT_TIERS):
        sel = np.flatnonzero(jp >= j)
        offs = np.unique(po[sel])
        offs = offs[caps[offs, j] < caps[offs, 0]]
        if not len(offs):
            continue
        sel = sel[np.isin(po[sel], offs)]
        rows.append(top + np.searchsorted(offs, po[sel]))
        cols.append(sel)
        vals.append(g[sel])
        rhs.append(caps[offs, j].astype(np.float64))
        where.append((j, top, offs))
        top += len(offs)
    a = coo_matrix(
        (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(top, n)
    ).tocsr()
    res = linprog(
        -ps.astype(np.float64), A_ub=a, b_ub=np.concatenate(rhs), bounds=(0.0, 1.0), method="highs-ds"
    )
    if res.status != 0:
        return None
    marg = -np.asarray(res.ineqlin.marginals, dtype=np.float64)
    lam = np.zeros((no, CUT_TIERS), dtype=np.float64)
    lam[:, 0] = marg[nb : nb + no]
    for j, start, offs in where:
        lam[offs, j] = marg[start : start + len(offs)]
    return -float(res.fun), np.asarray(res.x, dtype=np.float64), lam

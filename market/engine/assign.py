"""Winner determination: which bids get which machines.

The problem is a multiple-knapsack with assignment restrictions (each bid is
an item of ``gpus`` size that fits only its feasible machines, taken whole or
not at all), NP-hard in general, so the engine combines these parts, class
by class in priority order:

0. The class's LP relaxation on what is free (``bound.py``, with column
   generation over the pruned pairs; multi-machine bids enter as whole
   fills, one column per placement in one bucket), which also proves the
   class's bound;
   its integral part stands; the fractional single-machine rest (a MILP, or
   above DIVE_PAIRS pairs an LP dive) and the multi-machine bids (filled where the LP put them, net of
   its GPU prices) compete for what the LP shared between them: the
   multi-machine bids go first (``round_lp``); multi-machine bids
   left without room may evict cheaper same-class tenants; the greedy below
   places what is left. Huge classes skip the LP.
1. A greedy pass in priority order: class (reserved, on-demand, spot), then
   the bid's best score per GPU (surplus per unit of the scarce resource),
   then the documented tie-breaks - higher max price, older bid, lower id.
   Each bid takes its best-scoring offer that still has room; bids whose
   candidate list ran dry scan their views for the cheapest offer with room.
2. An improvement pass: an unmatched bid may take the place of matched bids
   of the same class on one machine when its score beats theirs and the
   displaced bids can move to other machines or lose less than it gains.
3. For larger rounds' classes of at most 40 same-machine bids, an exact
   depth-first branch and bound over the class (bids in priority order, best
   option first, bounded by the sum of each remaining bid's best score), seeded
   with the greedy solution so it only replaces it with a strictly better one:
   tie-breaks survive.

Small rounds take the exact path instead (``exact.py``): a lexicographic MIP over
all three classes, each class started from what 0-2 find for it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from .bound import NO_FILLS, Fills, class_lp, dive_pick, lagrange_bound, milp_pick
from .market import F64, I64, BidViews, Candidates, Market, multi_offers, top_candidates, unfillable
from .types import CLASSES, no_lap

Part = tuple[int, int, int]  # offer index, GPUs, score
FIT_TOLERANCE = 0.0
SEED_KMAX = 16  # the greedy that seeds a class LP's columns refills with this many candidates first (``refill``)
LP_CG_ROUNDS = 6  # rounds of column generation (warm-started), twice as many with fills; fewer once the bound meets the LP
REFILL_KMAX = 128  # a refill pass doubles the candidates each waiting bid gets, up to this
LP_FILL_COLUMNS = 150_000  # up to this, multi-machine bids enter the LP as whole fills (tight, slower to solve)
LP_MAX_COLUMNS = 400_000  # above this, greedy + a Lagrangian-priced bound instead of the LP
# The fractional single-machine rest. Up to DIVE_PAIRS pairs, a MILP (HiGHS) that stops once
# its incumbent is proven within FRAC_MILP_GAP of its own bound. Above, an LP dive
# (``bound.dive_pick``), kept when it is proven within DIVE_ACCEPT of its LP bound, else the
# MILP started from it. At 1,000 orders a side that MILP was the round's time, HiGHS spending it
# at its root (cut rounds, then sub-MIPs) and in proving the last hundredths of a percent:
# all_reserved's rest (20,242 pairs) took 38 s at a gap of 1e-6, 8.7 s at 1e-3 (0.99991 of the
# same incumbent), and its dive 0.65 s (0.9991). Rounds of 1,000 a side, seeds 0-1, nine
# families: 0.5-5.2 s each instead of 0.5-39 s, the round's surplus within -0.4% (fair_share)
# to +0.13% (ties) of the MILP's. Small rests keep the MILP: they are cheap, and the exact
# path starts its classes from what the LP path finds (at the limits, where scores span twelve
# digits, a different start moved the MIP's reported bound). The class's reported bound is
# the class LP's, so it stays a bound.
FRAC_MILP_GAP = 1e-3
DIVE_PAIRS = 5_000
DIVE_ACCEPT = 5e-3


Snapshot = tuple[
    list[int], dict[tuple[int, int, int], int], dict[int, list["Part"]], dict[tuple[int, int, int], int]
]


@dataclass
class _LpMulti:
    """The LP's view of a class's multi-machine bids: per bid the GPUs it put
    on each offer, its LP mass (1 = whole) and its LP value."""

    gpus: dict[int, dict[int, float]]
    mass: F64
    val: F64

    @classmethod
    def of(cls, mkt: Market, pb: I64, po: I64, ps: I64, x: F64, fills: Fills = NO_FILLS,
           fx: F64 | None = None) -> _LpMulti:
        """From the LP's multi-machine pairs (a fraction of the bid on one
        offer) and its whole fills (a fraction of one placement)."""
        gpus: dict[int, dict[int, float]] = {}
        for i in np.flatnonzero(x > 1e-6).tolist():
            b, o = int(pb[i]), int(po[i])
            gpus.setdefault(b, {})[o] = float(x[i]) * float(mkt.b_gpus[b])
        n = len(mkt.bids)
        mass: F64 = np.bincount(pb, weights=x, minlength=n).astype(np.float64)
        val: F64 = np.bincount(pb, weights=x * ps, minlength=n).astype(np.float64)
        if len(fills) and fx is not None:
            for j in np.flatnonzero(fx > 1e-6).tolist():
                on = gpus.setdefault(int(fills.bid[j]), {})
                for o, t in fills.parts(j):
                    on[o] = on.get(o, 0.0) + float(fx[j]) * t
            mass += np.bincount(fills.bid, weights=fx, minlength=n)
            val += np.bincount(fills.bid, weights=fx * fills.score, minlength=n)
        return cls(gpus, mass, val)

    def whole(self, mkt: Market) -> list[int]:
        """The bids the LP fills whole, largest LP value first."""
        w = np.flatnonzero(self.mass >= 0.999)
        out: list[int] = w[np.lexsort((mkt.bids_id[w], -self.val[w]))].tolist()
        return out


@dataclass
class State:
    free: list[int]
    used: dict[tuple[int, int, int], int] = field(default_factory=dict)
    limits: dict[tuple[int, int], int] = field(default_factory=dict)  # scarce bucket -> cap

    def fair_ok(self, buyer: int, bucket: tuple[int, int], gpus: int) -> bool:
        lim = self.limits.get(bucket)
        if lim is None:
            return True
        return self.used.get((buyer, *bucket), 0) + gpus <= lim

    def take(self, buyer: int, bucket: tuple[int, int], parts: list[Part]) -> None:
        for o, g, _ in parts:
            self.free[o] -= g
        key = (buyer, *bucket)
        self.used[key] = self.used.get(key, 0) + sum(g for _, g, _ in parts)

    def give(self, buyer: int, bucket: tuple[int, int], parts: list[Part]) -> None:
        for o, g, _ in parts:
            self.free[o] += g
        key = (buyer, *bucket)
        self.used[key] -= sum(g for _, g, _ in parts)


@dataclass
class Solver:
    mkt: Market
    cand: Candidates
    state: State
    scan_limit: int = 64
    milp_nodes: int = 2_000
    milp_pairs: int = 40_000  # the fractional rest's MILP gives up above this (10k on-demand: up to ~21k)
    scan_fallback: bool = True  # large rounds refill lists in bulk instead
    dive_pairs: int = DIVE_PAIRS  # a part of a large round dives at any size, as the whole round would (clear._cleared)
    ptr: dict[tuple[int, int, int], int] = field(default_factory=dict)
    gpu_price: F64 | None = None  # while rounding an LP: its shadow price per GPU (plain capacity row)
    assigned: dict[int, list[Part]] = field(default_factory=dict)
    buyer: list[int] = field(default_factory=list)
    lap: Callable[[str], None] = no_lap  # ``clear_round``'s stopwatch: the end of a stage
    limited: list[str] = field(default_factory=list)  # classes whose LP stopped at ``bound.LP_WORK_LIMIT``
    capped: list[str] = field(default_factory=list)  # classes whose LP held its fills at ``bound.LP_MAX_FILLS``

    def __post_init__(self) -> None:
        self.buyer = [b.buyer_id for b in self.mkt.bids]

    def bucket(self, o: int) -> tuple[int, int]:
        return int(self.mkt.o_model[o]), int(self.mkt.o_region[o])

    def score_of(self, b: int, o: int, gpus: int) -> int:
        v = self.mkt.value(b, o)
        return round(float(gpus) * float(self.mkt.b_hours[b]) * v)

    # options ---------------------------------------------------------------

    def best_single(self, b: int) -> list[Part] | None:
        """Best offer with room for same-machine bid ``b``."""
        g = int(self.mkt.b_gpus[b])
        st = self.state
        pick: tuple[int, int, int] | None = None  # leftover, rank, offer
        floor = 0
        for i, (o, s) in enumerate(zip(self.cand.offers[b], self.cand.scores[b], strict=True)):
            if pick is not None and s < floor:
                break
            f = st.free[o]
            if f >= g and st.fair_ok(self.buyer[b], self.bucket(o), g):
                if pick is None:
                    floor = s - int(s * FIT_TOLERANCE)
                key = (f - g, i, o)
                if pick is None or key < pick:
                    pick = key
                if f == g:
                    break
        if pick is not None:
            i, o = pick[1], pick[2]
            return [(o, g, self.cand.scores[b][i])]
        if not self.cand.truncated[b] or not self.scan_fallback:
            return None
        return self._scan_single(b, g)

    def _scan_single(self, b: int, g: int) -> list[Part] | None:
        mkt, st = self.mkt, self.state
        best: tuple[int, int, int, int] | None = None  # -score, ask, id, o
        maxp = int(mkt.b_maxp[b])
        for key in self.cand.views[b]:
            view = mkt.views[key]
            t = key[2]
            p = self.ptr.get(key, 0)
            while p < len(view) and st.free[int(view[p])] < t:
                p += 1
            self.ptr[key] = p
            if not st.fair_ok(self.buyer[b], (key[0], key[1]), g):
                continue
            seen = 0
            while p < len(view) and seen < self.scan_limit:
                o = int(view[p])
                p += 1
                if mkt.o_ask[o] > maxp:
                    break
                if st.free[o] < g or not mkt.offer_ok(b, o):
                    continue
                seen += 1
                s = self.score_of(b, o, g)
                if s <= 0:
                    continue
                k = (-s, int(mkt.o_ask[o]), int(mkt.o_id[o]), o)
                if best is None or k < best:
                    best = k
        if best is None:
            return None
        return [(best[3], g, -best[0])]

    def lp_multi(self, b: int, lp_gpus: dict[int, float]) -> list[Part] | None:
        """A multi-machine bid placed where the LP put it: in the bucket holding most
        of its LP GPUs, those offers first (their LP share, rounded), the rest of
        its GPUs from that bucket's best offers with room."""
        mkt, st = self.mkt, self.state
        g = int(mkt.b_gpus[b])
        mass: dict[tuple[int, int], float] = {}
        for o, gx in lp_gpus.items():
            mass[self.bucket(o)] = mass.get(self.bucket(o), 0.0) + gx
        bucket = min(mass, key=lambda k: (-mass[k], k))
        if not st.fair_ok(self.buyer[b], bucket, g):
            return None
        need, parts = g, []
        for o, gx in sorted(lp_gpus.items(), key=lambda kv: (-kv[1], int(mkt.o_id[kv[0]]))):
            take = min(need, st.free[o], int(round(gx)))
            if self.bucket(o) == bucket and take > 0:
                parts.append((o, take, self.score_of(b, o, take)))
                need -= take
        if need:
            for o, take, _ in parts:
                st.free[o] -= take
            try:
                rest = self.best_multi(b, need=need, only=bucket)
            finally:
                for o, take, _ in parts:
                    st.free[o] += take
            if rest is None:
                return None
            merged: dict[int, int] = {}
            for o, take, _ in parts + rest:
                merged[o] = merged.get(o, 0) + take
            parts = [(o, k, self.score_of(b, o, k)) for o, k in merged.items()]
        return parts if sum(p[2] for p in parts) > 0 else None

    def best_multi(self, b: int, need: int | None = None, only: tuple[int, int] | None = None) -> list[Part] | None:
        """Best single-bucket fill for a bid that may span machines (``need`` of
        its GPUs, in bucket ``only`` when given): per bucket, its offers by
        value per GPU - net of the LP's price per GPU there while an LP is
        being rounded, so a job that spans machines takes the GPUs the LP
        values least (leftovers) before whole machines others need - and the
        bucket whose fill is worth most."""
        mkt, st = self.mkt, self.state
        g = int(mkt.b_gpus[b]) if need is None else need
        best: tuple[int, list[Part]] | None = None
        for key in self.cand.views[b]:
            if only is not None and (key[0], key[1]) != only:
                continue
            if need is None and not st.fair_ok(self.buyer[b], (key[0], key[1]), g):
                continue
            offs, v = multi_offers(self.mkt, b, key)
            room = np.fromiter((st.free[o] for o in offs.tolist()), dtype=np.int64, count=len(offs))
            if int(room.sum()) < g:
                continue
            has = room > 0
            offs, v, room = offs[has], v[has], room[has]
            if self.gpu_price is not None:  # net of what the LP says a GPU there is worth
                v = v * float(mkt.b_hours[b]) - self.gpu_price[offs]
            order = np.lexsort((mkt.o_id[offs], mkt.o_ask[offs], -v))
            offs, room = offs[order], room[order]
            take = np.minimum(np.maximum(g - (np.cumsum(room) - room), 0), room)
            n = int(np.count_nonzero(take))  # a prefix: the fill stops once it has g
            parts = [(o, t, self.score_of(b, o, t)) for o, t in zip(offs[:n].tolist(), take[:n].tolist(), strict=True)]
            total = sum(s for _, _, s in parts)
            if total > 0 and (best is None or total > best[0]):
                best = (total, parts)
        return None if best is None else best[1]

    def option(self, b: int) -> list[Part] | None:
        return self.best_single(b) if self.mkt.b_same[b] else self.best_multi(b)

    # passes ----------------------------------------------------------------

    def place(self, b: int, parts: list[Part]) -> None:
        self.state.take(self.buyer[b], self.bucket(parts[0][0]), parts)
        self.assigned[b] = parts

    def unplace(self, b: int) -> list[Part]:
        parts = self.assigned.pop(b)
        self.state.give(self.buyer[b], self.bucket(parts[0][0]), parts)
        return parts

    def greedy(self, order: list[int]) -> None:
        for b in order:
            parts = self.option(b)
            if parts is not None:
                self.place(b, parts)

    def columns(self, bids: list[int]) -> tuple[I64, I64, I64]:
        """The candidate pairs of ``bids`` that fit what is free, as LP columns."""
        mkt, cand = self.mkt, self.cand
        sizes = [len(cand.offers[b]) for b in bids]
        pb = np.repeat(np.asarray(bids, dtype=np.int64), sizes)
        po = np.asarray([o for b in bids for o in cand.offers[b]], dtype=np.int64)
        ps = np.asarray([s for b in bids for s in cand.scores[b]], dtype=np.int64)
        free = np.asarray(self.state.free, dtype=np.int64)
        need = np.where(mkt.b_same[pb], mkt.b_gpus[pb], 1)
        fit = free[po] >= need
        return pb[fit], po[fit], ps[fit]

    def refresh(self, bids: list[int], kmax: int) -> I64:
        """Fresh candidate lists for ``bids`` over what is free now; returns
        per bid the bound on the scores of the pairs it left out."""
        only = np.zeros(len(self.mkt.bids), dtype=np.bool_)
        only[bids] = True
        free = np.asarray(self.state.free, dtype=np.int64)
        views = self.cand.views if isinstance(self.cand.views, BidViews) else None
        fresh = top_candidates(self.mkt, kmax, only=only, cap=free, views=views)
        for b in bids:
            self.cand.offers[b] = fresh.offers[b]
            self.cand.scores[b] = fresh.scores[b]
            self.cand.truncated[b] = fresh.truncated[b]
        assert fresh.rest is not None
        return fresh.rest

    def lp_class(self, bids: list[int], rest: I64 | None) -> int | None:
        """Solve the class's LP (with column generation when lists were
        pruned), round it, fill greedily; returns the class's proven bound."""
        views = self.cand.views if isinstance(self.cand.views, BidViews) else None
        free = np.asarray(self.state.free, dtype=np.int64)
        arr = np.asarray(sorted(bids), dtype=np.int64)
        skip = unfillable(self.mkt, bids, free, self.cand.views)
        pb, po, ps = self.columns(bids)
        huge = len(pb) > LP_MAX_COLUMNS  # no LP: the greedy's placement stands, under a Lagrangian bound
        if rest is not None:  # lists pruned: the LP starts from what the greedy would place too
            pb, po, ps = self._seed(bids, pb, po, ps, keep=huge)
        if skip:
            nr = len(self.mkt.region_ids)
            bucket = self.mkt.o_model[po] * nr + self.mkt.o_region[po]
            drop = np.zeros(len(pb), dtype=np.bool_)
            for (m, r), out in skip.items():
                drop |= (bucket == m * nr + r) & np.isin(pb, out)
            pb, po, ps = pb[~drop], po[~drop], ps[~drop]
        klass = CLASSES[int(self.mkt.b_klass[bids[0]])] if bids else CLASSES[0]
        if huge:
            if rest is None:
                self.greedy(bids)
            got = sum(p[2] for b in bids for p in self.assigned.get(b, ()))
            self.lap(klass)
            ub = lagrange_bound(self.mkt, arr, (pb, po, ps), free, rest, views, skip, got)
            self.lap(f"{klass} bound")
            return ub
        small = len(pb) <= LP_FILL_COLUMNS
        self.lap(klass)
        lp = class_lp(self.mkt, arr, (pb, po, ps), free, rest, views, rounds=LP_CG_ROUNDS * (2 if small else 1),
                      skip=skip, fills=self.cand.views, whole_fills=small)
        self.lap(f"{klass} bound")
        if lp is None:  # pragma: no cover - HiGHS failing on a feasible LP
            self.greedy(bids)
            return None
        if lp.limited:
            self.limited.append(klass)
        if lp.capped:
            self.capped.append(klass)
        self.gpu_price = lp.lam[:, 0]
        try:
            self.round_lp(bids, lp.pb, lp.po, lp.ps, lp.x, lp.pair_price(self.mkt), lp.fills, lp.fx)
        finally:
            self.gpu_price = None
        return lp.bound

    def _seed(self, bids: list[int], pb: I64, po: I64, ps: I64, keep: bool = False) -> tuple[I64, I64, I64]:
        """Columns ``pb, po, ps`` and the pairs the greedy (with its refills) would place
        the class's same-machine bids on, from here; the solver is left as it was, or
        with ``keep`` holding that placement (a class too big for its LP keeps it).

        Every bid of a view ranks its offers alike (by ask, within a bid's weights), so
        each bid's best pairs are the same few cheapest offers: at 10k orders a side of
        the all-spot family the LP's first columns reached 1,428 offers and were worth 0.43
        of the surplus the round ended with; six rounds of column generation (about four
        columns a bid each) brought the LP to 0.90 of it, its bound still 1.45x it. The greedy's
        pairs spread the columns over the offers the bids can share: the LP starts at
        least at the greedy's value, and its prices cover the offers that value uses.
        Multi-machine bids take their greedy fills here (their room shapes where the
        others go) but join the LP as before, pairs or whole fills."""
        start = self.snapshot()
        lists = [(self.cand.offers[b], self.cand.scores[b], self.cand.truncated[b]) for b in bids]
        same = [b for b in bids if self.mkt.b_same[b]]
        self.greedy(bids)
        self.refill(same, SEED_KMAX)
        got = [(b, o, s) for b in same for o, _, s in self.assigned.get(b, ())]
        if not keep:
            self.restore(start)
        # the greedy and its refills widen candidate lists; the class LP's ``rest`` bound
        # counts the pairs off each bid's list as they were, so the lists go back too
        for b, (o, s, t) in zip(bids, lists, strict=True):
            self.cand.offers[b], self.cand.scores[b], self.cand.truncated[b] = o, s, t
        if not got:
            return pb, po, ps
        gb, go, gs = np.asarray(got, dtype=np.int64).T
        no = len(self.mkt.offers)
        new = ~np.isin(gb * no + go, pb * no + po)
        return np.concatenate([pb, gb[new]]), np.concatenate([po, go[new]]), np.concatenate([ps, gs[new]])

    def round_lp(self, bids: list[int], pb: I64, po: I64, ps: I64, x: F64, price: F64,
                 fills: Fills = NO_FILLS, fx: F64 | None = None) -> None:
        """Round an LP solution into whole assignments.

        The LP's integral single-machine part stands as it is. What is left -
        the fractional single-machine bids and the multi-machine bids - compete
        for the same leftover GPUs, and which goes first matters: the
        fractional bids' MILP and the multi-machine fills each take what the
        LP shared between them. The multi-machine bids go first; where the LP
        had them as pairs (big classes), the other order is tried too from
        the same state and the one worth more is kept (multi-machine first on
        a tie).
        Either way, multi-machine bids the LP wanted that found no room may
        move cheaper same-class tenants out of a bucket (``_evict_for_multi``),
        then pairs by LP weight and net score, then the greedy, fill what is
        open.
        """
        mkt = self.mkt
        same = mkt.b_same[pb]
        multi = _LpMulti.of(mkt, pb[~same], po[~same], ps[~same], x[~same], fills, fx)
        pb, po, ps, x, price = pb[same], po[same], ps[same], x[same], price[same]
        # 1. the integral part of the LP solution stands as it is
        sure = np.flatnonzero(x >= 0.999)
        for i in sure[np.lexsort((mkt.o_id[po[sure]], mkt.bids_id[pb[sure]]))].tolist():
            self._try(int(pb[i]), int(po[i]), int(ps[i]))
        frac = bool(((x > 1e-6) & (x < 0.999)).any())
        # the orders differ only with fractional bids and multi-machine bids the LP
        # filled; with those as whole fills the fractional MILP first never won
        # (3k and 10k bench rounds, 3 seeds each: the same surplus to the unit)
        if not (frac and multi.whole(mkt) and not len(fills)):
            self._round_rest(bids, pb, po, ps, x, price, multi, multi_first=True)
            return
        start = self.snapshot()
        first = self._round_rest(bids, pb, po, ps, x, price, multi, multi_first=True)
        kept = self.snapshot()
        self.restore(start)
        if self._round_rest(bids, pb, po, ps, x, price, multi, multi_first=False) <= first:
            self.restore(kept)

    def _round_rest(self, bids: list[int], pb: I64, po: I64, ps: I64, x: F64, price: F64, multi: _LpMulti,
                    *, multi_first: bool) -> int:
        """After the LP's integral part: the multi-machine bids and the
        fractional MILP in one order, evictions for the multi-machine bids
        left out, then what is open; returns the class's surplus."""
        mkt = self.mkt
        if multi_first:
            self._multi_whole(multi)
        self._frac_milp(pb, po, ps, x)
        if not multi_first:
            self._multi_whole(multi)
        wanted = sorted(b for b in multi.gpus if b not in self.assigned)
        if wanted:
            on = self._tenants(int(mkt.b_klass[wanted[0]]))
            for b in sorted(wanted, key=lambda b: (-float(multi.val[b]), int(mkt.bids_id[b]))):
                self._evict_for_multi(b, on)
        self._fill_open(bids, pb, po, ps, x, price)
        return sum(p[2] for b in bids for p in self.assigned.get(b, ()))

    def snapshot(self) -> Snapshot:
        """What placing changes (parts lists are replaced, never edited)."""
        st = self.state
        return list(st.free), dict(st.used), dict(self.assigned), dict(self.ptr)

    def restore(self, snap: Snapshot) -> None:
        self.state.free = list(snap[0])
        self.state.used = dict(snap[1])
        self.assigned = dict(snap[2])
        self.ptr = dict(snap[3])

    def _multi_whole(self, multi: _LpMulti) -> None:
        """Multi-machine bids the LP fills whole, largest LP value first."""
        for b in multi.whole(self.mkt):
            if b in self.assigned:
                continue
            parts = self.lp_multi(b, multi.gpus[b]) or self.best_multi(b)
            if parts is not None:
                self.place(b, parts)

    def _frac_milp(self, pb: I64, po: I64, ps: I64, x: F64) -> None:
        """The fractional single-machine rest is small: solve it as a MILP on
        what is left, with the current tenants of the machines it competes for
        when that stays small (the LP's integral part is not always the MILP's)."""
        mkt, st = self.mkt, self.state
        frac = np.unique(pb[(x > 1e-6) & (x < 0.999)])
        frac = frac[[int(b) not in self.assigned for b in frac.tolist()]]
        if not len(frac):
            return
        touched = set(po[np.isin(pb, frac)].tolist())
        mine = set(pb.tolist())
        tenants = sorted(b for b, q in self.assigned.items() if b in mine and q[0][0] in touched)
        grp = np.union1d(frac, np.asarray(tenants, dtype=np.int64))
        saved: dict[int, list[Part]] = {}
        if int(np.isin(pb, grp).sum()) <= self.milp_pairs:
            saved = {b: self.unplace(b) for b in tenants}
            frac = grp
        keep = np.isin(pb, frac)
        qb, qo, qs = pb[keep], po[keep], ps[keep]
        if len(qb) > self.milp_pairs:
            for b, parts in saved.items():
                self.place(b, parts)
            return
        free = np.asarray(st.free, dtype=np.int64)
        if len(qb) <= self.dive_pairs:
            pick = milp_pick(mkt, qb, qo, qs, free, self.milp_nodes, FRAC_MILP_GAP)
        else:
            pick, lp_bound = dive_pick(mkt, qb, qo, qs, free)
            if int(qs[pick].sum()) < (1 - DIVE_ACCEPT) * lp_bound:  # not proven close: the MILP, from it
                better = milp_pick(mkt, qb, qo, qs, free, self.milp_nodes, FRAC_MILP_GAP, start=pick)
                if int(qs[better].sum()) > int(qs[pick].sum()):
                    pick = better
        # a node-limited MILP may stop at a weak incumbent: keep it only when it
        # is worth at least what the tenants it displaced were
        if int(qs[pick].sum()) < sum(p[2] for parts in saved.values() for p in parts):
            pick = np.zeros(0, dtype=np.int64)
            for b, parts in saved.items():
                self.place(b, parts)
        for i in pick.tolist():
            self._try(int(qb[i]), int(qo[i]), int(qs[i]))

    def _fill_open(self, bids: list[int], pb: I64, po: I64, ps: I64, x: F64, price: F64) -> None:
        """Whatever is still open: pairs by LP weight, then score net of the
        offer's shadow price, then the greedy."""
        mkt = self.mkt
        net = ps - mkt.b_gpus[pb] * price
        xr = np.round(x, 6)
        order = np.lexsort((mkt.o_id[po], mkt.bids_id[pb], -ps, -net, -xr))
        for i in order.tolist():
            if xr[i] <= 0:
                break
            self._try(int(pb[i]), int(po[i]), int(ps[i]))
        self.greedy([b for b in bids if b not in self.assigned])

    def _tenants(self, klass: int) -> dict[int, list[int]]:
        """Per offer, the single-machine bids of ``klass`` placed on it."""
        mkt = self.mkt
        on: dict[int, list[int]] = {}
        for t in sorted(self.assigned):
            q = self.assigned[t]
            if len(q) == 1 and mkt.b_klass[t] == klass and mkt.b_same[t]:
                on.setdefault(q[0][0], []).append(t)
        return on

    def _evict_for_multi(self, b: int, on: dict[int, list[int]]) -> None:
        """Make room for multi-machine bid ``b`` in the one of its buckets where
        that is worth most: move single-machine bids of its class off the
        bucket's offers (lowest surplus per GPU first) until its GPUs are free,
        place it, and let the moved bids take their next-best places. Kept
        only when ``b``'s surplus beats what the moved bids lose."""
        best: tuple[int, int] | None = None  # net gain, index of the view key
        keys = list(self.cand.views[b])
        for i in range(len(keys)):
            net = self._evict_move(b, keys[i], on, keep=False)
            if net is not None and net > 0 and (best is None or net > best[0]):
                best = (net, i)
        if best is not None:
            self._evict_move(b, keys[best[1]], on, keep=True)

    def _evict_move(self, b: int, key: tuple[int, int, int], on: dict[int, list[int]], keep: bool) -> int | None:
        """Make room for ``b`` in ``key``'s bucket, moving tenants (``on``: per
        offer, the single-machine bids of ``b``'s class on it); undone unless
        ``keep`` and it gains. The net surplus gained, or None when ``b``
        cannot fit there."""
        mkt, st = self.mkt, self.state
        g = int(mkt.b_gpus[b])
        bucket = (key[0], key[1])
        if not st.fair_ok(self.buyer[b], bucket, g):
            return None
        offs = set(multi_offers(self.mkt, b, key)[0].tolist())
        room = sum(st.free[o] for o in offs)
        if not offs or room >= g:  # nothing to move (best_multi already had its chance)
            return None
        tenants = sorted(
            (self.assigned[t][0][2] / int(mkt.b_gpus[t]), int(mkt.bids_id[t]), t)
            for o in offs
            for t in on.get(o, ())
        )
        evict: list[int] = []
        for _, _, t in tenants:
            if room >= g:
                break
            evict.append(t)
            room += int(mkt.b_gpus[t])
        if room < g:
            return None
        saved = {t: self.unplace(t) for t in evict}
        lost = sum(p[2] for q in saved.values() for p in q)
        parts = self.best_multi(b, only=bucket)
        if parts is None:
            for t, q in saved.items():
                self.place(t, q)
            return None
        self.place(b, parts)
        gain = sum(p[2] for p in parts)
        moved: list[int] = []
        for t in evict:
            alt = self.option(t)
            if alt is not None:
                self.place(t, alt)
                moved.append(t)
                gain += sum(p[2] for p in alt)
        if keep and gain > lost:
            for t, q in saved.items():
                on[q[0][0]].remove(t)
            for t in moved:
                on.setdefault(self.assigned[t][0][0], []).append(t)
            return gain - lost
        for t in moved:
            self.unplace(t)
        self.unplace(b)
        for t, q in saved.items():
            self.place(t, q)
        return gain - lost

    def refill(self, bids: list[int], kmax: int, passes: int = 16) -> None:
        """Give bids whose lists ran dry fresh lists over what is still free.

        One vectorised candidate search for all of them at once, then the
        greedy again in the same order; replaces per-bid scans of the views.
        In a thick market many bids share the same cheapest offers, so this
        repeats while a pass still places bids (at most ``passes`` times),
        each pass with twice the candidates per bid of the one before (up to
        ``REFILL_KMAX``): at 100k orders a side, with 16 each time, pass after
        pass placed ~15% of the waiting on-demand bids (16 passes, 78.3%
        matched); doubling, 7 passes place more (79.8%) in the same time.
        """
        for p in range(passes):
            waiting = [b for b in bids if b not in self.assigned and self.cand.truncated[b]]
            if not waiting:
                return
            only = np.zeros(len(self.mkt.bids), dtype=np.bool_)
            only[waiting] = True
            free = np.asarray(self.state.free, dtype=np.int64)
            views = self.cand.views if isinstance(self.cand.views, BidViews) else None
            fresh = top_candidates(self.mkt, min(kmax << p, REFILL_KMAX), only=only, cap=free, views=views)
            for b in waiting:
                self.cand.offers[b] = fresh.offers[b]
                self.cand.scores[b] = fresh.scores[b]
                self.cand.truncated[b] = fresh.truncated[b]
            before = len(self.assigned)
            self.greedy(waiting)
            if len(self.assigned) == before:
                return

    def _try(self, b: int, o: int, s: int) -> None:
        g = int(self.mkt.b_gpus[b])
        st = self.state
        if b in self.assigned or st.free[o] < g or not st.fair_ok(self.buyer[b], self.bucket(o), g):
            return
        self.place(b, [(o, g, s)])

    def improve(self, order: list[int], klass: int) -> None:
        """Let an unmatched bid evict cheaper same-class work from one machine."""
        mkt, st = self.mkt, self.state
        on: dict[int, list[int]] = {}
        for b2, parts in self.assigned.items():
            if mkt.b_klass[b2] == klass and len(parts) == 1:
                on.setdefault(parts[0][0], []).append(b2)
        for b in order:
            if b in self.assigned or not mkt.b_same[b]:
                continue
            g = int(mkt.b_gpus[b])
            done = False
            for o, s in zip(self.cand.offers[b], self.cand.scores[b], strict=True):
                here = sorted(on.get(o, ()), key=lambda x: self.assigned[x][0][2] / mkt.b_gpus[x])
                need = g - st.free[o]
                evict: list[int] = []
                lost = 0
                for b2 in here:
                    if need <= 0:
                        break
                    evict.append(b2)
                    need -= int(mkt.b_gpus[b2])
                    lost += self.assigned[b2][0][2]
                if need > 0 or not evict or lost >= s:
                    continue
                saved = {b2: self.unplace(b2) for b2 in evict}
                if not st.fair_ok(self.buyer[b], self.bucket(o), g):
                    for b2, parts in saved.items():
                        self.place(b2, parts)
                    continue
                self.place(b, [(o, g, s)])
                moved: dict[int, list[Part]] = {}
                gain = s
                for b2 in evict:
                    alt = self.option(b2)
                    if alt is not None:
                        self.place(b2, alt)
                        moved[b2] = alt
                        gain += sum(x[2] for x in alt)
                if gain > lost:
                    on.setdefault(o, []).append(b)
                    for b2 in evict:
                        on[o].remove(b2)
                        if b2 in moved:
                            on.setdefault(moved[b2][0][0], []).append(b2)
                    done = True
                    break
                # undo
                for b2 in moved:
                    self.unplace(b2)
                self.unplace(b)
                for b2, parts in saved.items():
                    self.place(b2, parts)
            if done:
                continue

    def exact(self, order: list[int], node_limit: int) -> bool:
        """Branch and bound over ``order``; True when it proved optimality."""
        mkt = self.mkt
        bids = [b for b in order if self.cand.offers[b]]
        for b in bids:
            if b in self.assigned:
                self.unplace(b)
        best_sc = [max(self.cand.scores[b]) if mkt.b_same[b] else self._multi_cap(b) for b in bids]
        suffix = [0] * (len(bids) + 1)
        for i in range(len(bids) - 1, -1, -1):
            suffix[i] = suffix[i + 1] + best_sc[i]
        # incumbent: greedy on the same bids
        self.greedy(bids)
        inc_val = sum(sum(p[2] for p in self.assigned.get(b, ())) for b in bids)
        inc = {b: self.assigned[b] for b in bids if b in self.assigned}
        for b in list(inc):
            self.unplace(b)
        nodes = 0
        chosen: dict[int, list[Part]] = {}
        aborted = False

        def dfs(i: int, val: int) -> None:
            nonlocal nodes, inc_val, inc, aborted
            nodes += 1
            if nodes > node_limit:
                aborted = True
                return
            if val + suffix[i] <= inc_val:
                return
            if i == len(bids):
                inc_val = val
                inc = dict(chosen)
                return
            b = bids[i]
            for parts in self._options(b):
                self.place(b, parts)
                chosen[b] = parts
                dfs(i + 1, val + sum(p[2] for p in parts))
                del chosen[b]
                self.unplace(b)
                if aborted:
                    return
            dfs(i + 1, val)

        dfs(0, 0)
        for b, parts in sorted(inc.items()):
            self.place(b, parts)
        return not aborted

    def _multi_cap(self, b: int) -> int:
        # optimistic: the bid's best per-GPU pair for all its GPUs
        g = int(self.mkt.b_gpus[b])
        # plus one base unit per part for rounding each part separately
        return max(self.cand.scores[b], default=0) + g

    def _options(self, b: int) -> list[list[Part]]:
        st = self.state
        if not self.mkt.b_same[b]:
            one = self.best_multi(b)
            return [] if one is None else [one]
        g = int(self.mkt.b_gpus[b])
        return [
            [(o, g, s)]
            for o, s in zip(self.cand.offers[b], self.cand.scores[b], strict=True)
            if st.free[o] >= g and st.fair_ok(self.buyer[b], self.bucket(o), g)
        ]


def priority_order(mkt: Market, cand: Candidates, bids: list[int]) -> list[int]:
    """Class, then best score per GPU, then higher max price, older, lower id."""

    def key(b: int) -> tuple[int, float, int, int, int]:
        best = cand.scores[b][0] if cand.scores[b] else 0
        return (
            int(mkt.b_klass[b]),
            -best / int(mkt.b_gpus[b]),
            -int(mkt.b_maxp[b]),
            mkt.bids[b].created_at,
            mkt.bids[b].id,
        )

    return sorted(bids, key=key)


def fair_share_limits(
    mkt: Market, cand: Candidates, cap: float
) -> dict[tuple[int, int], int]:
    """Per scarce bucket, the most GPUs one buyer may take this round."""
    if cap >= 1.0:
        return {}
    demand: dict[tuple[int, int], int] = {}
    for b, keys in enumerate(cand.views):
        if not cand.offers[b]:
            continue
        for m, r in sorted({(k[0], k[1]) for k in keys}):
            demand[(m, r)] = demand.get((m, r), 0) + int(mkt.b_gpus[b])
    out: dict[tuple[int, int], int] = {}
    for (m, r), d in sorted(demand.items()):
        supply = int(mkt.bucket_supply[m, r])
        if d > supply:
            out[(m, r)] = math.ceil(cap * supply)
    return out

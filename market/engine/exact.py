"""The exact path: a small round's lexicographic MIP, all three classes in one HiGHS model.

Variables, in the round's score unit (``market.py``):

* ``x[b, o]`` in {0, 1}: same-machine bid ``b`` whole on offer ``o``, worth the pair's score;
* ``y[b, k]`` in {0, 1}: a bid that may span machines takes its GPUs in bucket ``k``
  (GPU model x region), worth nothing by itself;
* ``z[b, o]`` in 0..min(gpus, offer GPUs): its GPUs on offer ``o`` of that bucket (an offer
  it values above nothing), worth ``hours x value`` per GPU.

Rows: a bid is placed at most once (its ``x`` and ``y`` sum to at most 1); an offer's GPUs
hold what is put on it; a spanning bid's parts in bucket ``k`` add up to its GPUs when
``y[b, k]`` is 1 and to nothing otherwise; in a scarce bucket a buyer's GPUs stay within the
fair-share cap (``assign.fair_share_limits``); and the divisibility rows of ``bound.py``
(jobs of multiples of 2, 4, 8 or 16 GPUs use at most the offer's GPUs rounded down to that
multiple), which only cut fractional points and tighten every node's relaxation.

The problem is lexicographic, and so is the solve (``Lexicographic``, driven by
``clear.py``): maximise the reserved surplus; then, with a row holding the reserved surplus at
what that solve reached, the on-demand surplus, the reserved bids free to move (a tie among
reserved solutions goes to the one that leaves on-demand bids the most); then spot. Each
class's solve starts from the placement the heuristic (LP rounding, greedy, improvement:
``assign.py``) finds for that class on what the model's classes above left, which is
feasible, so a solve stopped by its work limit still returns at least the heuristic's
surplus. Floating point holds a floor row to about 1e-7 of the class's largest score: each
solution is checked in integers, and where a later solve cost a class above even one unit,
that solve is repeated with the classes above fixed where they were. Among solutions of
equal surplus, ``tie_break`` gives a place to the bid first in priority order.

Work is bounded by counts, never by time, on one thread with a fixed seed, so a replay gives
the same trades: per class, ``RoundConfig.exact_node_limit`` branch-and-bound nodes and
``CHECKPOINTS`` of HiGHS's interrupt checks (it makes them between the steps of its search,
root heuristics and cut rounds included; 15 to 250 a second were seen, so they bound work
only roughly: a 200-a-side reserved round ran 64 s with 2,000 of them and 2.4 s with 600,
for 0.99985 of the optimum; the 20-60-a-side rounds need up to 460 to prove theirs). Each class reports HiGHS's dual bound, padded for
its tolerances (``PAD``), at or above its optimum given the classes above at their floors;
it is exact where that padded bound meets its surplus.

The exact path takes rounds whose models are small (``fits``: up to ``EXACT_MAX_COLUMNS``
columns and ``EXACT_MAX_SPANS`` bucket choices of spanning bids, in rounds of at most
``clear.SMALL_PAIRS`` feasible bid x offer pairs; the others take the LP path). Measured over the 209 rounds of
the quality sweep (tests/unit/engine/test_issue29_quality.py, this 2-core box, HiGHS 1.12 as
scipy ships it), the exact path's median round took 0.035 s at 20-60 orders a side (0.57 s
at most), 0.13 s at 80-100 (4.7 s), 0.63 s at 150-200 (7.6 s) and 7.7 s for the two
300-a-side fair-share rounds small enough for it (with 7,000 columns at most; at 12,000 the
two 200-a-side ties rounds join it, 1.7 and 3.3 s, both at the optimum, from 0.88 and 0.97). Where it is slow the time is HiGHS's root: cut
rounds and its sub-MIP heuristics (RENS and RINS, seconds between two checkpoints on the
multi-machine family at 150 a side). Without those heuristics the root takes a third of
that, and multi-machine rounds fall to 0.97 of the optimum: they find the placements of
spanning bids the heuristic misses. Multi-machine rounds with more than ``EXACT_MAX_SPANS``
bucket choices took 6-30 s (150 a side) and 756 s (200, 20,000 nodes): they stay on the
LP path until the spanning bids have a stronger formulation.

A round too big for one model whose classes each fit (``clear._per_class``) builds this
model once per class: that class's bids alone, on the GPUs the classes above left
(``free``) and the fair-share room their buyers have left (``used``). The classes above
stay where they are, so a tie among them is not broken for the classes below; each class
is exact on what it was left (at its work limit, near it). Without floor rows a class's
model takes twice the bucket choices (``CLASS_MAX_SPANS``): the on-demand class of a
multi-machine round at 200 a side, 645 of them, reached 0.9985 of its optimum in 9.8 s.
Over the quality sweep's 110 rounds of 80-300 a side, this and counting a round's feasible
pairs (``clear.SMALL_PAIRS``) left 4 of them below 0.995 of the lexicographic optimum (13
with engine 1.4.0): a multi-machine class of 17,000 columns on the LP path (0.979), one
class at its work limit (0.9935), and two where a class above, exact on what it was left,
broke its ties against the classes below (0.87 and 0.96 on spot).

Why HiGHS (``scipy.optimize._highspy``, the copy scipy ships: no new wheel): the engine's
LP bound already runs on it, it takes a start solution, a node limit and an interrupt
callback, and keeps its model between the class solves. CP-SAT would need integer
objectives (scores pass 2**53 at the limits) and its determinism needs one worker too.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.sparse import coo_matrix

from .bound import run_counted
from .market import CUT_TIERS, F64, I64, Candidates, Market, cut_caps, multi_offers, size_tier

try:  # the HiGHS that scipy ships, as bound.py drives it
    from scipy.optimize._highspy import _core as _highs
except ImportError:  # pragma: no cover - another scipy layout: the LP path clears every round
    _highs = None
AVAILABLE = _highs is not None

Part = tuple[int, int, int]  # offer index, GPUs, score

EXACT_MAX_COLUMNS = 12_000  # the exact path's largest model; rounds above it take the LP path
EXACT_MAX_SPANS = 500  # ... and its most (spanning bid, bucket) choices: each makes the root's cuts dearer
CLASS_MAX_SPANS = 1_000  # ... and in a class's model of its own (no floor rows)

PAD = 1e-7  # of a class's largest option, per bid: what its bound adds for HiGHS's tolerances
CHECKPOINTS = 500  # per class solve: how many times HiGHS may stop to ask whether to go on
KIND_WHOLE, KIND_BUCKET, KIND_PART = 0, 1, 2


@dataclass
class Columns:
    """The model's columns: per column its bid, offer (-1 for a bucket choice), bucket
    (``model * regions + region``), kind, upper limit and worth per unit."""

    bid: I64
    offer: I64
    bucket: I64
    kind: I64
    upper: F64
    worth: F64
    score: I64  # a whole pair's score, exactly (``worth`` is its float, which past 2**53 is not)

    def __len__(self) -> int:
        return len(self.bid)


@dataclass(frozen=True)
class ClassResult:
    klass: int
    surplus: int  # score units, exact integers
    bound: int | None  # score units, at or above the class's optimum given the classes above; None: none proved
    exact: bool
    nodes: int
    status: str  # HiGHS's model status

    @property
    def limited(self) -> bool:
        """The solve stopped at its node limit (or another of HiGHS's limits) before it proved its optimum."""
        return self.status != "Optimal"


@dataclass(frozen=True)
class Plan:
    """What the exact path placed, per bid its parts, and per class what it proved."""

    assigned: dict[int, list[Part]]
    classes: tuple[ClassResult, ...]


def columns(mkt: Market, cand: Candidates, live: Sequence[int], free: I64 | None = None) -> Columns:
    """Every option of the live bids: a same-machine bid's feasible pairs (the
    candidates, all of them in a small round) and a spanning bid's buckets with their
    offers; with ``free``, the options that fit those GPUs per offer."""
    nr = len(mkt.region_ids)
    cap = mkt.o_gpus if free is None else free
    bid: list[int] = []
    off: list[int] = []
    bkt: list[int] = []
    kind: list[int] = []
    upper: list[float] = []
    worth: list[float] = []
    score: list[int] = []
    for b in live:
        g = int(mkt.b_gpus[b])
        if mkt.b_same[b]:
            for o, s in zip(cand.offers[b], cand.scores[b], strict=True):
                if int(cap[o]) < g:
                    continue
                bid.append(b)
                off.append(o)
                bkt.append(int(mkt.o_model[o]) * nr + int(mkt.o_region[o]))
                kind.append(KIND_WHOLE)
                upper.append(1.0)
                worth.append(float(s))
                score.append(s)
            continue
        hours = float(mkt.b_hours[b])
        for m, r, t in cand.views[b]:
            offs, vals = multi_offers(mkt, b, (m, r, t))
            room = cap[offs] > 0
            offs, vals = offs[room], vals[room]
            if int(cap[offs].sum()) < g:
                continue
            k = m * nr + r
            bid.append(b)
            off.append(-1)
            bkt.append(k)
            kind.append(KIND_BUCKET)
            upper.append(1.0)
            worth.append(0.0)
            score.append(0)
            for o, val in zip(offs.tolist(), vals.tolist(), strict=True):
                bid.append(b)
                off.append(o)
                bkt.append(k)
                kind.append(KIND_PART)
                upper.append(float(min(g, int(cap[o]))))
                worth.append(hours * val)
                score.append(0)

    def i64(xs: list[int]) -> I64:
        return np.asarray(xs, dtype=np.int64)

    return Columns(i64(bid), i64(off), i64(bkt), i64(kind), np.asarray(upper, dtype=np.float64),
                   np.asarray(worth, dtype=np.float64), i64(score))


def size_of(mkt: Market, cand: Candidates, live: Sequence[int]) -> tuple[int, int]:
    """The columns ``columns`` would write and the spanning bids' bucket choices among
    them, without writing them (a spanning bid counts every offer of its buckets: an
    upper estimate)."""
    n = spans = 0
    for b in live:
        if mkt.b_same[b]:
            n += len(cand.offers[b])
        else:
            spans += len(cand.views[b])
            n += sum(len(mkt.views[key]) + 1 for key in cand.views[b])
    return n, spans


def fits(mkt: Market, cand: Candidates, live: Sequence[int], max_spans: int | None = None) -> bool:
    """Whether a round's model (or one class's: ``CLASS_MAX_SPANS``) is small enough for the exact path."""
    n, spans = size_of(mkt, cand, live)
    return AVAILABLE and n <= EXACT_MAX_COLUMNS and spans <= (EXACT_MAX_SPANS if max_spans is None else max_spans)


class _Model:
    """The round's MIP in one live HiGHS model."""

    def __init__(self, mkt: Market, cols: Columns, limits: dict[tuple[int, int], int], node_limit: int,
                 free: I64, used: dict[tuple[int, int, int], int]) -> None:
        self.mkt, self.cols = mkt, cols
        n = len(cols)
        nr = len(mkt.region_ids)
        b, o, kind = cols.bid, cols.offer, cols.kind
        g = mkt.b_gpus[b].astype(np.float64)
        rows: list[I64] = []
        cidx: list[I64] = []
        vals: list[F64] = []
        lo: list[F64] = []
        hi: list[F64] = []
        top = 0

        def add(r: I64, c: I64, v: F64, low: F64, high: F64) -> None:
            nonlocal top
            rows.append(r + top)
            cidx.append(c)
            vals.append(v)
            lo.append(low)
            hi.append(high)
            top += len(low)

        inf = np.inf
        # a bid at most once
        sel = np.flatnonzero(kind != KIND_PART)
        ub, local = np.unique(b[sel], return_inverse=True)
        add(local, sel, np.ones(len(sel)), np.full(len(ub), -inf), np.ones(len(ub)))
        # an offer's GPUs, and its divisibility rows
        sel = np.flatnonzero(kind != KIND_BUCKET)
        uo, local = np.unique(o[sel], return_inverse=True)
        per = np.where(kind[sel] == KIND_WHOLE, g[sel], 1.0)
        caps = cut_caps(free[uo])
        add(local, sel, per, np.full(len(uo), -inf), caps[:, 0].astype(np.float64))
        jp = np.where(kind == KIND_WHOLE, size_tier(mkt.b_gpus[b], np.ones(n, dtype=np.bool_)), 0)
        for j in range(1, CUT_TIERS):
            cut = sel[(jp[sel] >= j) & (caps[local, j] < caps[local, 0])]
            if not len(cut):
                continue
            cut_o, loc2 = np.unique(o[cut], return_inverse=True)
            at = np.searchsorted(uo, cut_o)
            add(loc2, cut, g[cut], np.full(len(cut_o), -inf), caps[at, j].astype(np.float64))
        # a spanning bid's parts fill the bucket it chose
        sel = np.flatnonzero(kind != KIND_WHOLE)
        if len(sel):
            key = b[sel] * (len(mkt.model_ids) * nr) + cols.bucket[sel]
            uk, local = np.unique(key, return_inverse=True)
            coef = np.where(kind[sel] == KIND_BUCKET, -g[sel], 1.0)
            add(local, sel, coef, np.zeros(len(uk)), np.zeros(len(uk)))
        # fair share: a buyer's GPUs in a scarce bucket
        if limits:
            buyer = np.asarray([mkt.bids[i].buyer_id for i in b.tolist()], dtype=np.int64)
            cap = np.asarray([limits.get((int(k) // nr, int(k) % nr), -1) for k in cols.bucket.tolist()],
                             dtype=np.int64)
            sel = np.flatnonzero((kind != KIND_PART) & (cap >= 0))
            if len(sel):
                pairs = np.stack([buyer[sel], cols.bucket[sel]], axis=1)
                uk2, local = np.unique(pairs, axis=0, return_inverse=True)
                local = local.reshape(-1)
                lim = np.asarray([limits[(int(k) // nr, int(k) % nr)] - used.get((int(u), int(k) // nr, int(k) % nr), 0)
                                  for u, k in uk2.tolist()], dtype=np.float64)
                add(local, sel, g[sel], np.full(len(uk2), -inf), lim)
        a = coo_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cidx))), shape=(top, n)).tocsc()
        h = _highs._Highs()
        for name, value in (
            ("output_flag", False), ("threads", 1), ("random_seed", 0), ("presolve", "off"),
            ("mip_max_nodes", node_limit), ("mip_rel_gap", 0.0),
            ("mip_heuristic_run_root_reduced_cost", False),
        ):
            h.setOptionValue(name, value)
        none = np.zeros(0, dtype=np.int32)
        h.addRows(top, np.concatenate(lo), np.concatenate(hi), 0, none, none, np.zeros(0))
        h.addCols(n, np.zeros(n), np.zeros(n), cols.upper, a.nnz, a.indptr[:-1].astype(np.int32),
                  a.indices.astype(np.int32), a.data)
        h.changeObjectiveSense(_highs.ObjSense.kMaximize)
        h.changeColsIntegrality(n, np.arange(n, dtype=np.int32), np.full(n, _highs.HighsVarType.kInteger, dtype=np.uint8))
        self.h = h
        self.klass = mkt.b_klass[b]
        # a class's objective in units of its largest option, so HiGHS's tolerances fit it
        self.scale = np.ones(3)
        for k in range(3):
            mine = self.klass == k
            if mine.any():
                self.scale[k] = max(1.0, float((cols.worth[mine] * cols.upper[mine]).max()))

    def objective(self, k: int) -> F64:
        w: F64 = np.where(self.klass == k, self.cols.worth / self.scale[k], 0.0)
        return w

    def solve(self, k: int, start: F64 | None) -> tuple[F64 | None, float, int, str]:
        """Maximise class ``k``'s surplus; returns the solution (None without one),
        HiGHS's dual bound in score units, nodes and the model status."""
        h = self.h
        n = len(self.cols)
        h.changeColsCost(n, np.arange(n, dtype=np.int32), self.objective(k))
        # half a unit of score: any better solution is better by at least that much (parts aside)
        h.setOptionValue("mip_abs_gap", 0.5 / self.scale[k])
        if start is not None:
            sol = _highs.HighsSolution()
            sol.col_value = start.tolist()
            sol.value_valid = True
            h.setSolution(sol)
        run_counted(h, CHECKPOINTS)
        status = h.modelStatusToString(h.getModelStatus())
        info = h.getInfo()
        nodes = int(info.mip_node_count)
        x = np.asarray(h.getSolution().col_value, dtype=np.float64)
        if len(x) != n or not h.getSolution().value_valid or not np.isfinite(info.mip_dual_bound):
            return None, math.inf, nodes, status
        return np.round(x), float(info.mip_dual_bound) * self.scale[k], nodes, status

    def floor(self, k: int, x: F64) -> None:
        """Hold class ``k`` at what ``x`` gives it, less half a unit."""
        w = self.objective(k)
        nz = np.flatnonzero(w)
        got = float(w[nz] @ x[nz])
        self.h.addRows(1, np.asarray([got - 0.5 / self.scale[k]]), np.asarray([np.inf]), len(nz),
                       np.zeros(1, dtype=np.int32), nz.astype(np.int32), w[nz])

    def fix(self, sel: I64, x: F64) -> None:
        """Fix the columns ``sel`` at their values in ``x``."""
        if len(sel):
            self.h.changeColsBounds(len(sel), sel.astype(np.int32), x[sel], x[sel])

    def unfix(self, sel: I64) -> None:
        if len(sel):
            self.h.changeColsBounds(len(sel), sel.astype(np.int32), np.zeros(len(sel)), self.cols.upper[sel])


def _parts(mkt: Market, cols: Columns, x: F64) -> dict[int, list[Part]]:
    """Per placed bid its parts, scored as the rest of the engine scores them."""
    out: dict[int, list[Part]] = {}
    on = np.flatnonzero(x > 0.5)
    for i in on.tolist():
        b, o, kind = int(cols.bid[i]), int(cols.offer[i]), int(cols.kind[i])
        if kind == KIND_WHOLE:
            out[b] = [(o, int(mkt.b_gpus[b]), int(cols.score[i]))]
        elif kind == KIND_PART:
            t = int(x[i])
            v = mkt.value(b, o)
            out.setdefault(b, []).append((o, t, round(float(t) * float(mkt.b_hours[b]) * v)))
    for b in list(out):
        out[b].sort(key=lambda p: int(mkt.o_id[p[0]]))
    return out


def _surplus(mkt: Market, parts: dict[int, list[Part]], k: int) -> int:
    return sum(p[2] for b, q in parts.items() if int(mkt.b_klass[b]) == k for p in q)


class Lexicographic:
    """The round's lexicographic MIP, solved class by class in priority order by its caller
    (``clear.py``), who gives each class a start: the placement its heuristic (LP rounding,
    greedy, improvement) finds for that class on what this model's classes above left. The
    start is feasible, so HiGHS begins from it and only has to better and prove it."""

    def __init__(self, mkt: Market, cand: Candidates, order: Sequence[int],
                 limits: dict[tuple[int, int], int], node_limit: int,
                 free: I64 | None = None, used: dict[tuple[int, int, int], int] | None = None) -> None:
        """The model of the bids ``order`` on the round's offers, or on ``free`` GPUs per
        offer with ``used`` GPUs per (buyer, model, region) already taken towards the
        fair-share cap (a class on what the classes above it left)."""
        self.mkt, self.cand, self.order, self.limits = mkt, cand, order, limits
        self.used = {} if used is None else used
        cap = mkt.o_gpus if free is None else free
        cols = columns(mkt, cand, order, cap)
        self.cols = cols
        self.model = _Model(mkt, cols, limits, node_limit, cap, self.used)
        self.x: F64 = np.zeros(len(cols))
        self.done: list[ClassResult] = []
        self.got = [0, 0, 0]
        klass = self.model.klass
        # a spanning bid's parts are each rounded to a unit apart from the model's worth
        self.slack = [int((cols.kind[klass == k] == KIND_PART).sum()) + 1 for k in range(3)]
        self.n_bids = [len(np.unique(cols.bid[klass == k])) for k in range(3)]
        self.present = sorted({int(k) for k in klass.tolist()})
        self.col_of: dict[tuple[int, int, int], int] = {}  # (kind, bid, offer or bucket) -> column
        for i, (b, o, kd, bk) in enumerate(zip(cols.bid.tolist(), cols.offer.tolist(), cols.kind.tolist(),
                                               cols.bucket.tolist(), strict=True)):
            self.col_of[(kd, b, bk if kd == KIND_BUCKET else o)] = i

    def placed(self, above: int) -> dict[int, list[Part]]:
        """The parts of the bids of the classes above ``above`` in the solution so far."""
        return {b: q for b, q in _parts(self.mkt, self.cols, self.x).items() if int(self.mkt.b_klass[b]) < above}

    def _start(self, k: int, parts: dict[int, list[Part]]) -> F64:
        """The solution so far with class ``k``'s columns set from ``parts``."""
        mkt, nr = self.mkt, len(self.mkt.region_ids)
        x = np.where(self.model.klass == k, 0.0, self.x)
        for b, q in parts.items():
            if mkt.b_same[b]:
                i = self.col_of.get((KIND_WHOLE, b, q[0][0]))
                if i is not None:
                    x[i] = 1.0
                continue
            o0 = q[0][0]
            y = self.col_of.get((KIND_BUCKET, b, int(mkt.o_model[o0]) * nr + int(mkt.o_region[o0])))
            zs = [self.col_of.get((KIND_PART, b, o)) for o, _, _ in q]
            if y is None or any(z is None for z in zs):
                continue  # a part the model has no column for (none is expected): left out of the start
            x[y] = 1.0
            for z, (_, t, _) in zip(zs, q, strict=True):
                assert z is not None
                x[z] = float(t)
        return x

    def solve_class(self, k: int, heuristic: dict[int, list[Part]]) -> ClassResult:
        """Class ``k``'s best surplus, the classes above held at theirs, from ``heuristic``
        (class ``k``'s bids placed on what this model's classes above left)."""
        mkt, cols, model = self.mkt, self.cols, self.model
        above = [c for c in self.present if c < k]
        start = self._start(k, heuristic)
        from_start = _parts(mkt, cols, start)
        found, dual, nodes, status = model.solve(k, start)
        parts = _parts(mkt, cols, found) if found is not None else None
        if parts is None or any(_surplus(mkt, parts, c) < self.got[c] for c in above):
            # a floor row gave way to floating point: the classes above stay where they were
            held = np.flatnonzero(np.isin(model.klass, above))
            model.fix(held, self.x)
            found, dual, nodes2, status = model.solve(k, start)
            model.unfix(held)
            nodes += nodes2
            parts = _parts(mkt, cols, found) if found is not None else None
            if parts is None or any(_surplus(mkt, parts, c) < self.got[c] for c in above):
                found, dual, status = start, math.inf, "HiGHS failed: " + status  # the heuristic's placement
                parts = from_start
        if _surplus(mkt, parts, k) < _surplus(mkt, from_start, k):
            found, parts = start, from_start  # never below the heuristic (a work limit)
        assert found is not None
        self.x = found
        got = self.got[k] = _surplus(mkt, parts, k)
        # HiGHS's figures are floats from a model scaled to the class's largest option: it may
        # take a column whose reduced cost is within 1e-7 of that option (its dual feasibility
        # tolerance) as worth nothing, so its bound is padded by that much per bid of the
        # class (at the limits, where one class's options span twelve digits, it was seen
        # 8.6e-7 of its largest option short with 30 bids), and by a unit per part of a
        # spanning bid (each part's score is rounded on its own). A class is exact where HiGHS
        # proved it and the padded bound still meets its surplus: options worth little enough
        bound: int | None = None
        if math.isfinite(dual):
            pad = PAD * float(model.scale[k]) * max(1, self.n_bids[k])
            bound = max(got, math.ceil(dual + pad) + self.slack[k])
        exact = status == "Optimal" and bound is not None and bound <= got + 2 * self.slack[k]
        result = ClassResult(k, got, got if exact else bound, exact, nodes, status)
        self.done.append(result)
        model.floor(k, self.x)
        return result

    def plan(self) -> Plan:
        return Plan(tie_break(self.mkt, self.cand, _parts(self.mkt, self.cols, self.x), self.order, self.limits,
                              self.used), tuple(self.done))


def tie_break(mkt: Market, cand: Candidates, parts: dict[int, list[Part]], order: Sequence[int],
              limits: dict[tuple[int, int], int],
              taken: dict[tuple[int, int, int], int] | None = None) -> dict[int, list[Part]]:
    """Among solutions of equal surplus, the documented tie-breaks: a waiting same-machine
    bid earlier in ``order`` (``assign.priority_order``: higher max price, older, lower id
    among equals) takes the place of a later one of its class and size whose offer it
    values exactly as much, fair share permitting. Every class's surplus stays as it was."""
    rank = {b: i for i, b in enumerate(order)}
    nr = len(mkt.region_ids)
    used: dict[tuple[int, int], int] = {}  # (buyer, bucket) -> GPUs
    for (buyer, m, r), gpus in (taken or {}).items():  # by bids outside ``parts``
        used[(buyer, m * nr + r)] = used.get((buyer, m * nr + r), 0) + gpus
    for b, q in parts.items():
        key = (mkt.bids[b].buyer_id, int(mkt.o_model[q[0][0]]) * nr + int(mkt.o_region[q[0][0]]))
        used[key] = used.get(key, 0) + sum(p[1] for p in q)
    holder: dict[int, list[int]] = {}  # offer -> same-machine bids whole on it
    for b, q in parts.items():
        if mkt.b_same[b]:
            holder.setdefault(q[0][0], []).append(b)
    changed = True
    while changed:  # each swap moves a place to a bid earlier in ``order``: finite
        changed = False
        for u in order:
            if u in parts or not mkt.b_same[u]:
                continue
            g, k = int(mkt.b_gpus[u]), int(mkt.b_klass[u])
            for o, s in zip(cand.offers[u], cand.scores[u], strict=True):
                bucket = int(mkt.o_model[o]) * nr + int(mkt.o_region[o])
                lim = limits.get((bucket // nr, bucket % nr))
                for p in sorted(holder.get(o, ()), key=lambda b: -rank[b]):
                    if (rank[p] < rank[u] or int(mkt.b_klass[p]) != k or int(mkt.b_gpus[p]) != g
                            or parts[p][0][2] != s):
                        continue
                    mine, theirs = mkt.bids[u].buyer_id, mkt.bids[p].buyer_id
                    if lim is not None and mine != theirs and used.get((mine, bucket), 0) + g > lim:
                        continue
                    parts[u] = [(o, g, s)]
                    del parts[p]
                    holder[o].remove(p)
                    holder[o].append(u)
                    used[(theirs, bucket)] -= g
                    used[(mine, bucket)] = used.get((mine, bucket), 0) + g
                    changed = True
                    break
                if u in parts:
                    break
    return parts

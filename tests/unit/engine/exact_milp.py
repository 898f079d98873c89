"""An exact lexicographic MILP for a round, written from the engine's documentation alone.

Nothing here imports the engine's solver modules (market.py, assign.py, bound.py,
clear.py): the pairs, their scores and the hard constraints are worked out again from
``RoundInput`` as the docstrings state them, and the whole problem is one model solved by
HiGHS through ``scipy.optimize.milp``, class after class:

* reserved first: maximise the reserved surplus; then, holding the reserved surplus at its
  optimum, the on-demand surplus; then spot. Lower classes are free to use whatever the
  reserved optimum leaves, and a tie in a higher class is broken in their favour (the
  lexicographic optimum, not the greedy "clear a class, then the next" order);
* a pair (bid, offer) is feasible when the offer is available now and passes the bid's
  model or minimum specs and vendor, allowed regions, latency limit from its location
  (a one-way row serves both ways, a region is 0 ms from itself), max price, minimum
  reliability, the offer's duration window and availability, the bid's deadline,
  reserved-only offers for reserved bids only, spot bids on spot-allowed offers only;
* its score (``market.py``): ``round(gpus * hours * value)`` with ``value = (max_price -
  ask) + w.reliability * reliability - w.latency_per_ms * latency - w.non_preferred_region *
  [not preferred] - w.carbon_per_kg * kg CO2 per GPU-hour``, counted in the round's score
  unit (1, or the power of two that keeps the sum of every bid's largest score under
  2**60); only pairs worth more than nothing trade;
* a same-machine bid goes whole onto one offer with room for it; a bid that may span
  machines takes all its GPUs in one bucket (GPU model x region), on offers it values
  above nothing, each part scored as its own pair of ``part`` GPUs (``assign.py``);
* fair share (``RoundConfig``): in a scarce bucket (more GPUs bid for it than offered),
  one buyer takes at most ``ceil(cap * GPUs offered)`` over the whole round. "Bid for it"
  is counted as the engine counts it (``assign.fair_share_limits``): the GPUs of every bid
  with at least one feasible pair that passes the bucket's model, region and latency
  constraints and could be placed on its largest machine (a same-machine bid needs a machine
  of at least the largest power of two not above its GPUs; one that spans machines, any).

``class_optimum`` solves one class on what given trades of the classes above it left: the
optimum the engine's per-class bound claims to bound.
"""

from __future__ import annotations

import math
import re
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_matrix

from market.engine import CLASSES, RoundInput, RoundResult, Trade

SCORE_BUDGET = 2**60


@dataclass(frozen=True)
class _Var:
    kind: str  # "x": a same-machine bid whole on one offer; "y": a spanning bid's bucket; "z": its GPUs on an offer
    bid: int  # index into Problem.bids
    offer: int  # index into Problem.offers (-1 for "y")
    bucket: tuple[str, str]
    upper: int
    per_unit: float  # objective per unit of the variable (score for "x", score per GPU for "z")


@dataclass
class Problem:
    """The round's variables, in the score unit."""

    inp: RoundInput
    unit: int
    bids: list  # type: ignore[type-arg]
    offers: list  # type: ignore[type-arg]
    klass: list[int]
    vars: list[_Var]
    values: dict[tuple[int, int], float]  # (bid, offer) -> value per GPU-hour, for spanning bids' parts
    hours: list[float]
    limits: dict[tuple[str, str], int]  # scarce bucket -> a buyer's most GPUs

    def part_score(self, b: int, o: int, gpus: int) -> int:
        return round(float(gpus) * self.hours[b] * self.values[(b, o)])


@dataclass(frozen=True)
class Solution:
    surplus: tuple[int, int, int]  # per class, base units, of the solution found (exact integer rounding)
    proven: bool  # every solve reached HiGHS's optimality (gap 1e-9); else a time limit stopped one
    dual: tuple[float, float, float]  # per class, an upper bound HiGHS proved (base units)
    exact: tuple[int, ...] = ()  # the classes whose figure is the lexicographic optimum (see ``lexicographic``)


def score_unit(inp: RoundInput) -> int:
    top = sum(b.gpus * (b.max_price + b.weights.reliability) * b.duration_s / 3600 for b in inp.bids)
    return 1 if top <= SCORE_BUDGET else 1 << math.ceil(math.log2(top / SCORE_BUDGET))


def _latency(inp: RoundInput) -> dict[tuple[str, str], float]:
    given = {(a, b): ms for a, b, ms in inp.latency_ms}
    out: dict[tuple[str, str], float] = {}
    ids = [r.id for r in inp.regions]
    for a in ids:
        for b in ids:
            if (a, b) in given:
                out[(a, b)] = given[(a, b)]
            elif (b, a) in given:
                out[(a, b)] = given[(b, a)]
            elif a == b:
                out[(a, b)] = 0.0
    return out


def build(inp: RoundInput) -> Problem:
    """Every feasible pair and placement of the round, with its score."""
    models = {m.id: m for m in inp.gpu_models}
    carbon = {r.id: r.carbon_g_per_kwh for r in inp.regions}
    lat = _latency(inp)
    unit = score_unit(inp)
    now = inp.now
    offers = [o for o in sorted(inp.offers, key=lambda o: o.id) if o.available_from <= now]
    bids = sorted(inp.bids, key=lambda b: b.id)
    o_gpus = np.asarray([o.gpus for o in offers], dtype=np.int64)
    o_ask = np.asarray([o.ask for o in offers], dtype=np.int64)
    o_rel = np.asarray([o.reliability for o in offers], dtype=np.float64)
    o_min = np.asarray([o.min_duration_s for o in offers], dtype=np.int64)
    o_max = np.asarray([o.max_duration_s for o in offers], dtype=np.int64)
    o_until = np.asarray([2**62 if o.available_until is None else o.available_until for o in offers], dtype=np.int64)
    o_spot = np.asarray([o.spot_allowed for o in offers], dtype=np.bool_)
    o_resv = np.asarray([o.reserved_only for o in offers], dtype=np.bool_)
    o_model = [o.gpu_model for o in offers]
    o_region = [o.region for o in offers]
    o_bucket = list(zip(o_model, o_region, strict=True))
    o_carbon = np.asarray([(models[m].tdp_watts / 1000.0) * (carbon[r] / 1000.0) for m, r in o_bucket])
    biggest: dict[tuple[str, str], int] = {}
    supply: dict[tuple[str, str], int] = {}
    for k, g in zip(o_bucket, o_gpus.tolist(), strict=True):
        biggest[k] = max(biggest.get(k, 0), g)
        supply[k] = supply.get(k, 0) + g

    vars_: list[_Var] = []
    values: dict[tuple[int, int], float] = {}
    hours: list[float] = []
    live_buckets: list[tuple[int, set[tuple[str, str]]]] = []  # per live bid: buckets it passes
    for i, b in enumerate(bids):
        h = float(b.duration_s) / 3600.0 / unit
        hours.append(h)
        if not offers:
            continue
        if b.deadline is not None and now + b.duration_s > b.deadline:
            continue
        ok_model = {
            m.id for m in inp.gpu_models
            if (not b.gpu_models or m.id in b.gpu_models) and m.memory_gib >= b.min_memory_gib
            and m.compute_units >= b.min_compute_units and (b.vendor is None or m.vendor == b.vendor)
        }
        ok_region: dict[str, float] = {}  # region -> penalty per GPU-hour
        for r in inp.regions:
            if b.allowed_regions and r.id not in b.allowed_regions:
                continue
            pen = 0.0
            if b.location_region is not None:
                ms = lat.get((b.location_region, r.id))
                if b.max_latency_ms is not None:
                    if ms is None or ms > b.max_latency_ms:
                        continue
                elif ms is None:
                    continue
                pen = b.weights.latency_per_ms * (0.0 if ms is None else ms)
            if b.preferred_regions:
                pen = pen + b.weights.non_preferred_region * (0.0 if r.id in b.preferred_regions else 1.0)
            ok_region[r.id] = pen
        bucket_ok = np.asarray([m in ok_model and r in ok_region for m, r in o_bucket], dtype=np.bool_)
        klass = CLASSES.index(b.klass)
        ok = bucket_ok & (o_ask <= b.max_price) & (o_rel >= b.min_reliability)
        ok &= (o_min <= b.duration_s) & (b.duration_s <= o_max) & (o_until >= now + b.duration_s)
        ok &= ~o_resv | (klass == 0)
        ok &= (klass != 2) | o_spot
        pen_o = np.asarray([ok_region.get(r, 0.0) for r in o_region])
        v = (b.max_price - o_ask).astype(np.float64) + b.weights.reliability * o_rel
        v = v - pen_o
        v = v - b.weights.carbon_per_kg * o_carbon
        full = np.rint(np.clip(float(b.gpus) * h * v, -1.0, float(2**62))).astype(np.int64)
        if b.same_machine:
            pick = np.flatnonzero(ok & (o_gpus >= b.gpus) & (full > 0))
            for o in pick.tolist():
                vars_.append(_Var("x", i, o, o_bucket[o], 1, float(full[o])))
            live = len(pick) > 0
            tier = 1 << (b.gpus.bit_length() - 1)
        else:
            live = bool((ok & (full > 0)).any())
            tier = 1
            parts = np.flatnonzero(ok & (v > 0))
            by_bucket: dict[tuple[str, str], list[int]] = {}
            for o in parts.tolist():
                by_bucket.setdefault(o_bucket[o], []).append(o)
            for k, offs in sorted(by_bucket.items()):
                if sum(int(o_gpus[o]) for o in offs) < b.gpus or not live:
                    continue
                vars_.append(_Var("y", i, -1, k, 1, 0.0))
                for o in offs:
                    values[(i, o)] = float(v[o])
                    vars_.append(_Var("z", i, o, k, min(b.gpus, int(o_gpus[o])), h * float(v[o])))
        if live:
            passes = {k for k in biggest if k[0] in ok_model and k[1] in ok_region and biggest[k] >= tier}
            live_buckets.append((i, passes))

    limits: dict[tuple[str, str], int] = {}
    cap = inp.config.fair_share_cap
    if cap < 1.0:
        demand: dict[tuple[str, str], int] = {}
        for i, ks in live_buckets:
            for k in ks:
                demand[k] = demand.get(k, 0) + bids[i].gpus
        limits = {k: math.ceil(cap * supply[k]) for k, d in demand.items() if d > supply[k]}
    return Problem(inp, unit, bids, offers, [CLASSES.index(b.klass) for b in bids], vars_, values, hours, limits)


def _solve(
    p: Problem, classes: Sequence[int], goal: int, floors: dict[int, float], free: Sequence[int],
    used: dict[tuple[int, str, str], int], time_limit: float, fixed: np.ndarray | None = None,
) -> tuple[np.ndarray | None, bool, float]:
    """Maximise class ``goal``'s surplus over the variables of ``classes``, each class in
    ``floors`` kept at or above its floor (in the score unit), the variables of the
    other classes at their values in ``fixed`` when given. Returns the solution, whether it
    is proven optimal, and HiGHS's dual bound (in the score unit).

    Each class's row and objective are scaled by that class's largest score: one scale
    for all would leave a class of small scores below HiGHS's tolerances."""
    idx = [j for j, v in enumerate(p.vars) if p.klass[v.bid] in classes]
    vs = [p.vars[j] for j in idx]
    n = len(vs)
    if n == 0:
        return np.zeros(len(p.vars)), True, 0.0
    scale = {k: _scale(p, k) for k in classes}
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lo: list[float] = []
    hi: list[float] = []
    r = 0

    def row(entries: Iterable[tuple[int, float]], low: float, high: float) -> None:
        nonlocal r
        for c, a in entries:
            rows.append(r)
            cols.append(c)
            vals.append(a)
        lo.append(low)
        hi.append(high)
        r += 1

    by_bid: dict[int, list[int]] = {}
    by_offer: dict[int, list[tuple[int, float]]] = {}
    link: dict[tuple[int, tuple[str, str]], list[tuple[int, float]]] = {}
    fair: dict[tuple[int, str, str], list[tuple[int, float]]] = {}
    for c, v in enumerate(vs):
        g = p.bids[v.bid].gpus
        buyer = p.bids[v.bid].buyer_id
        if v.kind in ("x", "y"):
            by_bid.setdefault(v.bid, []).append(c)
            if v.bucket in p.limits:
                fair.setdefault((buyer, *v.bucket), []).append((c, float(g)))
        if v.kind == "x":
            by_offer.setdefault(v.offer, []).append((c, float(g)))
        elif v.kind == "z":
            by_offer.setdefault(v.offer, []).append((c, 1.0))
            link.setdefault((v.bid, v.bucket), []).append((c, 1.0))
        else:
            link.setdefault((v.bid, v.bucket), []).append((c, -float(g)))
    for cs in by_bid.values():
        row(((c, 1.0) for c in cs), -np.inf, 1.0)
    for o, es in by_offer.items():
        row(es, -np.inf, float(free[o]))
    for es in link.values():
        row(es, 0.0, 0.0)
    for key, es in fair.items():
        row(es, -np.inf, float(p.limits[(key[1], key[2])] - used.get(key, 0)))
    for k, floor in floors.items():
        es = [(c, v.per_unit / scale[k]) for c, v in enumerate(vs) if p.klass[v.bid] == k]
        floor = floor / scale[k]
        row(es, floor - 1e-9 * max(1.0, abs(floor)), np.inf)
    obj = np.asarray([-(v.per_unit / scale[goal]) if p.klass[v.bid] == goal else 0.0 for v in vs])
    cons = []
    if r:
        a = coo_matrix((vals, (rows, cols)), shape=(r, n)).tocsr()
        cons = [LinearConstraint(a, np.asarray(lo), np.asarray(hi))]
    with warnings.catch_warnings():
        # scipy passes mip_abs_gap on to HiGHS verbatim, with a warning that it does: its
        # default (1e-6 of the scaled objective) would stop short of the optimum
        warnings.filterwarnings("ignore", message="Unrecognized options detected", category=RuntimeWarning)
        lo_b = np.zeros(n)
        if fixed is not None:
            held = np.asarray([p.klass[v.bid] != goal for v in vs])
            lo_b[held] = fixed[idx][held]
        up_b = np.asarray([float(v.upper) for v in vs])
        if fixed is not None:
            up_b[held] = fixed[idx][held]
        res = milp(obj, constraints=cons, integrality=np.ones(n), bounds=Bounds(lo_b, up_b),
                   options={"time_limit": time_limit, "mip_rel_gap": 1e-9, "mip_abs_gap": 0.0, "disp": False})
    if res.x is None:
        return None, False, math.inf
    x = np.zeros(len(p.vars))
    x[idx] = np.round(res.x)
    dual = getattr(res, "mip_dual_bound", None)
    dual_v = -float(dual) if dual is not None and np.isfinite(dual) else -float(res.fun)
    return x, res.status == 0, dual_v * scale[goal]


def _surplus(p: Problem, x: np.ndarray, k: int) -> int:
    total = 0
    for v, xv in zip(p.vars, x.tolist(), strict=True):
        if xv < 0.5 or p.klass[v.bid] != k:
            continue
        if v.kind == "x":
            total += int(v.per_unit)
        elif v.kind == "z":
            total += p.part_score(v.bid, v.offer, int(xv))
    return total * p.unit


def _scale(p: Problem, k: int) -> float:
    """Class ``k``'s largest score of any variable (its scale in a solve)."""
    return max([1.0, *(v.per_unit * v.upper for v in p.vars if p.klass[v.bid] == k)])


def lexicographic(inp: RoundInput, time_limit: float = 60.0, problem: Problem | None = None) -> Solution:
    """The lexicographic optimum: reserved, then on-demand, then spot.

    Each later solve keeps the classes above at their optimum by a floor row. Floating point
    holds that row only to about 1e-7 of the largest score, so each solution is checked in
    integers; where a class above lost surplus (at the limits, scores span 12 digits), the
    class is solved again with the classes above fixed where their own solve left them, and
    is not counted as exact (``Solution.exact``)."""
    p = build(inp) if problem is None else problem
    free = [o.gpus for o in p.offers]
    floors: dict[int, float] = {}
    surplus = [0, 0, 0]
    dual = [0.0, 0.0, 0.0]
    proven = True
    exact: list[int] = []
    present = sorted({p.klass[v.bid] for v in p.vars})
    x_prev: np.ndarray | None = None
    for k in present:
        above = [c for c in present if c < k]
        x, ok, bound = _solve(p, [*above, k], k, floors, free, {}, time_limit)
        if x is not None and all(_surplus(p, x, c) >= surplus[c] for c in above):
            exact.append(k)
        else:
            x, ok, bound = _solve(p, [*above, k], k, {}, free, {}, time_limit, fixed=x_prev)
            if x is None:
                raise RuntimeError(f"the exact MILP found no solution for class {CLASSES[k]}")
        proven &= ok
        dual[k] = bound * p.unit
        surplus[k] = _surplus(p, x, k)
        # the later solves keep this class at what this one reached
        floors[k] = sum(v.per_unit * xv for v, xv in zip(p.vars, x.tolist(), strict=True) if p.klass[v.bid] == k)
        x_prev = x
    return Solution((surplus[0], surplus[1], surplus[2]), proven, (dual[0], dual[1], dual[2]), exact=tuple(exact))


def class_optimum(
    inp: RoundInput, klass: int, above: Sequence[Trade], time_limit: float = 60.0, problem: Problem | None = None,
) -> tuple[int, bool, float]:
    """The best surplus of class ``klass`` alone on what ``above`` (trades of higher classes)
    left, fair-share use included: what that class's reported bound must be at or above.
    Returns (surplus in base units, proven, HiGHS's dual bound in base units)."""
    p = build(inp) if problem is None else problem
    pos = {o.id: j for j, o in enumerate(p.offers)}
    free = [o.gpus for o in p.offers]
    used: dict[tuple[int, str, str], int] = {}
    for t in above:
        free[pos[t.offer_id]] -= t.gpus
        key = (t.buyer_id, t.gpu_model, t.region)
        used[key] = used.get(key, 0) + t.gpus
    x, ok, bound = _solve(p, [klass], klass, {}, free, used, time_limit)
    if x is None:
        raise RuntimeError(f"the exact MILP found no solution for class {CLASSES[klass]}")
    return _surplus(p, x, klass), ok, bound * p.unit


def feasible(p: Problem) -> set[tuple[int, int]]:
    """Every (bid id, offer id) a trade may join: a same-machine pair or a spanning bid's part."""
    out: set[tuple[int, int]] = set()
    for v in p.vars:
        if v.kind in ("x", "z"):
            out.add((p.bids[v.bid].id, p.offers[v.offer].id))
    return out


# --- one round against the engine ----------------------------------------------------------

_CLASS_BOUND = re.compile(r"(reserved|on_demand|spot) ([\d,]+) (?:exact|<= ([\d,]+))")


def reported_bounds(res: RoundResult, engine: Sequence[int]) -> tuple[int | None, ...]:
    """Per class, the upper bound the engine reports (``RoundStats.bound_scope``): its own
    surplus where it says the class is exact, None where it reports none."""
    st = res.stats
    if st.method == "exact":
        return tuple(engine)
    out: list[int | None] = [None, None, None]
    for name, got, ub in _CLASS_BOUND.findall(st.bound_scope):
        k = CLASSES.index(name)
        out[k] = int((ub or got).replace(",", ""))
    return tuple(out)


@dataclass(frozen=True)
class Check:
    """One round cleared by the engine and solved by the exact MILP, in base units."""

    family: str
    seed: int
    n: int
    method: str
    engine: tuple[int, int, int]  # per class: the engine's surplus
    optimum: tuple[int, int, int]  # per class: the lexicographic optimum
    proven: bool  # the MILP proved every class optimal within its time limit
    bounds: tuple[int | None, ...]  # per class: the engine's reported upper bound
    conditional: tuple[int | None, ...]  # per class: the exact optimum on what the engine's classes above left
    infeasible: tuple[tuple[int, int], ...]  # engine trades this model calls infeasible (none, or the model is wrong)
    engine_s: float
    milp_s: float
    unit: int  # the round's score unit (base units)
    exact: tuple[int, ...]  # classes whose optimum is the lexicographic one (``Solution.exact``)

    def ratios(self) -> dict[str, float]:
        """Per class with an optimum above nothing, the engine's share of it (the classes whose
        lexicographic optimum floating point could not hold exactly are left out). Where the
        engine found more for a class than the MILP did (at the limits, where HiGHS's
        tolerances are wider than the smaller scores), the MILP's figures for the classes below
        it are not the lexicographic optimum the engine is held to, and are left out too."""
        out: dict[str, float] = {}
        for k in range(3):
            if k in self.exact and self.optimum[k] > 0:
                out[CLASSES[k]] = self.engine[k] / self.optimum[k]
            if self.engine[k] > self.optimum[k] * (1 + 1e-9) + 64 * self.unit:
                break
        return out

    @property
    def quality(self) -> float:
        return min(self.ratios().values(), default=1.0)

    @property
    def worst(self) -> str:
        r = self.ratios()
        return min(r, key=lambda k: r[k]) if r else "-"

    def bound_short(self) -> list[str]:
        """Classes whose reported bound is below the exact optimum it claims to bound (or
        missing while the class has bids that could trade)."""
        out = []
        for k in range(3):
            opt = self.conditional[k]
            if opt is None or opt <= 0:
                continue
            ub = self.bounds[k]
            # a spanning bid's parts are each rounded to a unit: allow a few units' slack
            if ub is None or ub < opt - 1e-9 * opt - 64 * self.unit:
                out.append(f"{CLASSES[k]} bound {ub} < optimum {opt}")
        return out


def check_round(family: str, seed: int, n: int, inp: RoundInput, time_limit: float = 30.0,
                result: RoundResult | None = None) -> Check:
    """Clear ``inp`` with the engine (or take its ``result``), solve it exactly, and set the two
    side by side."""
    from market.engine import clear_round

    t0 = time.perf_counter()
    res = clear_round(inp) if result is None else result
    t1 = time.perf_counter()
    p = build(inp)
    sol = lexicographic(inp, time_limit=time_limit, problem=p)
    klass = {b.id: CLASSES.index(b.klass) for b in inp.bids}
    engine = [0, 0, 0]
    for t in res.trades:
        engine[klass[t.bid_id]] += t.score
    ok = feasible(p)
    infeasible = tuple((t.bid_id, t.offer_id) for t in res.trades if (t.bid_id, t.offer_id) not in ok)
    bounds = reported_bounds(res, engine)
    conditional: list[int | None] = [None, None, None]
    proven = sol.proven
    for k in range(3):
        if not any(klass[b.id] == k for b in inp.bids):
            continue
        if k == 0:
            conditional[k] = sol.surplus[0]
            continue
        above = [t for t in res.trades if klass[t.bid_id] < k]
        got, exact, _ = class_optimum(inp, k, above, time_limit=time_limit, problem=p)
        conditional[k] = got
        proven &= exact
    t2 = time.perf_counter()
    return Check(family, seed, n, res.stats.method, (engine[0], engine[1], engine[2]), sol.surplus, proven,
                 bounds, tuple(conditional), infeasible, t1 - t0, t2 - t1, p.unit, sol.exact)

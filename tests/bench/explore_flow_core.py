"""Issue 35 exploration, not a benchmark (`make bench` runs bench_*.py only): the class LP
over pair columns as a min-cost flow, with its prices, set against HiGHS's LP.

    pip install ortools   # not a dependency of the project
    python tests/bench/explore_flow_core.py [--n 10000] [--seed 1]

With y = gpus * x (a bid's GPUs on an offer), the class LP over pairs - each bid's fractions
summing to at most 1, each offer's GPUs within its free GPUs and its divisibility rows
(``market.size_tier``) - is a network flow: source -> bid (its GPUs) -> offer (profit
score / gpus per GPU) -> sink. The divisibility rows nest, so each is an arc: an offer gets a
node per row that cuts, on a chain (o, J) -> ... -> (o, 0) -> sink, arc (o, j) -> (o, j-1)
of capacity cut_caps[o, j]; an item of tier j enters at the deepest node at or above its
tier. A pair arc gets capacity gpus + 1 so that it never fills: a filled pair arc carries a
price of its own, which the bound (priced per offer and row) cannot use. Prices: shortest
distances in the optimal flow's residual graph (Bellman-Ford, vectorised), a capacity arc's
price max(0, d[head] - d[tail] - cost).

The script clears one round, catches each class LP's first columns (bound.class_lp), and
prints per class: HiGHS's cold LP over them (bound._lp) against the flow, and the bound at the
flow's prices over the same columns (bound.bound_at, less the multi-machine slack).

What it showed (session of 2026-12-07, this 2-core box):
- The flow is the LP: equal optima (to 1e-11) on 1k and 3k rounds with multi-machine pairs and
  cutting rows, and the bound at its prices equals its optimum; 14-107 Bellman-Ford passes.
- OR-Tools: 0.5-1.1 s for 100k-180k columns at 10k a side (costs kept under 2**30; 2**16
  saves a third and loosens the bound by 1e-4); HiGHS's first cold solve of the same LP took
  about as long. In column generation it is no gain: each round is a solve from scratch, and
  warm HiGHS rounds were quicker (20k a side, on-demand as pairs: 7 rounds 16.8 s against
  12.3 s).
- As the start of the whole-fills LP at 10k (4 rounds of the flow's column generation, then
  HiGHS from each bid's 3 best columns at its prices and fills at its prices): the on-demand
  bound stage went 9.5 -> 7.7 s and the bound 0.1-0.2% tighter, but the fractional rest the
  rounding gets grew (3,016 bids with their tenants against 805), its dive fell short of
  DIVE_ACCEPT and its MILP took 4.5-6.7 s: rounds of seeds 1-3 took 18.6 / 25.1 / 12.6 s
  against 14.0 / 16.6 / 14.3 s (surplus over bound .9940 / .9942 / .9918 against
  .9928 / .9911 / .9937). Not landed.
- At 100k a side, one round of it in place of the Lagrangian bound (on-demand, 1M columns,
  17 s) bounded looser than the subgradient steps: the candidate lists, not the solver, are
  what keep that bound loose.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from market.engine import RoundConfig, bound, clear_round  # noqa: E402
from market.engine import assign as assign_mod  # noqa: E402
from market.engine.market import CUT_TIERS, F64, I64, Market, cut_caps, size_tier  # noqa: E402
from tests.bench.instances import make_round  # noqa: E402

COST_BITS = 30  # the largest cost per GPU, in its rounded unit: costs stay exact to about 1e-9 of it
POTENTIAL_PASSES = 20_000  # Bellman-Ford passes over the residual arcs, at most (a few hundred seen)


@dataclass
class FlowLP:  # noqa: D101
    """The pair LP's optimum over the columns: value, ``x`` per column, and
    per offer and divisibility row the price per GPU (score units)."""

    value: float
    x: F64
    lam: F64
    passes: int  # Bellman-Ford passes the prices took


@dataclass
class _Network:
    tails: I64
    heads: I64
    caps: I64
    costs: I64
    nodes: int
    source: int
    sink: int
    supply: int
    pair0: int  # first pair arc
    chain0: int  # first divisibility arc
    sink0: int  # first offer -> sink arc
    chain_offer: I64  # per divisibility arc: its offer (global index) and row
    chain_row: I64
    offers: I64  # per offer -> sink arc, its offer (global index)
    scale: float  # score units per unit of cost


def _network(mkt: Market, free: I64, pb: I64, po: I64, ps: I64) -> _Network:
    g = mkt.b_gpus[pb].astype(np.int64)
    jp = size_tier(mkt.b_gpus[pb], mkt.b_same[pb])
    bids, bi = np.unique(pb, return_inverse=True)
    offs, oi = np.unique(po, return_inverse=True)
    nb, no = len(bids), len(offs)
    caps = cut_caps(free[offs])
    top = np.zeros(no, dtype=np.int64)
    np.maximum.at(top, oi, jp)
    has = np.zeros((no, CUT_TIERS), dtype=np.bool_)
    has[:, 0] = True
    for j in range(1, CUT_TIERS):  # a row that cuts and that some column counts in
        has[:, j] = (top >= j) & (caps[:, j] < caps[:, 0])
    node = np.full((no, CUT_TIERS), -1, dtype=np.int64)
    k = int(has.sum())
    node[has] = nb + np.arange(k)
    entry = node.copy()  # an item of tier j enters at the deepest row node at or above j
    for j in range(1, CUT_TIERS):
        entry[:, j] = np.where(has[:, j], node[:, j], entry[:, j - 1])
    source, sink = nb + k, nb + k + 1
    supply = mkt.b_gpus[bids].astype(np.int64)
    total = int(supply.sum())
    per_gpu = ps.astype(np.float64) / g
    top_cost = float(per_gpu.max()) if len(per_gpu) else 1.0
    scale = 2.0 ** max(0, math.ceil(math.log2(max(top_cost, 1.0) / 2.0**COST_BITS)))
    co, cj = np.nonzero(has[:, 1:])
    cj = cj + 1
    pair0, chain0 = nb, nb + len(pb)
    sink0 = chain0 + len(co)
    tails = np.concatenate([np.full(nb, source), bi, node[co, cj], node[:, 0], [source]]).astype(np.int64)
    heads = np.concatenate([np.arange(nb), entry[oi, jp], entry[co, cj - 1], np.full(no, sink), [sink]]).astype(np.int64)
    # a pair arc never fills (its bid sends at most g): its price is its rows', as in the LP
    arc_caps = np.concatenate([supply, g + 1, caps[co, cj], caps[:, 0], [total]]).astype(np.int64)
    costs = np.concatenate([
        np.zeros(nb, dtype=np.int64), -np.rint(per_gpu / scale).astype(np.int64),
        np.zeros(len(co) + no + 1, dtype=np.int64),
    ])
    return _Network(tails, heads, arc_caps, costs, nb + k + 2, source, sink, total, pair0, chain0, sink0,
                    offs[co], cj.astype(np.int64), offs, scale)


def pair_lp(mkt: Market, free: I64, cols: tuple[I64, I64, I64]) -> FlowLP | None:
    """The class LP over pair columns ``cols`` on ``free`` by min-cost flow,
    or None without OR-Tools or when it finds no optimum (never seen: the
    source -> sink arc makes every flow feasible)."""
    pb, po, ps = cols
    no_all = len(mkt.offers)
    from ortools.graph.python import min_cost_flow as _mcf

    if len(pb) == 0:
        return FlowLP(0.0, np.zeros(0), np.zeros((no_all, CUT_TIERS)), 0)
    net = _network(mkt, free, pb, po, ps)
    solver = _mcf.SimpleMinCostFlow()
    solver.add_arcs_with_capacity_and_unit_cost(net.tails.astype(np.int32), net.heads.astype(np.int32), net.caps,
                                                net.costs)
    solver.set_node_supply(net.source, net.supply)
    solver.set_node_supply(net.sink, -net.supply)
    if solver.solve() != solver.OPTIMAL:  # pragma: no cover
        return None
    flow = np.asarray(solver.flows(np.arange(len(net.tails), dtype=np.int32)), dtype=np.int64)
    d, passes = _potentials(net, flow)
    g = mkt.b_gpus[pb].astype(np.float64)
    x = flow[net.pair0:net.chain0].astype(np.float64) / g
    lam = np.zeros((no_all, CUT_TIERS), dtype=np.float64)

    def price(first: int, last: int) -> F64:
        a = np.arange(first, last)
        out: F64 = np.maximum(0, d[net.heads[a]] - d[net.tails[a]] - net.costs[a]).astype(np.float64) * net.scale
        return out

    lam[net.offers, 0] = price(net.sink0, net.sink0 + len(net.offers))
    lam[net.chain_offer, net.chain_row] = price(net.chain0, net.sink0)
    return FlowLP(float((x * ps).sum()), x, lam, passes)


def _potentials(net: _Network, flow: I64) -> tuple[I64, int]:
    """Shortest distances in the residual graph of ``flow`` from a root joined
    to every node at cost 0 (integers: costs stay under ``2**COST_BITS``), and the
    passes they took: the optimal flow has
    no negative cycle, so they settle within ``nodes`` passes (a few hundred
    at 10k orders a side). Should they not settle within ``POTENTIAL_PASSES``,
    the last pass's distances stand: prices from them only loosen the bound."""
    fwd = flow < net.caps
    back = flow > 0
    rt = np.concatenate([net.tails[fwd], net.heads[back]])
    rh = np.concatenate([net.heads[fwd], net.tails[back]])
    rc = np.concatenate([net.costs[fwd], -net.costs[back]])
    d = np.zeros(net.nodes, dtype=np.int64)
    for passes in range(1, POTENTIAL_PASSES + 1):
        nd = d.copy()
        np.minimum.at(nd, rh, d[rt] + rc)
        if np.array_equal(nd, d):
            return d, passes
        d = nd
    return d, POTENTIAL_PASSES  # pragma: no cover


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    caught: list[tuple[Any, Any, Any, Any]] = []
    original = bound.class_lp

    def catching(mkt: Any, bids: Any, cols: Any, free: Any, *args: Any, **kwargs: Any) -> Any:
        caught.append((mkt, bids, cols, free.copy()))
        return original(mkt, bids, cols, free, *args, **kwargs)

    assign_mod.class_lp = catching  # type: ignore[assignment]
    try:
        clear_round(make_round(a.n, a.n, seed=a.seed, config=RoundConfig()))
    finally:
        assign_mod.class_lp = original
    for mkt, bids, cols, free in caught:
        t = time.perf_counter()
        got = pair_lp(mkt, free, cols)
        flow_s = time.perf_counter() - t
        t = time.perf_counter()
        want = bound._lp(mkt, *cols, free)
        lp_s = time.perf_counter() - t
        if got is None or want is None:
            print(f"{len(cols[0]):>8,} columns: no optimum")
            continue
        lam = np.floor(got.lam + 1e-9).astype(np.int64)
        ub, _, _ = bound.bound_at(mkt, bids, cols, free, lam, None, None, None)
        slack = int((mkt.b_gpus[bids] + 1)[~mkt.b_same[bids]].sum())
        print(f"{len(cols[0]):>8,} columns: HiGHS {lp_s:6.2f} s (value {want[0]:.10g}) | flow {flow_s:5.2f} s "
              f"(value {got.value:.10g}, {got.passes} passes) | bound at its prices {(ub - slack) / got.value:.9f} of it")
    return 0


if __name__ == "__main__":
    sys.exit(main())

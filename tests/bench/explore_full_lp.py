"""Issue 35 exploration, not a benchmark (`make bench` runs bench_*.py only): how far a round's
surplus is from the LP over *every* feasible pair, class by class, where the engine's own bound
(column generation over pruned lists) may be loose.

    pip install ortools   # not a dependency of the project
    python tests/bench/explore_full_lp.py [--family all_spot] [--n 10000] [--seed 1]

Clears one round of a family of tests/bench/instances.py, then for each class, on the GPUs the
classes above it took (as the engine placed them), solves the pair LP over every feasible pair
of the class by min-cost flow (the network of explore_flow_core.py: multi-machine bids as pairs,
divisibility rows as arcs, costs rounded to ``COST_BITS``). That LP relaxes the class, so the
class's surplus over it is at least its surplus over the class's optimum (up to the cost
rounding); the engine's reported bound is printed beside it, and the bound (``bound.bound_at``)
at the flow's prices: shortest distances in its residual graph (``pair_lp``), which meet the LP.

What it showed (session of 2026-12-07, this 2-core box, seed 1, 10k a side, engine 1.11.0):

| family | pairs | flow | surplus / full LP | surplus / engine's bound |
|---|---|---|---|---|
| all_spot | 8.17M | 14 s | 0.978 | 0.774 |
| all_reserved | 14.3M | 31 s | 0.986 | 0.920 |
| catalogue, on-demand | 1.76M | 5 s | 0.987 | 0.992 |

On all_spot, the flow and its prices took 21 s (221 Bellman-Ford passes), and the bound at those
prices is the LP's value plus 3,755 (the multi-machine bids' rounding slack): a bound 0.978 of
which the round reached, against the 0.774 it reports. So on all_spot and all_reserved the low
ratios of `make bench` are mostly the bound's. Where multi-machine bids weigh more (the catalogue's classes), splitting them as pairs makes this LP
looser than the engine's own bound, whose terms for them are whole fills.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from market.engine import CLASSES, bound, clear_round  # noqa: E402
from market.engine.clear import materialised  # noqa: E402
from market.engine.market import build_market, candidates  # noqa: E402
from tests.bench.explore_flow_core import pair_lp  # noqa: E402
from tests.bench.instances import FAMILIES  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--family", default="all_spot", choices=sorted(FAMILIES))
    ap.add_argument("--n", type=int, default=10_000, help="orders a side")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    inp = materialised(FAMILIES[a.family](a.seed, a.n))
    t = time.perf_counter()
    res = clear_round(inp)
    print(f"{a.family} {a.n:,} a side: engine {time.perf_counter() - t:.1f} s, surplus {res.stats.surplus:,}, "
          f"bound {res.stats.upper_bound or 0:,}")
    reported = {k: int(ub.replace(",", "")) for k, ub in
                re.findall(r"(\w+) [\d,]+ <= ([\d,]+)", res.stats.bound_scope)}
    mkt = build_market(inp)
    unit = mkt.score_unit
    bid_of = {int(i): b for b, i in enumerate(mkt.bids_id.tolist())}
    off_of = {int(i): o for o, i in enumerate(mkt.o_id.tolist())}
    t = time.perf_counter()
    pairs = candidates(mkt, 0, 0)
    print(f"  {len(pairs.pair_bid):,} feasible pairs in {time.perf_counter() - t:.1f} s")
    free = mkt.o_gpus.astype(np.int64).copy()
    for k, name in enumerate(CLASSES):
        trades = [tr for tr in res.trades if mkt.b_klass[bid_of[tr.bid_id]] == k]
        got = sum(tr.score for tr in trades)
        sel = mkt.b_klass[pairs.pair_bid] == k
        pb, po, ps = pairs.pair_bid[sel], pairs.pair_offer[sel], pairs.pair_score[sel]
        need = np.where(mkt.b_same[pb], mkt.b_gpus[pb], 1)
        fit = free[po] >= need
        pb, po, ps = pb[fit], po[fit], ps[fit]
        if len(pb):
            t = time.perf_counter()
            lp = pair_lp(mkt, free, (pb, po, ps))
            if lp is None:  # pragma: no cover - the source -> sink arc keeps it feasible
                print(f"  {name}: no optimum")
                continue
            took = time.perf_counter() - t
            class_bids = np.unique(pb)
            lam = np.floor(lp.lam + 1e-9).astype(np.int64)
            tight, _, _ = bound.bound_at(mkt, class_bids, (pb, po, ps), free, lam, None, None, None)
            ub = reported.get(name)
            print(f"  {name}: {len(pb):,} pairs, flow and prices {took:.1f} s ({lp.passes} passes) | surplus {got:,} | "
                  f"full pair LP {lp.value * unit:,.0f} ({got / (lp.value * unit):.4f} of it), bound at its prices "
                  f"{tight * unit:,} | engine's bound {ub or 0:,}" + (f" ({got / ub:.4f} of it)" if ub else ""))
        for tr in trades:  # the classes below see what this one took
            free[off_of[tr.offer_id]] -= tr.gpus
    return 0


if __name__ == "__main__":
    sys.exit(main())

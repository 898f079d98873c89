"""Issue 35 exploration, not a benchmark (`make bench` runs bench_*.py only): how fast a
min-cost-flow core solves the class LP's single-machine part, set against the LP itself.

    pip install ortools   # not a dependency of the project (yet)
    python tests/bench/explore_flow_core.py [--n 10000] [--seed 1]

With y = gpus * x (a bid's GPUs on an offer), the class LP without its divisibility rows is
a transportation problem: each bid supplies at most its GPUs, each offer takes at most its
free GPUs, the profit per GPU is score / gpus. The script clears one round, catches each
class's LP (bound.class_lp) with the columns it ended with, solves the flow over that
class's single-machine columns with OR-Tools, and prints both times and values. First
figures (10k a side, seed 1, this 2-core box): on-demand LP 9.6 s, flow 0.50 s, the flow's
value 1.009 of what the LP's single-machine pairs carry (a looser relaxation: no cut rows,
and the capacity the multi-machine fills took); reserved 0.57 s against 0.05 s, spot 1.1 s
against 0.06 s.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from market.engine import RoundConfig, bound, clear_round  # noqa: E402
from market.engine import assign as assign_mod  # noqa: E402
from tests.bench.instances import make_round  # noqa: E402


def flow_value(mkt: Any, lp: Any, free: Any) -> tuple[float, float]:
    """(seconds, value) of the min-cost flow over ``lp``'s single-machine columns."""
    from ortools.graph.python import min_cost_flow

    pb, po, ps = lp.pb, lp.po, lp.ps
    g = mkt.b_gpus[pb].astype(np.int64)
    started = time.perf_counter()
    bids, bi = np.unique(pb, return_inverse=True)
    offs, oi = np.unique(po, return_inverse=True)
    nb, no = len(bids), len(offs)
    source, sink = nb + no, nb + no + 1
    supply = mkt.b_gpus[bids].astype(np.int64)
    per_gpu = ps // g
    scale = max(1, int(per_gpu.max()) // (1 << 40))  # costs well inside int64 along any path
    flow = min_cost_flow.SimpleMinCostFlow()
    flow.add_arcs_with_capacity_and_unit_cost(
        np.concatenate([np.full(nb, source), bi, nb + np.arange(no), [source]]).astype(np.int32),
        np.concatenate([np.arange(nb), nb + oi, np.full(no, sink), [sink]]).astype(np.int32),
        np.concatenate([supply, np.minimum(g, free[po]), free[offs], [int(supply.sum())]]).astype(np.int64),
        np.concatenate([np.zeros(nb, dtype=np.int64), -(per_gpu // scale), np.zeros(no, dtype=np.int64), [0]]).astype(np.int64),
    )
    flow.set_node_supply(source, int(supply.sum()))
    flow.set_node_supply(sink, -int(supply.sum()))
    if flow.solve() != flow.OPTIMAL:
        raise RuntimeError("the flow found no optimum")
    return time.perf_counter() - started, float(-flow.optimal_cost() * scale)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    caught: list[tuple[Any, Any, Any, float]] = []
    original = bound.class_lp

    def catching(mkt: Any, bids: Any, cols: Any, free: Any, *args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        out = original(mkt, bids, cols, free, *args, **kwargs)
        caught.append((mkt, out, free.copy(), time.perf_counter() - started))
        return out

    assign_mod.class_lp = catching  # type: ignore[assignment]
    try:
        clear_round(make_round(a.n, a.n, seed=a.seed, config=RoundConfig()))
    finally:
        assign_mod.class_lp = original
    for mkt, lp, free, lp_s in caught:
        if lp is None:
            continue
        flow_s, value = flow_value(mkt, lp, free)
        pairs = float((lp.ps * lp.x).sum())
        print(f"{len(lp.pb):>8,} columns: LP {lp_s:6.2f} s (value {lp.value:.4g}, its single-machine pairs {pairs:.4g}) | "
              f"flow {flow_s:5.2f} s (value {value:.4g}, {value / pairs:.4f} of those pairs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

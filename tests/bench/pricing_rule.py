"""How often the uniform price is uniform (issue 29): per traded bucket, how many
distinct prices its trades pay, how often the clearing interval is empty, and how
often even [lo, hi] is (the per-trade clamp). Run: python -m tests.bench.pricing_rule"""

from __future__ import annotations

import sys
from collections import Counter
from typing import Any

import numpy as np

from market.engine import clear, pricing
from tests.bench.instances import FAMILIES

SIZES = (20, 60, 150, 300)
SEEDS = (0, 1, 2)


def measure(sizes: tuple[int, ...] = SIZES, seeds: tuple[int, ...] = SEEDS) -> dict[str, Counter[str]]:
    original = pricing.bucket_prices
    stats: dict[str, Counter[str]] = {}
    family = ""

    def spy(mkt: Any, assigned: Any, bucket_bids: Any, rule: str, price_point: float = 0.0) -> Any:
        quotes, pay = original(mkt, assigned, bucket_bids, rule, price_point)
        sold = np.zeros(len(mkt.offers), dtype=np.bool_)
        is_assigned = np.zeros(len(mkt.bids), dtype=np.bool_)
        is_assigned[list(assigned)] = True
        per: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for b, parts in assigned.items():
            for o, _, _ in parts:
                sold[o] = True
                per.setdefault((int(mkt.o_model[o]), int(mkt.o_region[o])), []).append((b, o))
        c = stats.setdefault(family, Counter())
        for key, trades in per.items():
            lo = max(int(mkt.o_ask[o]) for _, o in trades)
            hi = min(int(mkt.b_maxp[b]) for b, _ in trades)
            view = mkt.views.get((key[0], key[1], 1))
            wanting = np.asarray(bucket_bids.get(key, []), dtype=np.int64)
            losers = wanting[~is_assigned[wanting]]
            losers = losers[mkt.b_maxp[losers] >= lo]
            ub = pricing._best_servable(mkt, losers, view) if view is not None else -1
            unsold = mkt.o_ask[view][~sold[view]] if view is not None else np.zeros(0, np.int64)
            ua = int(unsold.min()) if len(unsold) else None
            high = hi if ua is None else min(hi, ua - 1)
            c["buckets"] += 1
            c["interval_empty"] += max(lo, ub + 1) > high
            c["lo_gt_hi"] += lo > hi
            c["multi_price"] += len({pay[t] for t in trades}) > 1
            c["trades"] += len(trades)
            c["trades_off_bucket_price"] += sum(pay[t] != quotes[key].price for t in trades)
        return quotes, pay

    clear.bucket_prices = spy  # type: ignore[attr-defined]  # spy on the one call site
    try:
        for name, make in FAMILIES.items():
            family = name
            for n in sizes:
                for seed in seeds:
                    clear.clear_round(make(seed, n))
    finally:
        clear.bucket_prices = original  # type: ignore[attr-defined]
    return stats


def main() -> None:
    stats = measure()
    total: Counter[str] = Counter()
    for name, c in stats.items():
        total.update(c)
        print(f"{name:14} {c['buckets']:5} buckets  multi-price {c['multi_price']:4}  "
              f"interval empty {c['interval_empty']:4}  lo>hi {c['lo_gt_hi']:4}  "
              f"trades off the bucket price {c['trades_off_bucket_price']}/{c['trades']}")
    b = total["buckets"]
    print(f"{'all':14} {b:5} buckets  multi-price {total['multi_price']} ({total['multi_price'] / b:.1%})  "
          f"interval empty {total['interval_empty']} ({total['interval_empty'] / b:.1%})  "
          f"lo>hi {total['lo_gt_hi']} ({total['lo_gt_hi'] / b:.1%})  trades off the bucket price "
          f"{total['trades_off_bucket_price']}/{total['trades']}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()

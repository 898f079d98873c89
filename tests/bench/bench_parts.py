"""Independent sub-markets (issue 39 part 3, market/engine/parts.py): for each instance, how
many parts its round splits into, the round's time with 1 and with N engine workers (the pool
started before it is timed, as it is in a long-running worker), and whether the results are
the same bytes. With --whole, also the round cleared whole (parts switched off), the baseline.

    python tests/bench/bench_parts.py                       # catalogue and narrow_models, 100k a side
    python tests/bench/bench_parts.py --sizes 10000 --whole
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from market.engine import clear as engine_clear  # noqa: E402
from market.engine import clear_round, parts  # noqa: E402
from market.engine.serialize import result_to_dict  # noqa: E402
from market.engine.validate import materialised  # noqa: E402
from tests.bench.instances import FAMILIES  # noqa: E402


def digest(res: object) -> str:
    return hashlib.sha256(json.dumps(result_to_dict(res), sort_keys=True).encode()).hexdigest()[:16]  # type: ignore[arg-type]


def timed(inp: object, workers: int) -> tuple[float, str, object]:
    t = time.perf_counter()
    res = clear_round(inp, workers=workers)  # type: ignore[arg-type]
    return time.perf_counter() - t, digest(res), res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default="catalogue,narrow_models")
    ap.add_argument("--sizes", default="100000", help="orders a side, comma-separated")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--whole", action="store_true", help="also clear each round whole, parts off (slow at 100k)")
    ap.add_argument("--one-part", action="store_true", help="time rounds that do not split too")
    a = ap.parse_args()
    print(f"{os.cpu_count()} CPUs; workers 1 and {a.workers}", flush=True)
    engine_clear._pool(a.workers).submit(int).result()  # the pool's processes started and warm, as in a worker
    same = True
    for n in (int(s) for s in a.sizes.split(",")):
        for family in a.families.split(","):
            t0 = time.perf_counter()
            inp = FAMILIES[family](0, n)
            pieces = parts.split(materialised(inp))
            sizes = ", ".join(f"{len(p.bids):,}x{len(p.offers):,}" for p in pieces)
            print(f"\n{family} {n:,} a side (built in {time.perf_counter() - t0:.1f} s): {len(pieces)} part(s): {sizes}", flush=True)
            if len(pieces) == 1 and not a.one_part:
                print("  one part: it clears whole, as it did before parts, whatever the workers (--one-part times it)", flush=True)
                continue
            t1, d1, r1 = timed(inp, 1)
            print(f"  1 worker:  {t1:7.2f} s  {d1}  surplus {r1.stats.surplus:,}  {r1.stats.trades:,} trades", flush=True)  # type: ignore[attr-defined]
            tn, dn, _ = timed(inp, a.workers)
            print(f"  {a.workers} workers: {tn:7.2f} s  {dn}  ({t1 / tn:.2f}x)  {'same bytes' if dn == d1 else 'DIFFERENT'}", flush=True)
            same &= dn == d1
            if a.whole and len(pieces) > 1:
                saved, parts.SPLIT_PAIRS = parts.SPLIT_PAIRS, 10**18
                try:
                    tw, _, rw = timed(inp, 1)
                finally:
                    parts.SPLIT_PAIRS = saved
                print(f"  whole:     {tw:7.2f} s  surplus {rw.stats.surplus:,}  ({tw / t1:.2f}x the parts' time; parts' surplus "  # type: ignore[attr-defined]
                      f"{(r1.stats.surplus - rw.stats.surplus) / max(1, rw.stats.surplus):+.4%})", flush=True)  # type: ignore[attr-defined]
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())

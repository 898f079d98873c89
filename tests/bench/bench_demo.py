"""The demo market over time: does `gridbid up --demo` keep trading for as long as it runs?

Starts `gridbid up --demo` (embedded: SQLite, in-process worker and beat, its own dev chain,
the demo's simulated agents) in a fresh data folder on free ports, lets it run for MINUTES,
and every --every seconds reads the server's database (`gridbid manage shell`; never the
demo's own counters) to print, for that interval and in total:

- the share of rounds with at least one trade (a failed round counts as one without),
- trades per minute,
- open and expired bids (the book over time).

Counting starts at the first round (the demo buyers bid once the dev chain's deposits land).
Target: at least 80% of rounds trade, all the way through. Exits 1 below it.

    python tests/bench/bench_demo.py 30                     # the 30-minute run
    python tests/bench/bench_demo.py 2 --round-seconds 2    # what tests/e2e/test_demo_lives.py checks
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.e2e import demo_watch  # noqa: E402
from tests.e2e.conftest import start_server, stop_server  # noqa: E402

TARGET = 0.8


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("minutes", type=float, help="how long to run the demo, counted from its first round")
    ap.add_argument("--every", type=float, default=60.0, help="seconds between samples (default 60)")
    ap.add_argument("--round-seconds", type=float, default=5.0, help="ROUND_SECONDS (default 5, as `make run DEMO=1`)")
    ap.add_argument("--speed", type=int, default=60, help="GRIDBID_DEMO_SPEED (default 60)")
    ap.add_argument("--data", type=Path, default=None, help="data folder (default: a new temporary one)")
    ap.add_argument("--json", type=Path, default=None, help="also write the samples here")
    args = ap.parse_args()
    data = args.data or Path(tempfile.mkdtemp(prefix="bench-demo-"))
    data.mkdir(parents=True, exist_ok=True)
    print(f"starting gridbid up --demo in {data} (ROUND_SECONDS={args.round_seconds:g}, GRIDBID_DEMO_SPEED={args.speed})", flush=True)
    proc, base, env = start_server(data, demo=True, speed=args.speed, extra_env={"ROUND_SECONDS": f"{args.round_seconds:g}"})
    samples: list[demo_watch.Sample] = []
    try:
        print(f"serving at {base}; waiting for the first round", flush=True)
        first = demo_watch.sample(env)
        deadline = time.monotonic() + 300
        while not first.rounds:
            if time.monotonic() > deadline:
                print("no round within 5 minutes: the demo buyers never bid", file=sys.stderr)
                return 1
            time.sleep(3)
            first = demo_watch.sample(env)
        start = first.rounds[0][1]
        end = start + args.minutes * 60
        print(f"{'minute':>7} {'rounds':>7} {'traded':>7} {'trades/min':>10} {'open bids':>9} {'expired':>8}   (interval)  | total traded", flush=True)
        last_at = start
        while True:
            now = demo_watch.sample(env).at
            time.sleep(max(0.0, min(last_at + args.every, end) - now))
            s = demo_watch.sample(env)
            samples.append(s)
            upto = min(s.at, end)
            interval = demo_watch.rounds_between(s, last_at, upto)
            made = sum(r[3] for r in interval)
            total = demo_watch.rounds_between(s, start, upto)
            minutes = max(upto - last_at, 1e-9) / 60
            print(f"{(upto - start) / 60:7.1f} {len(interval):7d} {demo_watch.traded_share(interval):7.0%} {made / minutes:10.1f} "
                  f"{s.open_bids:9d} {s.expired_bids:8d}   | {demo_watch.traded_share(total):.1%} of {len(total)}", flush=True)
            last_at = upto
            if upto >= end:
                break
    finally:
        stop_server(proc)
    final = samples[-1]
    rounds = demo_watch.rounds_between(final, start, end)
    share = demo_watch.traded_share(rounds)
    trades = sum(r[3] for r in rounds)
    opens = [s.open_bids for s in samples]
    # a slot whose book was empty writes no round: counted against the demo here, as a slot
    slots = max(len(rounds), int(args.minutes * 60 // args.round_seconds))
    traded = sum(1 for r in rounds if r[3] > 0)
    print(f"\n{args.minutes:g} min: {len(rounds)} rounds, {share:.1%} with trades (target {TARGET:.0%}); "
          f"{traded / slots:.1%} of the {slots} round slots of {args.round_seconds:g} s; "
          f"{trades / args.minutes:.1f} trades/min, open bids min {min(opens)} / max {max(opens)}, {final.expired_bids} bids expired")
    if args.json:
        args.json.write_text(json.dumps({"minutes": args.minutes, "rounds": len(rounds), "traded_share": share, "trades_per_min": trades / args.minutes,
                                         "samples": [{"at": s.at, "open_bids": s.open_bids, "expired_bids": s.expired_bids, "trades": s.trades} for s in samples]}))
    return 0 if share >= TARGET else 1


if __name__ == "__main__":
    sys.exit(main())

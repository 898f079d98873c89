"""Watching a running `gridbid up --demo` from its database: how many of its rounds traded,
and how the book looks over time. Shared by the demo's e2e test and tests/bench/bench_demo.py;
it reads the server's own tables (through `gridbid manage shell`), never the demo's counters."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
import json, time
from datetime import timedelta
from django.db.models import Count
from django.utils import timezone
from market.models import AuctionRound, Bid, Trade
rounds = AuctionRound.objects.annotate(n=Count("trades")).order_by("number").values_list("number", "started_at", "state", "n")
print(json.dumps({
    "now": time.time(),
    "rounds": [[number, started.timestamp(), state, n] for number, started, state, n in rounds],
    "open_bids": Bid.objects.filter(state="open").count(),
    "expired_bids": Bid.objects.filter(state="expired").count(),
    # open 10 s past its expiry: a bid the server failed to expire (rounds run every few seconds)
    "overdue_bids": Bid.objects.filter(state="open", expires_at__lt=timezone.now() - timedelta(seconds=10)).count(),
    "bids": Bid.objects.count(),
    "trades": Trade.objects.count(),
}))
"""


@dataclass(frozen=True)
class Sample:
    at: float  # unix seconds, the server's clock
    rounds: list[tuple[int, float, str, int]]  # (number, started at, state, trades) of every round so far
    open_bids: int
    expired_bids: int
    bids: int
    trades: int
    overdue_bids: int  # open more than 10 s past their expiry


def sample(env: dict[str, str]) -> Sample:
    """One look at the server's database (its environment: the same DATABASE_URL and data dir)."""
    out = subprocess.run([sys.executable, "-m", "gridbid.cli", "manage", "shell", "-c", PROBE], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    if out.returncode != 0:
        raise RuntimeError(f"probe failed: {out.stderr[-2000:]}")
    d = json.loads(out.stdout.strip().splitlines()[-1])
    return Sample(d["now"], [tuple(r) for r in d["rounds"]], d["open_bids"], d["expired_bids"], d["bids"], d["trades"],
                  d["overdue_bids"])


def rounds_between(s: Sample, start: float, end: float) -> list[tuple[int, float, str, int]]:
    return [r for r in s.rounds if start <= r[1] < end]


def traded_share(rounds: list[tuple[int, float, str, int]]) -> float:
    """The share of rounds that made at least one trade (a failed round made none)."""
    return sum(1 for r in rounds if r[3] > 0) / len(rounds) if rounds else 0.0

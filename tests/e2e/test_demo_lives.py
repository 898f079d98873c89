"""`gridbid up --demo` keeps trading: over a minute of the real demo (its own worker,
beat, dev chain and simulated agents, at the default GRIDBID_DEMO_SPEED), at least 80% of
its rounds make a trade, no unmatched bid outlives its expiry, and it never runs out of bids. Counted
from the server's database, not from the demo's own counters."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.conftest import service_missing
from tests.e2e import demo_watch
from tests.e2e.conftest import running_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]

WINDOW_S = 60.0  # 30 rounds at ROUND_SECONDS=2, past the 30 s bid lifetime: long runs are bench_demo.py's


def test_the_demo_trades_in_at_least_80_percent_of_its_rounds_for_a_minute(tmp_path: Path) -> None:
    from ledger.chain.anvil import AnvilNotFound, find_anvil

    try:
        find_anvil()
    except AnvilNotFound as exc:
        service_missing(f"anvil is not installed ({exc})")
    with running_server(tmp_path, demo=True, speed=60) as (_base, env):
        # the first round comes once the dev chain's deposits have landed and the buyers bid
        deadline = time.monotonic() + 120
        seen = demo_watch.sample(env)
        while not seen.rounds:
            assert time.monotonic() < deadline, "no round within 2 minutes of start-up: the demo buyers never bid"
            time.sleep(3)
            seen = demo_watch.sample(env)
        start = seen.rounds[0][1]
        time.sleep(max(0.0, start + WINDOW_S + 3 - seen.at))
        end = demo_watch.sample(env)
    rounds = demo_watch.rounds_between(end, start, start + WINDOW_S)
    share = demo_watch.traded_share(rounds)
    idle = [r[0] for r in rounds if r[3] == 0]
    assert len(rounds) >= WINDOW_S / 2 / 2, f"only {len(rounds)} rounds in {WINDOW_S:g} s at ROUND_SECONDS=2: the book ran dry"
    assert share >= 0.8, f"{share:.0%} of {len(rounds)} rounds traded; rounds without a trade: {idle}"
    # unmatched bids expire: none is left open past its expiry (how many expire depends on how
    # liquid the demo was that minute: a run where every bid traded within its 30 s expired none)
    assert end.overdue_bids == 0, f"{end.overdue_bids} open bids are over 10 s past their expiry"
    assert end.open_bids < 40, f"{end.open_bids} open bids: the book only grows"

"""A deferrable bid in a real Chromium (issue 37): placed from the bid form with a wait for
cleaner power, it waits with its reason on the orders page, then matches in the cleaner hour.

The server is a demo market whose carbon feed is a live feed on 127.0.0.1 (this test's stub)
and whose feed clock runs 900 times faster than the wall clock (GRIDBID_CARBON_CLOCK_SPEED):
a grid hour passes in 4 s. us-west's grid is dirty for 3 hours and clean for the next 3, over
and over (a forecast the feed gives, as a live feed does); its A100-PCIe offers are the only
ones the bid can take."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import service_missing
from tests.e2e.conftest import running_server
from tests.e2e.funds import TOKENS, funded_buyer
from tests.unit.test_carbon import Stub

pytestmark = [pytest.mark.browser]

ROOT = Path(__file__).resolve().parents[2]
SHOTS = Path(os.environ.get("GRIDBID_TEST_OUTPUT", ROOT / "test-output")) / "screenshots"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DIRTY, CLEAN = 900.0, 60.0
SPEED = 900  # a grid hour in 4 s


def clean(hour: int) -> bool:
    """Whether the feed's hour (unix s // 3600) is one of us-west's clean ones."""
    return hour % 6 >= 3


class Feed(Stub):
    """us-west DIRTY or CLEAN by the hour (``clean``); no other region (their constants).
    ``latest`` is the latest start the server asked for: its feed clock."""

    def __init__(self) -> None:
        super().__init__()
        self.latest = 0
        self.answer = self.hourly

    def hourly(self, region: str, start: int, hours: int) -> tuple[int, dict[str, Any]]:
        self.latest = max(self.latest, start)
        first = start - start % 3600
        if region != "us-west":
            return 404, {"error": "no series"}
        return 200, {"region": region, "start": first, "g_co2_per_kwh": [CLEAN if clean(first // 3600 + k) else DIRTY for k in range(hours)]}


@pytest.fixture
def page() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        service_missing("Chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        pg = browser.new_page(viewport={"width": 1280, "height": 900})
        pg.set_default_timeout(20_000)
        yield pg
        browser.close()


def explanation_of(data: Path, bid_id: int) -> dict[str, Any]:
    with contextlib.closing(sqlite3.connect(f"file:{data / 'gridbid.sqlite3'}?mode=ro", uri=True, timeout=10)) as db:
        return dict(json.loads(db.execute("select explanation from market_bid where id = ?", (bid_id,)).fetchone()[0]))


def rounds_of(data: Path, bid_id: int) -> tuple[str, int | None, list[float] | None]:
    """From the server's database: the bid's state, the round that matched it, and us-west's
    hourly intensity from the hour of that round, as its stored inputs hold it."""
    with contextlib.closing(sqlite3.connect(f"file:{data / 'gridbid.sqlite3'}?mode=ro", uri=True, timeout=10)) as db:
        state = db.execute("select state from market_bid where id = ?", (bid_id,)).fetchone()[0]
        row = db.execute("select r.number, r.inputs from market_trade t join market_auctionround r on r.id = t.round_id where t.bid_id = ?", (bid_id,)).fetchone()
    if row is None:
        return state, None, None
    regions = json.loads(row[1])["regions"]
    return state, row[0], next(r["carbon_hourly"] for r in regions if r["id"] == "us-west")


def test_a_deferrable_bid_waits_for_a_cleaner_hour_with_its_reason_then_matches_in_it(page: Any, tmp_path: Path) -> None:
    feed = Feed()
    try:
        with running_server(tmp_path, demo=True, speed=1800,
                            extra_env={"CARBON_FEED": feed.url, "GRIDBID_CARBON_CLOCK_SPEED": str(SPEED)}) as (base, env):
            funded_buyer(base, env, "green", amount=60 * TOKENS)
            page.goto(base + "/login/")
            page.fill("#id_username", "green")
            page.fill("#id_password", "correct-horse-battery-staple")
            page.click("main button:has-text('Log in')")
            page.wait_for_selector("text=green")
            page.goto(base + "/bids/new/")
            page.select_option("#id_gpu_model", "A100-PCIe-80GB")
            page.fill("#id_gpus", "2")
            page.fill("#id_max_price_usd", "2.50")
            page.fill("#id_hours", "2")
            page.fill("#id_wait_hours", "6")
            page.wait_for_selector("#quote.ok")
            # place it in the first dirty hour of a cycle: the clean ones are 2-3 hours (8-12 s) ahead
            deadline = time.monotonic() + 90
            while (not feed.latest or feed.latest // 3600 % 6 != 0) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert feed.latest // 3600 % 6 == 0, "the server's feed clock never reached a dirty hour"
            page.fill("#id_wait_hours", "5.5")  # a fresh quote, in the dirty hour: it says the bid would wait
            page.fill("#id_wait_hours", "6")
            page.wait_for_selector("#quote.ok")
            assert page.inner_text("#quote-carbon").startswith("Cleaner power: it would be waiting for a cleaner hour: 60 g/kWh expected at")
            page.click("#place")
            page.wait_for_url("**/orders/")
            bid_id = int(page.get_attribute("tr[data-order]", "data-order") or 0)
            why = page.locator(f"tr[data-order='{bid_id}'] [data-field=why]")
            began = time.monotonic()
            while "waiting for a cleaner hour" not in why.inner_text() and time.monotonic() - began < 15:
                page.wait_for_timeout(500)
                page.reload()
            text = why.inner_text()
            assert re.search(r"waiting for a cleaner hour: 60 g/kWh expected at \d\d:\d\d UTC in us-west vs \d+ now; [0-9.]+ kg CO2 less", text), text
            # the page says what the database holds: read together, since each round (every 2 s,
            # the feed's clock at 30 min a second) rewrites the reason with the hour's intensity
            began = time.monotonic()
            shown = explanation_of(Path(env["GRIDBID_DATA_DIR"]), bid_id)
            while shown["reasons"][0] not in text and time.monotonic() - began < 30:
                page.reload()
                text = why.inner_text()
                shown = explanation_of(Path(env["GRIDBID_DATA_DIR"]), bid_id)
            assert shown["deferred"] and shown["reasons"][0] in text, (shown, text)
            assert shown["carbon"]["now_g_per_kwh"] > CLEAN and shown["carbon"]["expected_g_per_kwh"] == CLEAN
            SHOTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(SHOTS / "bid-waiting-for-cleaner-hour.png"), full_page=True)
            page.wait_for_selector(f"tr[data-order='{bid_id}'] .pill.state-matched", timeout=90_000)
            page.screenshot(path=str(SHOTS / "bid-matched-in-cleaner-hour.png"), full_page=True)
            state, number, hourly = rounds_of(Path(env["GRIDBID_DATA_DIR"]), bid_id)
            assert state == "matched" and number is not None and hourly is not None
            # it bids in the clean hours, or in the last minutes before them once the dirty part
            # left of its run is no longer worth a cent of carbon (carbon.defer): never with a
            # dirty hour still ahead of it
            assert hourly[0] == CLEAN or hourly[1] == CLEAN, f"round {number} matched it with us-west at {hourly[:3]}: not at the clean hours"
    finally:
        feed.server.shutdown()
        feed.server.server_close()

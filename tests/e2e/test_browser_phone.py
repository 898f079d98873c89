"""The pages a buyer opens on a phone, at 390 px wide in a real Chromium against the real
demo server: nothing scrolls sideways, the header folds behind a menu button, and an
order's state and payment are on screen without scrolling sideways."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import wait_for_js
from tests.e2e.funds import TOKENS, funded_buyer
from tests.e2e.test_browser import browser, reload_until, shot  # noqa: F401  (browser: the shared Chromium fixture)

PHONE = {"width": 390, "height": 844}
PASSWORD = "correct-horse-battery-staple"  # tests/e2e/funds.py make_tokens


@pytest.fixture
def phone(browser: Any) -> Iterator[Any]:  # noqa: F811
    context = browser.new_context(viewport=PHONE, device_scale_factor=2, is_mobile=True, has_touch=True, timezone_id="Europe/Paris")
    pg = context.new_page()
    pg.set_default_timeout(20_000)
    blocked: list[str] = []
    pg.on("console", lambda m: blocked.append(m.text) if "Content Security Policy" in m.text else None)
    yield pg
    context.close()
    assert not blocked, "the CSP blocked:\n" + "\n".join(blocked)


def no_sideways_scroll(page: Any) -> None:
    width = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
    assert width[0] <= width[1], f"{page.url} scrolls sideways at {PHONE['width']} px: {width[0]} px wide"


def on_screen(page: Any, selector: str) -> dict[str, float]:
    """The element's box, asserted to lie inside the phone's width (no sideways scrolling)."""
    el = page.locator(selector).first
    el.wait_for(state="visible")
    box = el.bounding_box()
    assert box is not None, selector
    assert box["x"] >= 0 and box["x"] + box["width"] <= PHONE["width"] + 0.5, f"{selector} is off screen: {box}"
    return box


def test_a_buyer_on_a_phone_sees_each_orders_state_and_payment_without_scrolling_sideways(phone, embedded):
    base, env = embedded
    name = f"phone{uuid.uuid4().hex[:8]}"
    auth = funded_buyer(base, env, name, 50 * TOKENS)
    r = httpx.post(f"{base}/api/v1/bids/", headers=auth, timeout=30, json={
        "job_spec": {"image": "ghcr.io/acme/train:1", "command": ["python", "train.py"]}, "gpus": 1,
        "gpu_models": ["A100-SXM-80GB"], "max_price": 9_000_000, "duration_s": 3600, "client_order_id": "phone-order"})
    assert r.status_code == 201, r.text

    page = phone
    page.goto(base + "/login/")
    page.fill("#id_username", name)
    page.fill("#id_password", PASSWORD)
    page.click("main button")
    page.wait_for_url(base + "/")

    # the header folds behind one button, which opens it
    assert page.is_visible("#menu-toggle") and not page.is_visible("#main-nav")
    page.click("#menu-toggle")
    page.wait_for_selector("#main-nav a[href='/orders/']", state="visible")
    no_sideways_scroll(page)
    page.click("#main-nav a[href='/orders/']")
    page.wait_for_url("**/orders/")

    reload_until(page, "main", "payment", timeout_s=60)  # matched: its trade and payment are listed
    no_sideways_scroll(page)
    state = on_screen(page, "tr[data-order] td[data-label=State] .pill")
    payment = on_screen(page, "tr[data-order] [data-trade-state]")
    assert page.inner_text("tr[data-order] td[data-label=State] .pill") in ("matched", "open")
    assert page.inner_text("tr[data-order] [data-trade-state]") in ("pending", "recorded", "settled", "disputed", "refunded")
    assert "USDC/GPU-h" in page.inner_text("tr[data-order]")
    assert state["y"] >= 0 and payment["y"] >= 0
    shot(page, "phone-orders")

    # the payment page (long transaction hashes), the bid form and the wallet fit too
    page.click("tr[data-order] a.payment")
    page.wait_for_url("**/trades/*/")
    no_sideways_scroll(page)
    page.goto(base + "/bids/new/")
    no_sideways_scroll(page)
    page.goto(base + "/wallet/")
    no_sideways_scroll(page)
    # moments read in the reader's own zone, one format everywhere (the server writes UTC)
    page.goto(base + "/rounds/")
    wait_for_js(page, "document.querySelector('time.ts[data-local]')")
    stamp = page.inner_text("time.ts >> nth=0")
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d (CET|GMT\+1)", stamp), stamp
    no_sideways_scroll(page)

    # market detail and offers: cards, no sideways scroll either
    page.goto(base + "/markets/A100-SXM-80GB/us-east/")
    page.wait_for_selector("#depth")
    no_sideways_scroll(page)
    on_screen(page, "#market-offers tr td[data-label=Price]")
    shot(page, "phone-market")
    page.goto(base + "/offers/?max_price=9.00")
    page.wait_for_selector("#offers")
    no_sideways_scroll(page)
    on_screen(page, "#offers tr td[data-label=Price]")
    assert "USDC/CU-h" in page.inner_text("#offers")
    shot(page, "phone-offers")


def test_the_offers_filter_on_a_phone_says_what_it_cannot_read(phone, embedded_server):
    page = phone
    page.goto(embedded_server + "/offers/")
    page.fill("input[name=max_price]", "abc")
    page.click("form.filters button")
    page.wait_for_selector("#filter-errors")
    assert "type it like 2.50" in page.inner_text("#filter-errors")
    no_sideways_scroll(page)
    page.fill("input[name=max_price]", "2.50")
    page.click("form.filters button")
    page.wait_for_selector("#offers")
    wait_for_js(page, "!document.getElementById('filter-errors')")
    prices = page.locator("#offers td[data-label=Price]").all_inner_texts()
    assert prices and all(float(p.split()[0].replace(",", "")) <= 2.50 for p in prices), prices

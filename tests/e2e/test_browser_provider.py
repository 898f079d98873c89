"""The provider dashboard and the operator page in a real browser against the real demo
server, with a real `gridbid-agent` daemon sending heartbeats: the machine comes online
and its GPUs' utilisation moves on the page without a reload."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import test_browser as ui
from tests.e2e.conftest import wait_for_js
from tests.e2e.test_agent_e2e import agent, agent_env

browser, page, shot = ui.browser, ui.page, ui.shot  # the buyer's tour's Chromium fixtures and screenshots

ROOT = Path(__file__).resolve().parents[2]
DEMO_PASSWORD = "gridbid-demo-password"


def sign_up_provider(page: Any, base: str, name: str) -> None:
    page.goto(base + "/signup/")
    page.fill("#id_username", name)
    page.fill("#id_password", "a-long-browser-password-1")
    page.check("input[value=provider]")
    page.click("text=Create account")
    page.wait_for_selector(f"text={name}")


def agent_token(page: Any, base: str) -> str:
    """A token for the agent, made the way a person makes one: on the account page."""
    page.goto(base + "/account/")
    page.fill("#id_name", "rack agent")
    page.uncheck("input[name=scopes][value=trade]")
    page.check("input[name=scopes][value=provide]")
    page.click("text=Create token")
    return page.text_content("#new-token").strip()


def log_in(page: Any, base: str, username: str, password: str) -> None:
    page.goto(base + "/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("main button:has-text('Log in')")
    page.wait_for_selector(f"text={username}")


@pytest.fixture
def registered_agent(page: Any, embedded: tuple[str, dict[str, str]], tmp_path: Path) -> Iterator[tuple[Path, int, str]]:
    """A new provider (signed up in the browser) whose agent has registered a 2 x H100 machine
    and priced it far above the demo's bids, so it stays idle; yields (agent home, machine id, name)."""
    import uuid

    base, _ = embedded
    name = f"rack{uuid.uuid4().hex[:6]}"
    sign_up_provider(page, base, name)
    token = agent_token(page, base)
    inventory = tmp_path / "inventory.json"
    simulate = {"idle_utilisation": 37.0, "idle_temperature_c": 31.0}
    inventory.write_text(json.dumps({"host": name, "gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "simulate": simulate} for i in range(2)]}))
    home = tmp_path / "agent"
    r = agent(home, "init", "--market", base, "--token", token, "--machine-name", name, "--region", "eu-west", "--inventory", str(inventory), "--kdf-iterations", "2", "--runtime", "process")
    assert r.returncode == 0, r.stderr + r.stdout
    # the machine only: staking on the dev chain is the buyer's-tour tests' business
    r = subprocess.run([sys.executable, "-m", "providers.agent", "register"], cwd=ROOT, env={**agent_env(home), "GRIDBID_AGENT_CHAIN": "false"}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr + r.stdout
    machine_id = int(r.stdout.split("as #")[1].split()[0])
    r = agent(home, "price", "set", "H100-SXM-80GB", "--fixed", "90.00")
    assert r.returncode == 0, r.stderr + r.stdout
    yield home, machine_id, name


def test_a_provider_watches_its_live_agent_come_online_and_report_utilisation(page, embedded, registered_agent):
    base, _ = embedded
    home, machine_id, name = registered_agent
    row = f"tr[data-machine='{machine_id}']"

    page.goto(base + "/provider/")
    page.wait_for_selector("#live-status[data-ok='1']")
    assert page.inner_text(f"{row} [data-field=state]") == "offline"
    assert "no telemetry yet" in page.inner_text(f"{row} [data-field=telemetry]")
    assert "No sales yet" in page.inner_text("#earnings-chart")
    shot(page, "provider-before-agent")
    page.evaluate("window.__stillHere = true")

    log = open(home / "daemon.log", "w")  # noqa: SIM115 - closed below
    daemon = subprocess.Popen([sys.executable, "-m", "providers.agent", "run", "--poll-seconds", "0.5", "--heartbeat-seconds", "1", "--max-seconds", "90"],
                              cwd=ROOT, env=agent_env(home), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            page.wait_for_selector(f"{row} .pill.state-online", timeout=30_000)
        except Exception:
            log.flush()
            raise AssertionError("the machine never showed online:\n" + (home / "daemon.log").read_text()[-3000:]) from None
        wait_for_js(page, f"document.querySelectorAll(\"{row} [data-field=telemetry] .gpu\").length === 2")
        assert "37%" in page.inner_text(f"{row} [data-field=telemetry]")
        assert page.inner_text("[data-kpi=online]") == "1 / 1"

        first = page.get_attribute(f"{row} [data-field=heartbeat]", "data-at")
        wait_for_js(page, f"document.querySelector(\"{row} [data-field=heartbeat]\").dataset.at !== {json.dumps(first)}")
        assert page.inner_text(f"{row} [data-field=heartbeat]").endswith("ago") or page.inner_text(f"{row} [data-field=heartbeat]") == "just now"
        page.wait_for_selector("#util-chart.has-plot canvas")  # uPlot drew the heartbeats
        wait_for_js(page, "document.querySelector('#util-chart .u-legend').textContent.includes(" + json.dumps(name) + ")")
        assert page.evaluate("window.__stillHere === true"), "the page reloaded instead of updating live"
        shot(page, "provider-live")

        page.set_viewport_size({"width": 390, "height": 844})
        page.wait_for_timeout(300)
        assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth + 1") or page.locator(".table-wrap").count() > 0
        shot(page, "provider-live-mobile")
    finally:
        daemon.terminate()
        try:
            daemon.wait(timeout=15)
        except subprocess.TimeoutExpired:
            daemon.kill()
        log.close()


def test_the_demo_provider_sees_its_sales_and_earnings_chart(page, embedded_server):
    log_in(page, embedded_server, "lambda-labs-east", DEMO_PASSWORD)
    page.goto(embedded_server + "/provider/")
    page.wait_for_selector("#live-status[data-ok='1']")
    page.wait_for_selector("tr[data-machine]")
    page.evaluate("window.__stillHere = true")
    page.wait_for_selector("tr[data-sale]", timeout=60_000)  # the demo's buyers keep bidding
    page.wait_for_selector("#earnings-chart.has-plot canvas", timeout=60_000)
    assert page.inner_text("[data-kpi=sold]") != "0.00 USDC"
    assert page.evaluate("window.__stillHere === true")
    shot(page, "provider-demo")


def test_the_operator_sees_a_new_round_appear_live(page, embedded_server):
    log_in(page, embedded_server, "operator", DEMO_PASSWORD)
    page.goto(embedded_server + "/operator/")
    page.wait_for_selector("#live-status[data-ok='1']")
    page.evaluate("window.__stillHere = true")
    newest = page.evaluate("Number((document.querySelector('#op-rounds tr[data-round]') || {dataset: {round: 0}}).dataset.round)")
    wait_for_js(page, f"Number((document.querySelector('#op-rounds tr[data-round]') || {{dataset: {{round: 0}}}}).dataset.round) > {newest}", timeout_ms=60_000)
    assert page.evaluate("window.__stillHere === true"), "the page reloaded instead of updating live"
    assert "Settlement queue" in page.inner_text("main") and page.locator("tbody[data-list=trade_states] .pill").count() >= 1
    shot(page, "operator-live")


def test_market_detail_charts_the_clearing_price_and_works_without_javascript(browser, embedded_server):
    ctx = browser.new_context(viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    pg.set_default_timeout(20_000)
    market = None
    for _ in range(60):  # a market where a round has cleared (the demo's buyers keep bidding)
        pg.goto(embedded_server + "/")
        market = pg.evaluate("(() => { const r = [...document.querySelectorAll('tr[data-bucket]')].find((r) => r.querySelector('[data-field=last]').textContent.trim() !== '—'); return r && r.querySelector('a').getAttribute('href'); })()")
        if market:
            break
        pg.wait_for_timeout(1000)
    assert market, "no market has cleared a round"
    pg.goto(embedded_server + market)
    pg.wait_for_selector("#live-status[data-ok='1']")
    pg.wait_for_selector("#price-chart.has-plot canvas", timeout=60_000)
    shot(pg, "market-detail-chart")
    ctx.close()

    off = browser.new_context(viewport={"width": 1280, "height": 900}, java_script_enabled=False)
    pg = off.new_page()
    pg.goto(embedded_server + market)
    assert pg.inner_text("[data-kpi=last_price]").strip() not in ("", "—")
    assert pg.locator("#price-chart .chart-fallback svg").count() == 1  # the server's sparkline
    off.close()

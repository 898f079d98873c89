"""The whole life of a rental, as its people live it: a buyer in Chromium, two providers'
real `gridbid-agent` daemons staked on the server's dev chain, one real `gridbid up`.

The buyer's unfunded bid is refused with the shortfall; it gets test tokens, deposits them;
an SSH job waits unmatched (the agents run jobs as processes and say so), with the reason on
My orders, and is cancelled; the buyer bids again; a round matches it to the cheaper provider, whose agent runs it once the
trade is recorded on chain. The buyer extends the booking at the offer's ask, then stops
the job early. The provider's GPUs come back to the market, both trades settle on chain
against the agent's signed receipts, and what the provider is shown as paid is what the
chain pays it when it withdraws.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e import test_browser as ui
from tests.e2e.conftest import running_server, wait_for_js
from tests.e2e.funds import TOKENS, chain_rpc, fund, make_tokens, token_balance, wait_for
from tests.e2e.test_agent_e2e import agent, flat, join_market, start_daemon, stop_daemons
from tests.receiver import verify, wait_for_events

browser, page, shot = ui.browser, ui.page, ui.shot  # the buyer's tour's Chromium fixtures and screenshots
pytestmark = [pytest.mark.slow, pytest.mark.timeout(420)]
PASSWORD = "correct-horse-battery-staple"  # what tests.e2e.funds.make_tokens gives its accounts
A10 = ("NVIDIA A10", 23028, "A10-24GB")
# writes its output, then works until its agent stops it; typed into the bid form's command
JOB = f"{sys.executable} -c \"import os, time; print('training: epoch 1', flush=True); open(os.environ['GRIDBID_OUTPUT_DIR'] + '/result.txt', 'w').write('42'); [time.sleep(0.5) for _ in range(1200)]\""


@pytest.fixture(scope="module")
def market(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    # the buyer's webhook receiver listens on 127.0.0.1: a private address, allowed here only
    with running_server(tmp_path_factory.mktemp("rental"), demo=False, extra_env={"WEBHOOK_ALLOW_PRIVATE_URLS": "true"}) as (base, env):
        yield base, env



def log_in(page: Any, base: str, username: str) -> None:
    page.goto(base + "/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("main button:has-text('Log in')")
    page.wait_for_selector(f"text={username}")


def ssh_public_key(tmp_path: Path) -> str:
    path = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "renter@laptop", "-f", str(path)], check=True, timeout=60)
    return Path(f"{path}.pub").read_text().strip()


def place_bid(page: Any, base: str, *, image: str = "", ssh: bool = False) -> None:
    page.goto(base + "/bids/new/")
    page.select_option("#id_gpu_model", A10[2])
    page.fill("#id_gpus", "1")
    page.fill("#id_max_price_usd", "3.00")
    page.fill("#id_hours", "0.1")
    page.fill("#id_image", image)
    page.fill("#id_command", JOB)
    if ssh:
        page.check("#id_ssh")
    page.click("#place")


def test_a_rental_from_refused_bid_to_stop_early_settles_on_chain_and_frees_the_gpus(market, page, receiver, tmp_path):
    base, env = market
    rpc, chain = chain_rpc(base)
    buyer = f"renter{uuid.uuid4().hex[:6]}"
    tokens = make_tokens(env, cheap=("provider", ("read", "provide")), dear=("provider", ("read", "provide")), **{buyer: ("buyer", ("read", "trade"))})

    def stake(home: Path) -> None:
        fund(rpc, chain, json.loads((home / "keys" / "eth-keystore.json").read_text())["address"], 150 * TOKENS)

    # the cheaper machine has the newer driver and room on disk; the dearer one neither
    cheap, cheap_machine = join_market(base, tmp_path, "cheap", tokens["cheap"], region="eu-west", price="1.20", gpu=A10, states="recorded", chain=True, fund=stake,
                                       cuda="12.4", machine={"disk_gb": 500, "ram_gib": 128})
    dear, _ = join_market(base, tmp_path, "dear", tokens["dear"], region="us-east", price="2.40", gpu=A10, states="recorded", chain=True, fund=stake,
                          cuda="11.8", machine={"disk_gb": 60, "ram_gib": 64})
    # bandwidth to the market, measured over the wire and sent with each heartbeat
    r = agent(cheap, "benchmark", "--seconds", "0.1", "--net-mib", "1")
    assert r.returncode == 0 and "Bandwidth to the market" in r.stdout and "Saved the bandwidth" in flat(r.stdout), r.stderr + r.stdout
    provider = {"Authorization": f"Bearer {tokens['cheap']}"}
    auth = {"Authorization": f"Bearer {tokens[buyer]}"}
    address = httpx.get(f"{base}/api/v1/providers/me/", headers=provider).json()["chain_address"]
    daemons = [start_daemon(home, seconds=400) for home in (cheap, dear)]
    server_log = Path(env["GRIDBID_DATA_DIR"]) / "server.log"
    logs = lambda: "\n".join((h / "daemon.log").read_text()[-3000:] for h in (cheap, dear)) + "\n" + server_log.read_text()[-3000:]  # noqa: E731
    try:
        # 0. the buyer wants to be told: a webhook, added on the account page (its secret shown once)
        log_in(page, base, buyer)
        page.goto(base + "/account/")
        page.fill("#webhooks input[name=url]", receiver.url)
        for event in ("bid.matched", "job.running", "job.stopped"):
            page.check(f"#webhooks input[name=events][value='{event}']")
        page.click("#webhooks button:has-text('Add webhook')")
        secret = page.inner_text("#new-webhook-secret").strip()

        # 1. no escrow: the bid is refused, with what is missing and where to deposit it
        place_bid(page, base)
        refusal = page.inner_text("div.error[role=alert]")
        assert "escrow has 0.00 USDC free" in refusal and "Deposit at least 0.30 USDC" in refusal, refusal
        assert httpx.get(f"{base}/api/v1/bids/", headers=auth).json()["results"] == [], "a refused bid places nothing"

        # 2. test tokens from the dev chain's faucet, deposited into escrow from the Wallet page
        page.goto(base + "/wallet/")
        page.click("#faucet")
        page.wait_for_selector("text=1,000 test USDC are on their way")
        wait_for("the faucet's tokens", lambda: token_balance(rpc, chain, httpx.get(f"{base}/api/v1/ledger/escrow/", headers=auth).json()["address"]) > 0, seconds=60)
        page.fill("#deposit-form input[name=amount]", "5")  # USDC, as people type it
        page.click("#deposit-form button")
        wait_for("the deposit in escrow", lambda: httpx.get(f"{base}/api/v1/ledger/escrow/", headers=auth).json()["free"] == 5 * TOKENS, seconds=60, logs=logs)

        # 3. a job to reach by SSH: these agents run jobs as processes and say so with each
        # heartbeat, so no round matches it on them (issue 32: before, the agent refused it
        # after the match); it waits in the book, My orders says why, and the buyer cancels it
        public_key = ssh_public_key(tmp_path)
        page.goto(base + "/account/")
        page.fill("#ssh-keys input[name=name]", "laptop")
        page.fill("#ssh-keys textarea[name=public_key]", public_key)
        page.click("#ssh-keys button:has-text('Add key')")
        page.wait_for_selector("text=SSH key 'laptop' added (SHA256:")
        place_bid(page, base, image="python:3.11-slim", ssh=True)
        page.wait_for_selector("text=placed: it takes part in the next round")

        def explained() -> Any:
            bids = httpx.get(f"{base}/api/v1/bids/", headers=auth).json()["results"]
            return bids[0] if bids and "cannot publish ports" in " ".join((bids[0].get("explanation") or {}).get("reasons") or []) else None

        jobs_seen = lambda: [(j["id"], j["state"]) for j in httpx.get(f"{base}/api/v1/jobs/", headers=auth).json()["results"]]  # noqa: E731
        sshbid = wait_for("the SSH bid left unmatched, saying why", explained, seconds=90, logs=logs, seen=jobs_seen)
        assert sshbid["state"] == "open" and jobs_seen() == [], "never matched, so never refused"
        page.goto(base + "/orders/")
        row = f"tr[data-order='{sshbid['id']}']"
        assert "cannot publish ports" in page.inner_text(row)
        page.click(f"{row} button[aria-label='Cancel bid {sshbid['id']}']")
        wait_for("the SSH bid cancelled", lambda: httpx.get(f"{base}/api/v1/bids/{sshbid['id']}/", headers=auth).json()["state"] == "cancelled", seconds=15)

        # 4. as a new buyer would: Offers, filtered by CUDA >= 12 and 100 GB of disk (each
        # agent's heartbeat says its host), Rent this, a template, the quote, the bid; matched
        # to the cheaper machine, run once the trade is on chain
        def host_of(machine: int) -> Any:
            h = httpx.get(f"{base}/api/v1/machines/{machine}/", headers=provider).json()["host"]
            return h if h["cuda_version"] and h["net_down_mbps"] else None

        host = wait_for("the cheap machine's host, from its heartbeats", lambda: host_of(cheap_machine), seconds=30, logs=logs)
        assert (host["cuda_version"], host["disk_gb"], host["ram_gib"], host["runtime"]) == ("12.4", 500, 128, "process") and host["net_up_mbps"] > 0, host
        page.goto(base + "/offers/")
        page.select_option("select[name=gpu_model]", A10[2])
        page.fill("input[name=min_cuda]", "12")
        page.fill("input[name=min_disk_gb]", "100")
        page.click("form.filters button")
        page.wait_for_selector("#offers")
        rows = page.locator("#offers tbody tr")
        assert rows.count() == 1, page.inner_text("#offers")
        assert "CUDA 12.4 · 128 GiB RAM · 500 GB free · ↓" in rows.first.inner_text() and "eu-west" in rows.first.inner_text()
        shot(page, "rental-offers-host-filter")
        rows.first.locator("a.rent").click()
        page.wait_for_selector("#renting")
        assert page.input_value("#id_min_cuda") == "12" and page.input_value("#id_min_disk_gb") == "100", "the filters are the bid's needs"
        page.select_option("#id_template", "pytorch")
        assert "CUDA 12.4 drivers" in page.inner_text("#template-needs")
        assert page.input_value("#id_image").startswith("pytorch/pytorch:") and page.input_value("#id_min_cuda") == "12", "a need the buyer set stays"
        page.fill("#id_gpus", "1")
        page.fill("#id_hours", "0.1")
        page.fill("#id_command", JOB)
        page.wait_for_selector("#quote.ok")
        assert "Would match now at ~1.20 USDC/GPU-h in eu-west" in page.inner_text("#quote"), page.inner_text("#quote")
        shot(page, "rental-rent-this-quote")
        page.click("#place")
        page.wait_for_selector("text=placed: it takes part in the next round")

        def running() -> Any:
            jobs = httpx.get(f"{base}/api/v1/jobs/", headers=auth).json()["results"]
            return jobs[0] if jobs and jobs[0]["state"] == "running" else None

        job = wait_for("the job running on the cheaper machine", running, seconds=90, logs=logs, seen=jobs_seen)
        assert job["machine"] == cheap_machine
        trade = httpx.get(f"{base}/api/v1/trades/{job['trade']}/", headers=auth).json()
        assert trade["state"] == "recorded" and trade["price"] == 1_200_000 and trade["duration_s"] == 360
        offer = httpx.get(f"{base}/api/v1/offers/{trade['offer']}/").json()
        assert offer["gpus_free"] == 1, offer

        # the job page, live: its GPUs' utilisation from the agent's heartbeats, drawn, and its
        # output as it writes it
        page.goto(f"{base}/jobs/{job['id']}/")
        page.wait_for_selector("#rental")
        page.wait_for_selector("#job-gpu-chart canvas", timeout=30_000)
        page.wait_for_selector("#job-log:has-text('training: epoch 1')", timeout=30_000)
        points = httpx.get(f"{base}/api/v1/jobs/{job['id']}/telemetry/", headers=auth).json()["points"]
        assert points and points[-1][1] == 95.0, points  # the declared GPU's busy figure, from the heartbeats
        shot(page, "rental-job-live")

        # 5. more time at the offer's ask, from the job page
        assert "Extend at 1.20 USDC/GPU-h" in page.inner_text("#extend")
        page.fill("#extend-form input[name=hours]", "0.05")
        page.click("#extend")
        page.wait_for_selector("text=Extended by 3 min at 1.20 USDC/GPU-h")
        extension = next(t for t in httpx.get(f"{base}/api/v1/trades/", headers=auth).json()["results"] if t["extends"] == trade["id"])
        assert extension["extends"] == trade["id"] and extension["duration_s"] == 180 and extension["amount"] == 60_000
        assert page.locator("#extensions tbody tr").count() == 1
        shot(page, "rental-extended")

        # 6. stop early: a second, red step; then pending until the agent reports it stopped
        page.click("#stop-zone summary")
        page.click("#stop-confirm")
        page.wait_for_selector("text=is stopping")

        def stopped() -> Any:
            j = httpx.get(f"{base}/api/v1/jobs/{job['id']}/", headers=auth).json()
            return j if j["state"] == "stopped" and "receipt" in j["checkpoint"] else None

        done = wait_for("the job stopped with a signed receipt", stopped, seconds=60, logs=logs, seen=jobs_seen)
        used = done["checkpoint"]["receipt"]["body"]["gpu_seconds"]
        assert 0 < used < 360
        page.goto("about:blank")  # stops the job page's own refresh, which aborted a reload once
        page.goto(f"{base}/jobs/{job['id']}/")
        wait_for_js(page, "document.getElementById('booking-released') !== null")
        assert page.locator("#stop-zone").count() == 0 and page.locator("#extend-form").count() == 0
        shot(page, "rental-stopped")

        # 7. its output, uploaded by the agent and checked against the receipt, for the buyer only
        wait_for("the output at the market", lambda: httpx.get(f"{base}/api/v1/jobs/{job['id']}/outputs/", headers=auth).json().get("files"), seconds=60, logs=logs)
        page.goto("about:blank")  # stops the job page's own refresh, which aborted a reload once
        page.goto(f"{base}/jobs/{job['id']}/")
        with page.expect_download() as download:
            page.click("#job-outputs a[download]")
        content = Path(download.value.path()).read_bytes()
        (listed,) = done["checkpoint"]["receipt"]["outputs"]
        assert content == b"42" and hashlib.sha256(content).hexdigest() == listed["sha256"] and listed["path"] == "result.txt"
        stranger = {"Authorization": f"Bearer {tokens['dear']}"}
        assert httpx.get(f"{base}/api/v1/jobs/{job['id']}/outputs/result.txt", headers=stranger).status_code == 404

        # and the webhook heard it all, signed with the secret shown once
        got = wait_for_events(receiver, ["bid.matched", "job.running", "job.stopped"], seconds=30)
        assert got == ["bid.matched", "job.running", "job.stopped"], got  # the SSH bid never matched
        bodies = [verify(secret, request) for request in receiver.requests]
        assert bodies[1]["data"]["job"]["id"] == job["id"] and bodies[2]["data"]["job"]["id"] == job["id"], bodies

        # 8. the GPUs are back on the market, for the next buyer
        wait_for("the offer's GPU free again", lambda: httpx.get(f"{base}/api/v1/offers/{trade['offer']}/").json()["gpus_free"] == 2, seconds=10)

        # 9. both trades settle on chain against the agent's receipts; the provider is paid
        # for what ran, the buyer refunded the rest
        def settled() -> Any:
            rows = [httpx.get(f"{base}/api/v1/trades/{t}/", headers=auth).json() for t in (trade["id"], extension["id"])]
            # the extension's time never began: its receipt counts nothing and it is refunded whole
            return rows if rows[0]["state"] == "settled" and rows[1]["state"] in ("settled", "refunded") else None

        trades_seen = lambda: {t: httpx.get(f"{base}/api/v1/trades/{t}/", headers=auth).json()["state"] for t in (trade["id"], extension["id"])}  # noqa: E731
        wait_for("both trades closed on chain", settled, seconds=180, logs=logs, seen=trades_seen)
        earnings = wait_for("the payment in the provider's earnings", lambda: (e := httpx.get(f"{base}/api/v1/ledger/earnings/", headers=provider).json())["free"] > 0 and e, seconds=30)
        expected = trade["price"] * used // 3600  # the extension's receipt counts what ran past the first booking: nothing here
        assert earnings["paid"] == earnings["free"] == expected, earnings

        # what the job page says it cost is what its trade's payment page says the chain paid
        def money_of(url: str, where: str) -> dict[str, str]:
            page.goto(url)
            line = page.locator(f"{where} .money-line")
            return {k: line.get_attribute(f"data-{k}") or "" for k in ("locked", "paid", "refunded")}

        on_job = money_of(f"{base}/jobs/{job['id']}/", "#job-money")
        on_trade = money_of(f"{base}/trades/{trade['id']}/", "#trade-money")
        assert on_job == on_trade and on_job["paid"] == str(expected), (on_job, on_trade, expected)

        # 10. what the provider is shown is what the chain pays it
        page.context.clear_cookies()  # the provider signs in on its own
        log_in(page, base, "cheap")
        page.goto(base + "/provider/")
        offers_row = page.inner_text(f"text=#{trade['offer']} >> xpath=ancestor::tr")
        assert re.search(r"\b2 / 2\b", offers_row), offers_row
        before = token_balance(rpc, chain, address)
        r = agent(cheap, "withdraw")
        assert r.returncode == 0, r.stderr + r.stdout
        assert token_balance(rpc, chain, address) - before == expected, flat(r.stdout)
    finally:
        stop_daemons(daemons)

"""The ledger's REST API: co-signature transport between the market and real agents, and
the buyer's and provider's money endpoints (escrow, earnings, one trade's proofs,
deposits and withdrawals), with and without a chain.

Batches are built by the real services (`settle_collect` needs no node: it only reads
the deployment's chain id and market address), so no anvil is needed except for the
last tests, which deposit and withdraw on a real one.
"""

from __future__ import annotations

import re
import sys
import types
from typing import Any

import pytest

from tests.integration.helpers import TOKENS, drive, mint

pytestmark = [pytest.mark.django_db, pytest.mark.unfunded]  # the tests here count escrow to the unit

MARKET = "0x5FbDB2315678afecb367f053371D33aA2a4B0c5A"
TOKEN = "0xe7f1725E7734CE288F8367e1Bb143E90bb3F0512"


@pytest.fixture
def deployment(db: Any) -> Any:
    from ledger.context import chain_context_reset
    from ledger.models import Deployment

    chain_context_reset()
    d = Deployment.objects.create(chain_id=31337, rpc_url="", market_address=MARKET, token_address=TOKEN, deployed_block=1)
    yield d
    chain_context_reset()


def _record(trades: list[Any], deployment: Any, number: int = 1) -> Any:
    """What the listener leaves after TradesRecorded: a confirmed batch holding the trades."""
    from contracts.merkle import merkle_root, trade_leaf
    from ledger.custody import custodial_key_get_or_create
    from ledger.models import RecordBatch, RecordItem

    batch = RecordBatch.objects.create(deployment=deployment, state="confirmed", number=number, root="0x")
    leaves = []
    for pos, t in enumerate(trades):
        buyer = custodial_key_get_or_create(user=t.buyer).address
        deadline = 2_000_000_000
        leaf = trade_leaf(t.pk, buyer, t.provider.chain_address, t.price, t.gpus, t.duration_s, deadline)
        leaves.append(leaf)
        RecordItem.objects.create(batch=batch, trade=t, position=pos, order_id=t.bid_id, buyer=buyer, provider=t.provider.chain_address,
                                  price=t.price, gpus=t.gpus, duration=t.duration_s, deadline=deadline, leaf="0x" + leaf.hex())
        type(t).objects.filter(pk=t.pk).update(state="recorded")
    batch.root = "0x" + merkle_root(leaves).hex()
    batch.save()
    return batch


def _collect(deployment: Any) -> Any:
    from ledger.services import settle_collect

    return settle_collect(ctx=types.SimpleNamespace(deployment=deployment, chain_id=deployment.chain_id))  # type: ignore[arg-type]


def _run_job(provider_user: Any, make_job: Any, agent_for: Any) -> tuple[Any, Any]:
    """A real agent runs a real job; the market holds its verified receipt."""
    spec = {"command": [sys.executable, "-c", "open('outputs/r.txt', 'w').write('ok')"], "output_dir": "outputs"}
    job = make_job(provider_user, job_spec=spec)
    agent = agent_for(provider_user, job.trade.offer.machine)
    agent.connect()

    def receipted() -> bool:
        job.refresh_from_db()
        return "receipt" in job.checkpoint

    drive(agent, receipted)
    provider_user.provider.refresh_from_db()
    return agent, job


# --- co-signatures ------------------------------------------------------------------------------
def test_the_agent_cosigns_a_root_that_holds_its_own_receipt(provider_user, make_job, agent_for, deployment, client_for):
    from ledger.models import Cosign

    agent, job = _run_job(provider_user, make_job, agent_for)
    _record([job.trade], deployment)
    batch = _collect(deployment)
    assert batch is not None
    listed = client_for(provider_user, ["read", "provide"]).get("/api/v1/agent/cosigns/").json()["cosigns"]
    (req,) = listed
    assert req["trade"] == job.trade_id and req["root"] == batch.root and req["market"] == MARKET and req["chain_id"] == 31337
    assert req["receipt"]["gpu_seconds"] == job.checkpoint["receipt"]["body"]["gpu_seconds"]

    agent.next_poll = 0
    agent.tick()
    cosign = Cosign.objects.get(batch=batch)
    assert cosign.signature and cosign.signed_at, "the agent's signature was verified and kept"
    assert client_for(provider_user, ["read", "provide"]).get("/api/v1/agent/cosigns/").json()["cosigns"] == []


def test_the_agent_refuses_a_root_whose_leaf_for_its_trade_is_not_its_receipt_and_says_why(provider_user, make_job, agent_for, deployment):
    from ledger.models import Cosign, SettleBatch
    from market.models import Job

    agent, job = _run_job(provider_user, make_job, agent_for)
    checkpoint = dict(job.checkpoint)
    receipt = dict(checkpoint["receipt"])
    receipt["body"] = {**receipt["body"], "gpu_seconds": receipt["body"]["gpu_seconds"] + 3600}  # the market claims more time
    Job.objects.filter(pk=job.pk).update(checkpoint={**checkpoint, "receipt": receipt})
    _record([job.trade], deployment)
    batch = _collect(deployment)

    done = agent.cosigns_poll()
    assert list(done.values()) == ["refused"]
    assert Cosign.objects.get(batch=batch).signature == ""
    error = SettleBatch.objects.get(pk=batch.pk).error
    assert "differs from our receipt" in error and str(job.trade_id) in error
    assert agent.cosigns_poll() == {}, "a refused request is not answered again in the same run"


def test_a_cosignature_is_checked_owned_and_idempotent(provider_user, other_provider_user, make_job, agent_for, deployment, client_for):
    from contracts import bls
    from ledger.models import Cosign

    agent, job = _run_job(provider_user, make_job, agent_for)
    _record([job.trade], deployment)
    batch = _collect(deployment)
    cosign = Cosign.objects.get(batch=batch)
    mine = client_for(provider_user, ["read", "provide"])
    url = f"/api/v1/agent/cosigns/{cosign.pk}/"

    wrong = bls.sign(bls.keygen(b"\x05" * 32), bytes.fromhex(batch.message[2:])).hex()
    r = mine.post(url, {"signature": wrong}, format="json")
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_signature"
    assert "does not verify" in r.json()["error"]["message"]
    assert mine.post(url, {"signature": "zz"}, format="json").json()["error"]["fields"]["signature"]

    rival = client_for(other_provider_user, ["read", "provide"])
    r = rival.post(url, {"signature": wrong}, format="json")
    missing = rival.post("/api/v1/agent/cosigns/999999/", {"signature": wrong}, format="json")
    # another provider's request looks exactly like a missing one: no existence oracle
    assert r.status_code == missing.status_code == 404
    assert r.json()["error"]["message"] == missing.json()["error"]["message"].replace("999999", str(cosign.pk))
    assert rival.get("/api/v1/agent/cosigns/").json()["cosigns"] == []
    assert client_for(provider_user, ["read"]).get("/api/v1/agent/cosigns/").status_code == 403
    assert mine.post("/api/v1/agent/cosigns/999999/", {"signature": wrong}, format="json").status_code == 404

    good = agent.cosign_request(cosign.request)
    for _ in range(2):  # a repeat is answered the same way
        r = mine.post(url, {"signature": good}, format="json")
        assert r.status_code == 200 and r.json() == {"id": cosign.pk, "state": "signed"}
    cosign.refresh_from_db()
    assert cosign.signature == good


# --- money: journal-backed reads ----------------------------------------------------------------
def _journal(*legs: Any, tx: str = "0x" + "aa" * 32, block: int = 10) -> None:
    from ledger.journal import journal_append

    journal_append(legs=list(legs), tx_hash=tx, log_index=0, block_number=block, block_hash="0x" + "bb" * 32)


def test_escrow_shows_free_locked_and_the_locks_per_trade_from_the_journal(buyer, stranger, operator, provider_user, make_job, deployment, client_for):
    from ledger.custody import custodial_key_get_or_create
    from ledger.journal import Leg

    job = make_job(provider_user)
    address = custodial_key_get_or_create(user=buyer).address
    _journal(Leg("deposit", f"free:{address}", f"wallet:{address}", 100), tx="0x" + "01" * 32)
    _journal(Leg("lock", f"locked:{address}", f"free:{address}", 30, job.trade_id), tx="0x" + "02" * 32)
    body = client_for(buyer).get("/api/v1/ledger/escrow/").json()
    assert (body["address"], body["custodial"], body["free"], body["locked"]) == (address, True, 70, 30)
    assert body["locks"] == [{"trade": job.trade_id, "amount": 30, "deadline": None, "batch": None}]
    assert body["chain"] == {"chain_id": 31337, "market": MARKET, "token": TOKEN}

    assert client_for(stranger).get("/api/v1/ledger/escrow/").json()["free"] == 0
    assert client_for(stranger).get(f"/api/v1/ledger/escrow/?user={buyer.pk}").json()["free"] == 0, "only operators look at others"
    assert client_for(operator).get(f"/api/v1/ledger/escrow/?user={buyer.pk}").json()["free"] == 70


def test_earnings_are_for_providers_and_count_pay_held_and_stake(buyer, provider_user, make_job, client_for):
    from ledger.journal import Leg

    job = make_job(provider_user)
    p = provider_user.provider
    p.chain_address = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
    p.save()
    a = p.chain_address
    _journal(Leg("stake", f"stake:{a}", f"wallet:{a}", 500), tx="0x" + "03" * 32)
    _journal(Leg("pay", f"free:{a}", "locked:0xbuyer", 40, job.trade_id), tx="0x" + "04" * 32)
    _journal(Leg("hold", f"held:{job.trade_id}", f"free:{a}", 15, job.trade_id), tx="0x" + "05" * 32)
    body = client_for(provider_user).get("/api/v1/ledger/earnings/").json()
    assert (body["paid"], body["free"], body["held"], body["stake"]) == (40, 25, 15, 500)
    assert body["payments"][0]["trade"] == job.trade_id
    r = client_for(buyer).get("/api/v1/ledger/earnings/")
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


def test_earnings_count_a_won_dispute_once_subtract_a_lost_one_and_never_the_buyers_refund(buyer, provider_user, make_job, client_for):
    """A settlement pays the provider what was used and refunds the rest to the buyer; a
    dispute holds the payment, then gives it back (won) or to the buyer (lost)."""
    from ledger.journal import Leg

    won, lost, open_, plain = (make_job(provider_user, count=8).trade_id for _ in range(4))
    p = provider_user.provider
    p.chain_address = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
    p.save()
    a, b = p.chain_address, "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC"
    _journal(Leg("stake", f"stake:{a}", f"wallet:{a}", 500), tx="0x" + "10" * 32)
    for n, trade in enumerate((won, lost, open_, plain)):  # each lock 1000: 14 used, 986 back to the buyer
        _journal(Leg("pay", f"free:{a}", f"locked:{b}", 14 * (n + 1), trade), Leg("refund", f"free:{b}", f"locked:{b}", 1000 - 14 * (n + 1), trade),
                 tx="0x" + f"{0x20 + n:02x}" * 32)
    _journal(Leg("hold", f"held:{won}", f"free:{a}", 14, won), tx="0x" + "30" * 32)
    _journal(Leg("release", f"free:{a}", f"held:{won}", 14, won), tx="0x" + "31" * 32)
    _journal(Leg("hold", f"held:{lost}", f"free:{a}", 20, lost), Leg("hold", f"held:{lost}", f"stake:{a}", 8, lost), tx="0x" + "32" * 32)
    _journal(Leg("refund", f"free:{b}", f"held:{lost}", 28, lost), Leg("slash", f"free:{b}", f"stake:{a}", 5, lost), tx="0x" + "33" * 32)
    _journal(Leg("hold", f"held:{open_}", f"free:{a}", 42, open_), tx="0x" + "34" * 32)
    _journal(Leg("withdraw", f"wallet:{a}", f"free:{a}", 10), tx="0x" + "35" * 32)
    body = client_for(provider_user).get("/api/v1/ledger/earnings/").json()
    settled = 14 + 28 + 42 + 56
    assert body["paid"] == settled - 28, "won counted once, lost taken off"
    assert body["settled"] == settled, "the buyer's refunded share is not the provider's"
    assert body["held"] == 42 and body["disputes"] == {"open": 1, "held": 42, "won": 1, "won_amount": 14, "lost": 1, "lost_amount": 28}
    assert body["free"] == settled - 20 - 42 - 10 and body["withdrawn"] == 10
    assert (body["stake"], body["slashed"]) == (500 - 8 - 5, 5)
    assert {t["trade"]: (t["paid"], t["dispute"]) for t in body["payments"]} == {won: (14, "won"), lost: (28, "lost"), open_: (42, "open"), plain: (56, None)}
    assert body["series"][-1][1] == body["paid"] - body["held"]


def test_the_provider_page_shows_what_the_chain_paid_not_what_was_sold(buyer, provider_user, make_job):
    from django.test import Client

    from ledger.journal import Leg
    from market.models import Trade

    trade = Trade.objects.get(pk=make_job(provider_user, count=8).trade_id)
    Trade.objects.filter(pk=trade.pk).update(state="settled")
    p = provider_user.provider
    p.chain_address = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
    p.save()
    a, b = p.chain_address, "0x3C44CdDdB6a900fa2b585dd299e03d12FA4293BC"
    _journal(Leg("pay", f"free:{a}", f"locked:{b}", 1400, trade.pk), Leg("refund", f"free:{b}", f"locked:{b}", trade.amount - 1400, trade.pk))
    _journal(Leg("hold", f"held:{trade.pk}", f"free:{a}", 400, trade.pk), tx="0x" + "ab" * 32)
    c = Client()
    c.force_login(provider_user)
    html = c.get("/provider/").content.decode()
    assert '<dd class="bid" data-kpi="paid">0.0014 USDC</dd>' in html, html[html.find("kpis"):html.find("kpis") + 900]
    assert '<dd data-kpi="held">0.0004 USDC</dd>' in html
    for kpi in ("sold", "pending", "free", "stake"):  # every money card says its unit
        assert re.search(rf'data-kpi="{kpi}">-?[\d,]+\.\d+ USDC</dd>', html), kpi
    assert '<td class="num" data-field="paid">0.0014</td>' in html, "the sale shows what the chain paid beside its lock"
    assert f"{trade.amount / 1e6:.2f}" not in html[html.find('data-kpi="paid"'):html.find("</dl>")]


def test_a_trade_shows_its_transactions_root_and_a_receipt_proof_that_folds_to_the_root(provider_user, stranger, operator, make_job, agent_for, deployment, client_for):
    from contracts.merkle import receipt_leaf, verify_proof
    from ledger.models import ChainTx, RecordBatch

    agent, job = _run_job(provider_user, make_job, agent_for)
    record = _record([job.trade], deployment)
    tx = ChainTx.objects.create(purpose="record", key="record:x", chain_id=31337, sender="0x1", nonce=1, tx_hash="0x" + "cd" * 32,
                                raw="0x", state="confirmed", block_number=42)
    RecordBatch.objects.filter(pk=record.pk).update(chain_tx=tx)
    batch = _collect(deployment)

    url = f"/api/v1/ledger/trades/{job.trade_id}/"
    body = client_for(job.trade.buyer).get(url).json()
    assert body["record"]["tx"] == {"tx_hash": tx.tx_hash, "state": "confirmed", "block": 42, "block_hash": None}
    assert body["record"]["root"] == record.root
    s = body["settlement"]
    assert s["root"] == batch.root and s["tx"] is None and s["verified"]
    leaf = receipt_leaf(job.trade_id, s["gpu_seconds"], bytes.fromhex(s["digest"][2:]))
    assert "0x" + leaf.hex() == s["leaf"]
    assert verify_proof(leaf, [bytes.fromhex(p[2:]) for p in s["proof"]], bytes.fromhex(s["root"][2:]), s["index"])
    assert client_for(provider_user).get(url).status_code == 200
    assert client_for(operator).get(url).status_code == 200
    r = client_for(stranger).get(url)
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"


# --- money: deposits and withdrawals -----------------------------------------------------------
@pytest.mark.unfunded
def test_without_a_chain_deposits_and_withdrawals_say_so_and_reads_still_work(buyer, client_for):
    c = client_for(buyer)
    for path in ("deposit", "withdraw"):
        r = c.post(f"/api/v1/ledger/{path}/", {"amount": 0 if path == "withdraw" else 5}, format="json")
        if path == "withdraw":
            assert r.status_code == 400  # validated before anything else
            continue
        assert r.status_code == 503
        assert r.json()["error"]["code"] == "chain_unavailable" and "read-only" in r.json()["error"]["message"]
    body = c.get("/api/v1/ledger/escrow/").json()
    assert body["chain"] is None and body["free"] == 0


def test_the_chain_endpoint_is_public_and_says_when_there_is_no_chain(client):
    r = client.get("/api/v1/ledger/chain/")
    assert r.status_code == 200 and r.json() == {"chain": None}


def test_the_chain_endpoint_names_the_contracts_and_never_the_servers_private_node(deployment, client, settings):
    import dataclasses

    Deployment = type(deployment)
    Deployment.objects.filter(pk=deployment.pk).update(rpc_url="http://127.0.0.1:1")  # nothing listens: min_stake unknown
    chain = client.get("/api/v1/ledger/chain/").json()["chain"]
    assert chain == {"chain_id": 31337, "market": MARKET, "token": TOKEN, "rpc_url": "http://127.0.0.1:1", "min_stake": None, "token_decimals": 6, "faucet": True}
    settings.CONFIG = dataclasses.replace(settings.CONFIG, chain_rpc_url="https://node.example/v3/secret-key")
    assert client.get("/api/v1/ledger/chain/").json()["chain"]["rpc_url"] is None
    assert client.get("/api/v1/ledger/chain/").json()["chain"]["faucet"] is False, "a chain of its own by URL: no faucet unless CHAIN_FAUCET=true"
    settings.CONFIG = dataclasses.replace(settings.CONFIG, chain_public_rpc_url="https://rpc.example")
    assert client.get("/api/v1/ledger/chain/").json()["chain"]["rpc_url"] == "https://rpc.example"


@pytest.mark.parametrize("amount", [-1, 0, "ten", 1.5, True, None, "1e6"])
def test_amounts_must_be_positive_whole_base_units(buyer, client_for, amount):
    r = client_for(buyer).post("/api/v1/ledger/deposit/", {"amount": amount}, format="json")
    assert r.status_code == 400 and "amount" in r.json()["error"]["fields"]


@pytest.mark.unfunded
def test_withdrawing_more_than_the_free_balance_is_refused(buyer, client_for):
    r = client_for(buyer).post("/api/v1/ledger/withdraw/", {"amount": 1}, format="json")
    assert r.status_code == 400 and "free balance (0 base units, 0.00 USDC)" in r.json()["error"]["message"]


@pytest.mark.unfunded
def test_a_wallet_user_is_told_to_use_the_wallet(buyer, client_for):
    buyer.chain_address = "0x70997970C51812dc3A010C7d01b50e0d17dc79C8"
    buyer.save()
    r = client_for(buyer).post("/api/v1/ledger/deposit/", {"amount": 1}, format="json")
    assert r.status_code == 409 and "own wallet" in r.json()["error"]["message"]


# --- on a real chain ---------------------------------------------------------------------------


@pytest.mark.anvil
def test_a_custodial_deposit_and_withdrawal_reach_the_chain_once_each(ctx, buyer, client_for, django_capture_on_commit_callbacks):
    from ledger.custody import custodial_key_get_or_create
    from ledger.listener import events_sync
    from ledger.models import ChainTx

    address = custodial_key_get_or_create(user=buyer).address
    ctx.client.rpc("anvil_setBalance", [address, hex(10**20)])
    mint(ctx, address, 50 * TOKENS)
    c = client_for(buyer)

    r = c.post("/api/v1/ledger/deposit/", {"amount": 60 * TOKENS}, format="json")
    assert r.status_code == 400 and "custodial address" in r.json()["error"]["message"]

    headers = {"HTTP_IDEMPOTENCY_KEY": "dep-1"}
    with django_capture_on_commit_callbacks(execute=True):
        first = c.post("/api/v1/ledger/deposit/", {"amount": 20 * TOKENS}, format="json", **headers)
    assert first.status_code == 202, first.content
    with django_capture_on_commit_callbacks(execute=True):
        again = c.post("/api/v1/ledger/deposit/", {"amount": 20 * TOKENS}, format="json", **headers)
    assert again.status_code == 202 and again.json() == first.json() and again["Idempotent-Replayed"] == "true"
    deposit = ChainTx.objects.get(purpose="deposit")
    assert ctx.client.wait(deposit.tx_hash).succeeded
    events_sync(ctx=ctx, confirmations=0)
    assert c.get("/api/v1/ledger/escrow/").json()["free"] == 20 * TOKENS

    r = c.post("/api/v1/ledger/withdraw/", {"amount": 21 * TOKENS}, format="json")
    assert r.status_code == 400 and "free balance" in r.json()["error"]["message"]
    with django_capture_on_commit_callbacks(execute=True):
        r = c.post("/api/v1/ledger/withdraw/", {"amount": 5 * TOKENS}, format="json")
    r = c.get("/api/v1/ledger/escrow/")
    (withdraw,) = [p for p in r.json()["pending"] if p["purpose"] == "withdraw"]
    assert ctx.client.wait(withdraw["tx_hash"]).succeeded
    events_sync(ctx=ctx, confirmations=0)
    assert c.get("/api/v1/ledger/escrow/").json()["free"] == 15 * TOKENS
    assert ctx.client.view(ctx.token, "balanceOf", address) == 35 * TOKENS
    assert ChainTx.objects.filter(purpose="deposit").count() == 1

    # the audit log: one record per accepted move (the replay and the refusals add none)
    from market.models import AuditEvent

    (dep,) = AuditEvent.objects.filter(action="escrow.deposit")
    (wd,) = AuditEvent.objects.filter(action="escrow.withdraw")
    assert (wd.actor_id, wd.address, wd.object_type, wd.object_id, wd.details["amount"]) == (buyer.pk, "127.0.0.1", "escrow", address, 5 * TOKENS)
    assert (dep.actor_id, dep.details["amount"]) == (buyer.pk, 20 * TOKENS)


@pytest.mark.anvil
def test_the_chain_endpoint_reads_the_minimum_stake_from_the_contract(ctx, client):
    chain = client.get("/api/v1/ledger/chain/").json()["chain"]
    assert chain["min_stake"] == ctx.client.view(ctx.market, "min_stake") == 100 * TOKENS
    assert chain["market"] == ctx.deployment.market_address and chain["rpc_url"] == ctx.deployment.rpc_url


# --- pages ------------------------------------------------------------------------------------
@pytest.fixture
def browser_for(client):  # type: ignore[no-untyped-def]
    def login(user: Any) -> Any:
        client.force_login(user)
        return client

    return login


def test_the_wallet_page_shows_escrow_locks_and_custodial_forms(buyer, provider_user, make_job, deployment, browser_for):
    import html

    from ledger.custody import custodial_key_get_or_create
    from ledger.journal import Leg

    job = make_job(provider_user)
    address = custodial_key_get_or_create(user=buyer).address
    _journal(Leg("deposit", f"free:{address}", f"wallet:{address}", 12_500_000), tx="0x" + "06" * 32)
    _journal(Leg("lock", f"locked:{address}", f"free:{address}", 2_500_000, job.trade_id), tx="0x" + "07" * 32)
    page = html.unescape(browser_for(buyer).get("/wallet/").content.decode())
    assert 'id="escrow-free">10.00 USDC<' in page and 'id="escrow-locked">2.50 USDC<' in page and address in page
    assert f'href="/trades/{job.trade_id}/"' in page, "each lock links to its trade"
    assert 'id="deposit-form"' in page and 'id="withdraw-form"' in page and "Custodial" in page
    assert 'id="browser-wallet"' in page and "ledger/wallet.js" in page
    assert 'href="/wallet/"' in page and 'aria-current="page">Wallet' in page, "linked from the nav"


def test_the_wallet_page_without_a_chain_is_read_only_and_says_so(buyer, browser_for):
    c = browser_for(buyer)
    page = c.get("/wallet/").content.decode()
    assert 'id="chain-unavailable"' in page and 'id="deposit-form"' not in page
    r = c.post("/wallet/", {"action": "deposit", "amount": "5", "nonce": "n1"}, follow=True)
    assert "No chain is configured" in r.content.decode()
    r = c.post("/wallet/", {"action": "withdraw", "amount": "-3", "nonce": "n2"}, follow=True)
    assert "must be 0 or more USDC, like 2.50" in r.content.decode()  # amounts are typed in USDC


def test_the_wallet_needs_a_login(client):
    r = client.get("/wallet/")
    assert r.status_code == 302 and "/login/" in r["Location"]


def test_the_trade_page_embeds_the_proof_the_browser_checks(provider_user, stranger, make_job, agent_for, deployment, browser_for):
    import json
    import re

    from contracts.merkle import receipt_leaf, verify_proof

    agent, job = _run_job(provider_user, make_job, agent_for)
    _record([job.trade], deployment)
    batch = _collect(deployment)
    page = browser_for(job.trade.buyer).get(f"/trades/{job.trade_id}/").content.decode()
    data = json.loads(re.search(r'<script id="proof-data" type="application/json">(.*?)</script>', page, re.S).group(1))
    leaf = receipt_leaf(data["trade"], data["gpu_seconds"], bytes.fromhex(data["digest"][2:]))
    assert data["trade"] == job.trade_id and data["root"] == batch.root and "0x" + leaf.hex() == data["leaf"]
    assert verify_proof(leaf, [bytes.fromhex(p[2:]) for p in data["proof"]], bytes.fromhex(batch.root[2:]), data["index"])
    assert "ledger/keccak.js" in page and "ledger/proof.js" in page and 'id="proof-status"' in page
    assert "waiting for co-signatures (0 of 1)" in page
    assert browser_for(stranger).get(f"/trades/{job.trade_id}/").status_code == 404


def test_the_trade_page_of_an_unrecorded_trade_says_what_it_waits_for(provider_user, make_job, browser_for):
    job = make_job(provider_user, trade_state="pending")
    page = browser_for(job.trade.buyer).get(f"/trades/{job.trade_id}/").content.decode()
    assert "Not recorded yet" in page and "Not in a settlement batch yet" in page and "proof-data" not in page


def test_escrow_promised_to_open_bids_and_unrecorded_trades_cannot_be_withdrawn(buyer, client_for, make_bid):
    """A withdrawal takes only what no bid or matched trade still needs: else the recording
    batch would skip the trade forever while its booking held a provider's GPUs."""
    from tests.conftest import escrow_credit

    escrow_credit(buyer, 10 * 10**6)
    make_bid(buyer, gpus=2, max_price=3 * 10**6, duration_s=3600, fund=False)  # may cost 6 USDC
    r = client_for(buyer).post("/api/v1/ledger/withdraw/", {"amount": 5 * 10**6}, format="json")
    assert r.status_code == 400, r.content
    message = r.json()["error"]["message"]
    assert "4.00 USDC" in message and "6.00 USDC" in message and "open bids" in message, message


def test_locked_paid_and_refunded_are_three_figures_and_an_extension_shows_under_its_job(buyer, provider_user, make_job, deployment, client_for):
    """Issue 32, defect 4: the trade said "amount 0.40 USDC" (its lock) while 0.013666 was
    paid, an extension's row said "0.20 USDC settled" when nothing was paid, and an extension
    was an order of its own with no link to the job it extends."""
    from django.test import Client

    from ledger.custody import custodial_key_get_or_create
    from ledger.journal import Leg
    from market import money
    from market.models import Bid, Trade
    from tests.conftest import escrow_credit

    job = make_job(provider_user, gpus=1, duration_s=1200)
    trade = job.trade
    escrow_credit(buyer, trade.price)  # the extension's lock
    r = client_for(buyer).post(f"/api/v1/jobs/{job.pk}/extend/", {"duration_s": 600}, format="json")
    assert r.status_code == 201, r.content
    ext = Trade.objects.get(pk=r.json()["id"])
    buyer_at, provider_at = custodial_key_get_or_create(user=buyer).address, trade.provider.chain_address
    lock, used = trade.amount, trade.amount * 41 // 1200  # 41 s of 1,200 used
    _journal(Leg("lock", f"locked:{buyer_at}", f"free:{buyer_at}", lock, trade.pk), Leg("lock", f"locked:{buyer_at}", f"free:{buyer_at}", ext.amount, ext.pk),
             tx="0x" + "03" * 32)
    _journal(Leg("pay", f"free:{provider_at}", f"locked:{buyer_at}", used, trade.pk), Leg("refund", f"free:{buyer_at}", f"locked:{buyer_at}", lock - used, trade.pk),
             Leg("refund", f"free:{buyer_at}", f"locked:{buyer_at}", ext.amount, ext.pk), tx="0x" + "04" * 32)

    c = Client()
    c.force_login(buyer)
    page = c.get(f"/trades/{trade.pk}/").content.decode()
    line = f"locked <b>{money.usdc(lock)}</b> · paid <b>{money.usdc(used)}</b> · refunded <b>{money.usdc(lock - used)}</b>"
    assert line in page and "amount " + money.usdc(lock) not in page
    page = c.get(f"/trades/{ext.pk}/").content.decode()
    assert f"locked <b>{money.usdc(ext.amount)}</b> · paid <b>0.00 USDC</b> · refunded <b>{money.usdc(ext.amount)}</b>" in page
    assert f'extends <a href="/trades/{trade.pk}/">trade #{trade.pk}</a>' in page
    page = c.get(f"/jobs/{job.pk}/").content.decode()
    assert line in page and f'data-extension="{ext.pk}"' in page and "paid <b>0.00 USDC</b>" in page

    orders = c.get("/orders/").content.decode()
    assert re.findall(r'data-order="(\d+)"', orders) == [str(trade.bid_id)], "the extension is not an order of its own"
    assert Bid.objects.filter(buyer=buyer).count() == 2
    assert line in orders and f'data-extension="{ext.pk}"' in orders and f"+ extension <a href=\"/trades/{ext.pk}/\">" in orders


def test_the_wallet_statement_lists_every_movement_by_month_with_balances_and_as_csv(buyer, stranger, provider_user, make_job, deployment, client_for):
    """Issue 32, cost everywhere: a statement of the buyer's escrow from the journal; the
    chain check of the same figures is in test_provider_earnings_chain.py."""
    import csv
    import io
    from datetime import timedelta

    from django.test import Client
    from django.utils import timezone

    from ledger.custody import custodial_key_get_or_create
    from ledger.journal import Leg
    from ledger.models import JournalEntry

    job = make_job(provider_user)
    me, provider = custodial_key_get_or_create(user=buyer).address, job.trade.provider.chain_address
    _journal(Leg("deposit", f"free:{me}", f"wallet:{me}", 5_000_000), tx="0x" + "11" * 32, block=11)
    _journal(Leg("lock", f"locked:{me}", f"free:{me}", 1_200_000, job.trade_id), tx="0x" + "12" * 32, block=12)
    _journal(Leg("pay", f"free:{provider}", f"locked:{me}", 13_666, job.trade_id),
             Leg("refund", f"free:{me}", f"locked:{me}", 1_186_334, job.trade_id), tx="0x" + "13" * 32, block=13)
    _journal(Leg("withdraw", f"wallet:{me}", f"free:{me}", 1_000_000), tx="0x" + "14" * 32, block=14)
    _journal(Leg("deposit", f"free:{provider}", f"wallet:{provider}", 7), tx="0x" + "15" * 32, block=15)  # someone else's
    # the first two a month earlier
    JournalEntry.objects.filter(block_number__in=(11, 12)).update(created_at=timezone.now() - timedelta(days=40))
    earlier, now = (timezone.now() - timedelta(days=40)).strftime("%Y-%m"), timezone.now().strftime("%Y-%m")

    api = client_for(buyer)
    whole = api.get("/api/v1/ledger/statement/").json()
    assert [(x["kind"], x["free_change"], x["locked_change"], x["free_after"], x["locked_after"]) for x in whole["lines"]] == [
        ("deposit", 5_000_000, 0, 5_000_000, 0), ("lock", -1_200_000, 1_200_000, 3_800_000, 1_200_000),
        ("pay", 0, -13_666, 3_800_000, 1_186_334), ("refund", 1_186_334, -1_186_334, 4_986_334, 0), ("withdraw", -1_000_000, 0, 3_986_334, 0)]
    assert whole["closing"] == {"free": 3_986_334, "locked": 0} and whole["months"] == [now, earlier]
    assert whole["lines"][2]["what"] == f"paid for trade #{job.trade_id}" and whole["lines"][2]["tx_hash"] == "0x" + "13" * 32
    month = api.get("/api/v1/ledger/statement/", {"month": now}).json()
    assert month["opening"] == {"free": 3_800_000, "locked": 1_200_000} and [x["kind"] for x in month["lines"]] == ["pay", "refund", "withdraw"]
    assert month["totals"] == {"pay": 13_666, "refund": 1_186_334, "withdraw": 1_000_000}
    rows = list(csv.DictReader(io.StringIO(api.get("/api/v1/ledger/statement/", {"as": "csv", "month": now}).content.decode())))
    assert [(r["kind"], r["free_change"], r["locked_after"]) for r in rows] == [("pay", "0.000000", "1.186334"), ("refund", "1.186334", "0.000000"),
                                                                              ("withdraw", "-1.000000", "0.000000")]
    for bad, field in (({"month": "2026-13"}, "month"), ({"month": "last"}, "month"), ({"as": "xml"}, "as")):
        r = api.get("/api/v1/ledger/statement/", bad)
        assert r.status_code == 400 and field in r.json()["error"]["fields"], r.content
    assert client_for(stranger).get("/api/v1/ledger/statement/").json()["lines"] == []

    page = Client()
    page.force_login(buyer)
    html = page.get("/wallet/").content.decode()
    assert "free 3.80 USDC · locked 1.20 USDC" in html and 'id="spend-data"' in html  # this month's opening, and its payments per day
    assert "withdrawal to your wallet" in html and f'href="/trades/{job.trade_id}/">paid for trade #{job.trade_id}' in html
    assert "expected YEAR-MONTH" in page.get("/wallet/", {"month": "soon"}).content.decode()
    download = page.get("/wallet/statement.csv")
    assert download["Content-Disposition"].startswith('attachment; filename="gridbid-statement-') and len(download.content.decode().splitlines()) == 6
    assert page.get("/wallet/statement.csv", {"month": "x"}).status_code == 400

"""The web pages where money moves: a bid short of escrow offers the deposit, and the
dispute and ruling buttons look dangerous, ask first, and once sent show the request
pending until the chain confirms it, then the dispute's transaction, amount held and
window."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client

pytestmark = pytest.mark.django_db

BID = {"gpu_model": "H100-SXM-80GB", "gpus": 4, "max_price_usd": "2.75", "hours": "3", "location_region": "", "klass": "on_demand",
       "image": "img:1", "command": "python x.py"}


@pytest.fixture
def deployment(db: Any) -> Any:
    """A chain to deposit on, whose node does not answer (nothing here sends a transaction)."""
    from ledger.context import chain_context_reset
    from ledger.models import Deployment

    chain_context_reset()
    yield Deployment.objects.create(chain_id=31337, rpc_url="http://127.0.0.1:1", market_address="0x" + "11" * 20, token_address="0x" + "22" * 20)
    chain_context_reset()


def _client(user: Any) -> Client:
    c = Client()
    c.force_login(user)
    return c


@pytest.mark.unfunded
def test_a_bid_short_of_escrow_shows_the_shortfall_in_usdc_and_offers_the_deposit(buyer, deployment):
    c = _client(buyer)
    html = c.post("/bids/new/", BID).content.decode()
    # 2.75 USDC/GPU-h x 4 GPUs x 3 h = 33 USDC, none of it in escrow
    assert 'id="shortfall"' in html and "Short by <strong>33.00 USDC</strong>" in html
    link = re.search(r'id="deposit-shortfall" href="([^"]+)"', html)
    assert link and link.group(1) == "/wallet/?deposit=33.00#deposit"
    wallet = c.get("/wallet/?deposit=33.00").content.decode()
    assert re.search(r'name="amount"[^>]*value="33\.00"', wallet), "the deposit form is filled in"
    assert "Your bid needs 33.00 USDC more" in wallet
    assert 'value="abc"' not in c.get("/wallet/?deposit=abc").content.decode()


def test_the_wallet_takes_amounts_in_usdc_and_says_what_it_cannot_read(buyer, deployment):
    c = _client(buyer)
    html = c.get("/wallet/").content.decode()
    assert "Deposit (USDC)" in html and "base units" not in html
    said = c.post("/wallet/", {"action": "deposit", "amount": "lots", "nonce": "n1"}, follow=True).content.decode()
    assert "&#x27;lots&#x27; is not a number of USDC" in said


@pytest.fixture
def settled_trade(buyer, provider_user, make_offer, make_bid) -> Any:
    from market.models import Trade
    from market.rounds import round_clear
    from tests.conftest import escrow_credit

    escrow_credit(buyer, 100_000_000)  # (tests with a chain fixture start unfunded)
    make_offer(provider_user, price=2_500_000)
    make_bid(buyer, gpus=1, duration_s=5 * 3600)
    round_clear()
    trade = Trade.objects.get()
    Trade.objects.filter(pk=trade.pk).update(state="settled")
    trade.refresh_from_db()
    return trade


def test_the_dispute_button_looks_dangerous_and_asks_before_anything_is_sent(buyer, settled_trade):
    from market.models import AuditEvent

    c = _client(buyer)
    page = c.get(f"/trades/{settled_trade.pk}/").content.decode()
    button = re.search(r'<button[^>]*value="dispute"[^>]*>', page).group(0)
    assert 'class="danger"' in button and "data-confirm=" in button
    assert "2.50 USDC/GPU-h" in page and "12.50 USDC" in page
    # a post that was not confirmed (no JavaScript, or a stray click) only asks again
    again = c.post(f"/trades/{settled_trade.pk}/", {"action": "dispute", "nonce": "n1", "confirmed": ""})
    html = again.content.decode()
    assert again.status_code == 200 and 'id="confirm"' in html and "Yes: dispute this trade" in html
    assert not AuditEvent.objects.filter(action="trade.dispute").exists()


def _dispute_sent(buyer: Any, trade: Any, *, tx_state: str) -> Any:
    from ledger.models import ChainTx
    from market.audit import AuditAction, audit_record

    audit_record(actor=buyer, action=AuditAction.TRADE_DISPUTE, obj=trade,
                 details={"state": "accepted", "window_left_s": 20 * 3600, "transactions": ["dispute:web:t:n1"]})
    return ChainTx.objects.create(purpose="dispute", key="dispute:web:t:n1", chain_id=31337, sender="0x" + "ab" * 20, nonce=7,
                                  tx_hash="0x" + "d1" * 32, raw="0x00", state=tx_state, error="market: window closed" if tx_state == "failed" else "")


def test_a_sent_dispute_shows_as_pending_not_as_the_old_state_with_the_same_button(buyer, settled_trade):
    _dispute_sent(buyer, settled_trade, tx_state="sent")
    html = _client(buyer).get(f"/trades/{settled_trade.pk}/").content.decode()
    assert 'id="pending-pill"' in html and "dispute pending" in html
    assert "0x" + "d1" * 32 in html
    assert 'value="dispute"' not in html, "the dispute button is gone while the dispute is pending"
    assert "location.reload()" in html  # the page follows it until the chain confirms


def test_a_failed_dispute_transaction_says_so_and_offers_the_button_again(buyer, settled_trade):
    _dispute_sent(buyer, settled_trade, tx_state="failed")
    html = _client(buyer).get(f"/trades/{settled_trade.pk}/").content.decode()
    assert 'id="dispute-failed"' in html and "market: window closed" in html
    assert 'value="dispute"' in html and "dispute pending" not in html


def test_a_disputed_trade_shows_the_dispute_transaction_amount_held_and_deadline(buyer, operator, settled_trade, deployment):
    from ledger.models import ChainEvent
    from market.models import Trade

    _dispute_sent(buyer, settled_trade, tx_state="confirmed")
    ChainEvent.objects.create(deployment=deployment, block_number=42, block_hash="0x" + "b4" * 32, tx_hash="0x" + "d1" * 32, log_index=0,
                              name="DisputeOpened", applied=True,
                              args={"trade_id": settled_trade.pk, "buyer": "0x" + "ab" * 20, "provider": "0x" + "cd" * 20,
                                    "held": 12_500_000, "from_stake": 2_500_000})
    Trade.objects.filter(pk=settled_trade.pk).update(state="disputed")
    html = _client(buyer).get(f"/trades/{settled_trade.pk}/").content.decode()
    facts = html[html.index('id="dispute-facts"'):]
    assert "0x" + "d1" * 32 in facts and "block 42" in facts
    assert "12.50 USDC (2.50 USDC of it from the provider's stake)" in facts
    assert re.search(r'id="dispute-deadline">closes <time class="ts" datetime="[^"]+Z">\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC</time>', facts)
    assert "dispute pending" not in html

    ruling = _client(operator).get(f"/trades/{settled_trade.pk}/").content.decode()
    for action in ("pay-provider", "refund-buyer"):
        button = re.search(rf'<button[^>]*value="{action}"[^>]*>', ruling).group(0)
        assert 'class="danger"' in button and "data-confirm=" in button
    assert "Slash (USDC)" in ruling


def test_a_sent_ruling_shows_as_pending_and_its_buttons_are_gone(buyer, operator, settled_trade):
    from ledger.models import ChainTx
    from market.audit import AuditAction, audit_record
    from market.models import Trade

    Trade.objects.filter(pk=settled_trade.pk).update(state="disputed")
    c = _client(operator)
    again = c.post(f"/trades/{settled_trade.pk}/", {"action": "refund-buyer", "slash": "1.25", "nonce": "r1"}).content.decode()
    assert 'id="confirm"' in again and "Yes: refund the buyer" in again and 'value="1.25"' in again
    audit_record(actor=operator, action=AuditAction.TRADE_RULING, obj=settled_trade,
                 details={"pay_provider": False, "slash": 1_250_000, "state": "accepted", "transactions": ["ruling:web:o:r1"]})
    ChainTx.objects.create(purpose="ruling", key="ruling:web:o:r1", chain_id=31337, sender="0x" + "ef" * 20, nonce=3,
                           tx_hash="0x" + "e2" * 32, raw="0x00", state="mined", block_number=77)
    html = c.get(f"/trades/{settled_trade.pk}/").content.decode()
    assert "ruling pending" in html and "0x" + "e2" * 32 in html and "in block 77" in html
    assert 'value="refund-buyer"' not in html and 'value="pay-provider"' not in html

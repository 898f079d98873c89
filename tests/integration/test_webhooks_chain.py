"""Payment settled and dispute ruled, as the listener confirms them on a real anvil: the
buyer's webhook (a real HTTP receiver) hears both, signed."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.helpers import (
    TOKENS,
    agents_cosign,
    finish_with_receipt,
    fund_buyer,
    register_provider,
    sync_chain,
)
from tests.receiver import Receiver, verify

pytestmark = pytest.mark.django_db


def _settled_trade(ctx: Any, buyer: Any, provider_user: Any, make_offer: Any, make_bid: Any) -> Any:
    """A trade recorded and settled through the tasks, half its time used. (The buyer's
    deposit is synced before it bids: a bid needs free escrow.)"""
    from ledger import tasks
    from ledger.models import SettleBatch
    from market.models import Trade
    from market.rounds import round_clear

    bls_key = register_provider(ctx, provider_user)
    fund_buyer(ctx, buyer, 1000 * TOKENS)
    sync_chain(ctx)
    make_offer(provider_user, price=2 * TOKENS, count=8)
    make_bid(buyer, gpus=4, max_price=3 * TOKENS, duration_s=3600)
    round_clear()
    trade = Trade.objects.get()
    tasks.trades_record.delay()
    sync_chain(ctx)
    trade.refresh_from_db()
    r = finish_with_receipt(trade, bls_key, trade.gpus * 1800)
    tasks.batches_settle.delay()
    agents_cosign(SettleBatch.objects.get(), {provider_user.provider.chain_address: bls_key}, {trade.pk: r})
    tasks.batches_settle.delay()
    sync_chain(ctx)
    trade.refresh_from_db()
    assert trade.state == "settled"
    return trade


@pytest.mark.anvil
def test_the_buyer_hears_its_trade_settle_and_the_arbiters_ruling_from_the_chain(
    ctx: Any, buyer: Any, provider_user: Any, operator: Any, make_offer: Any, make_bid: Any, client_for: Any,
    django_capture_on_commit_callbacks: Any, settings: Any,
) -> None:
    settings.GRIDBID = {**settings.GRIDBID, "WEBHOOK_ALLOW_PRIVATE_URLS": True}
    receiver = Receiver()
    try:
        r = client_for(buyer).post("/api/v1/webhooks/", {"url": receiver.url, "events": ["payment.settled", "dispute.ruled"]}, format="json")
        assert r.status_code == 201, r.content
        secret = r.json()["secret"]
        with django_capture_on_commit_callbacks(execute=True):
            trade = _settled_trade(ctx, buyer, provider_user, make_offer, make_bid)
        assert receiver.events() == ["payment.settled"]

        with django_capture_on_commit_callbacks(execute=True):
            assert client_for(buyer).post(f"/api/v1/ledger/trades/{trade.pk}/dispute/").status_code == 202
        with django_capture_on_commit_callbacks(execute=True):
            sync_chain(ctx)
            sync_chain(ctx)
        with django_capture_on_commit_callbacks(execute=True):
            r = client_for(operator).post(f"/api/v1/ledger/trades/{trade.pk}/ruling/", {"pay_provider": False, "slash": 5 * TOKENS}, format="json")
            assert r.status_code == 202, r.content
        with django_capture_on_commit_callbacks(execute=True):
            sync_chain(ctx)
            sync_chain(ctx)
        assert receiver.events() == ["payment.settled", "dispute.ruled"]
        settled, ruled = (verify(secret, request) for request in receiver.requests)
        assert settled["data"]["trade"]["id"] == trade.pk and settled["data"]["trade"]["state"] == "settled" and settled["data"]["role"] == "buyer"
        assert ruled["data"]["outcome"] == "buyer_refunded" and ruled["data"]["trade"]["state"] == "refunded"
    finally:
        receiver.close()

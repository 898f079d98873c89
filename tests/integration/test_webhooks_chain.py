"""Payment settled and dispute ruled, as the listener confirms them on a real anvil: the
buyer's webhook (a real HTTP receiver) hears both, signed."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.helpers import TOKENS, settled_trade, sync_chain
from tests.receiver import Receiver, verify

pytestmark = pytest.mark.django_db


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
            trade, _, _ = settled_trade(ctx, buyer, provider_user, make_offer, make_bid)
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

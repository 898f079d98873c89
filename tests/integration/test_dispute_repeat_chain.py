"""A trade is disputed once: a second dispute, while the first is on its way, open or ruled
on, answers 409 with where the trade stands, not 202 "accepted" for a transaction that is
never sent (issue 17, item 8). Against a real anvil, through the API."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.helpers import settled_trade, sync_chain

pytestmark = [pytest.mark.django_db, pytest.mark.anvil]


def _refused(r: Any, *words: str) -> dict[str, Any]:
    assert r.status_code == 409, r.content
    error = r.json()["error"]
    assert error["code"] == "conflict"
    for word in words:
        assert word in error["message"], (word, error["message"])
    return error


def test_a_second_dispute_is_refused_with_the_trades_state_while_the_first_is_pending_open_or_ruled(
    ctx: Any, buyer: Any, provider_user: Any, operator: Any, make_offer: Any, make_bid: Any,
    client_for: Any, django_capture_on_commit_callbacks: Any,
) -> None:
    from ledger.models import ChainTx
    from market.models import AuditEvent

    trade, _, _ = settled_trade(ctx, buyer, provider_user, make_offer, make_bid)
    url = f"/api/v1/ledger/trades/{trade.pk}/dispute/"
    as_buyer = client_for(buyer)
    with django_capture_on_commit_callbacks(execute=True):
        first = as_buyer.post(url, HTTP_IDEMPOTENCY_KEY="d1")
    assert first.status_code == 202, first.content
    sent = ChainTx.objects.get(purpose="dispute")

    # sent, not yet seen by the listener: the trade is still settled here
    with django_capture_on_commit_callbacks(execute=True):
        again = as_buyer.post(url)
    error = _refused(again, "pending", sent.tx_hash)
    assert error["details"]["trade"] == trade.pk and error["details"]["state"] == "settled"
    assert error["details"]["dispute"] == "pending"
    # the same request again (its Idempotency-Key) still gets the first answer
    replay = as_buyer.post(url, HTTP_IDEMPOTENCY_KEY="d1")
    assert replay.status_code == 202 and replay["Idempotent-Replayed"] == "true"
    assert replay.json()["transactions"][0]["key"] == first.json()["transactions"][0]["key"]
    assert ChainTx.objects.filter(purpose="dispute").count() == 1, "nothing more was signed or sent"
    assert AuditEvent.objects.filter(action="trade.dispute").count() == 1, "a refused try is not an accepted dispute"

    sync_chain(ctx)
    sync_chain(ctx)
    trade.refresh_from_db()
    assert trade.state == "disputed"
    _refused(as_buyer.post(url), "disputed")

    # ruled for the provider: the trade is settled again here, and closed on chain for good
    with django_capture_on_commit_callbacks(execute=True):
        ruled = client_for(operator).post(f"/api/v1/ledger/trades/{trade.pk}/ruling/", {"pay_provider": True}, format="json")
    assert ruled.status_code == 202, ruled.content
    sync_chain(ctx)
    sync_chain(ctx)
    trade.refresh_from_db()
    assert trade.state == "settled"
    with django_capture_on_commit_callbacks(execute=True):
        after = as_buyer.post(url)
    error = _refused(after, "ruled")
    assert error["details"]["state"] == "settled" and error["details"]["dispute"] == "resolved"
    assert ChainTx.objects.filter(purpose="dispute").count() == 1
    assert AuditEvent.objects.filter(action="trade.dispute").count() == 1

"""A provider's earnings against a real anvil: trades settled pro rata, a dispute won, one
lost with a slash, one still open and a withdrawal; the figures the API, the provider page
and the agent show are rebuilt from the chain's own events and views and must match to the
unit."""

from __future__ import annotations

import csv
import io
from typing import Any

import pytest

from tests.integration.helpers import (
    PROVIDER_KEYS,
    TOKENS,
    agents_cosign,
    finish_with_receipt,
    fund_buyer,
    register_provider,
    settle_as_beat_does,
    sync_chain,
)

pytestmark = [pytest.mark.django_db, pytest.mark.anvil]


def rebuilt_from_chain(ctx: Any, address: str) -> dict[str, Any]:
    """The provider's figures from the market contract's logs alone (no journal, no
    database), checked against its views. Every settlement batch here pays one provider,
    so BatchSettled's `paid` is this provider's."""
    events = ctx.client.events(ctx.market, ctx.deployment.deployed_block, ctx.client.block_number())
    me = address.lower()
    settled = withdrawn = staked = slashed = 0
    opened: dict[int, dict[str, Any]] = {}
    resolved: dict[int, dict[str, Any]] = {}
    for e in events:
        a = e.args
        if e.name == "BatchSettled":
            settled += int(a["paid"])
        elif e.name == "Withdrawn" and a["account"].lower() == me:
            withdrawn += int(a["amount"])
        elif e.name == "ProviderRegistered" and a["provider"].lower() == me:
            staked += int(a["stake"])
        elif e.name == "StakeAdded" and a["provider"].lower() == me:
            staked += int(a["amount"])
        elif e.name == "DisputeOpened" and a["provider"].lower() == me:
            opened[int(a["trade_id"])] = a
        elif e.name == "DisputeResolved" and int(a["trade_id"]) in opened:
            resolved[int(a["trade_id"])] = a
    won = {t: r for t, r in resolved.items() if r["provider_paid"]}
    lost = {t: r for t, r in resolved.items() if not r["provider_paid"]}
    held = sum(int(o["held"]) for t, o in opened.items() if t not in resolved)
    lost_amount = sum(int(r["amount"]) for r in lost.values())
    slashed = sum(int(r["slashed"]) for r in lost.values())
    from_free = sum(int(o["held"]) - int(o["from_stake"]) for o in opened.values())
    from_stake = sum(int(o["from_stake"]) for o in opened.values())
    back_free = sum(int(r["amount"]) - int(r["restaked"]) for r in won.values())
    back_stake = sum(int(r["restaked"]) for r in won.values())
    out = {
        "settled": settled, "paid": settled - lost_amount, "held": held, "withdrawn": withdrawn, "slashed": slashed,
        "free": settled - from_free + back_free - withdrawn, "stake": staked - from_stake + back_stake - slashed,
        "disputes": {"open": len(opened) - len(resolved), "held": held, "won": len(won), "won_amount": sum(int(r["amount"]) for r in won.values()),
                     "lost": len(lost), "lost_amount": lost_amount},
    }
    # the contract's own state agrees with the rebuild
    assert int(ctx.client.view(ctx.market, "balance_of", address)) == out["free"]
    assert int(ctx.client.view(ctx.market, "providers", address)[1]) == out["stake"]
    assert int(ctx.client.view(ctx.market, "total_held")) == held
    return out


def _dispute(client_for: Any, capture: Any, ctx: Any, user: Any, trade: Any) -> None:
    with capture(execute=True):
        r = client_for(user).post(f"/api/v1/ledger/trades/{trade.pk}/dispute/")
    assert r.status_code == 202, r.content
    sync_chain(ctx)
    sync_chain(ctx)


def _rule(client_for: Any, capture: Any, ctx: Any, operator: Any, trade: Any, body: dict[str, Any]) -> None:
    with capture(execute=True):
        r = client_for(operator).post(f"/api/v1/ledger/trades/{trade.pk}/ruling/", body, format="json")
    assert r.status_code == 202, r.content
    sync_chain(ctx)
    sync_chain(ctx)


def test_the_providers_figures_are_the_chains_to_the_unit_through_disputes_won_lost_and_open(
    ctx: Any, buyer: Any, provider_user: Any, operator: Any, make_offer: Any, make_bid: Any,
    client_for: Any, django_capture_on_commit_callbacks: Any,
) -> None:
    from django.test import Client

    from ledger import tasks
    from ledger.balances import earnings_of
    from ledger.chain import signer_from_hex
    from ledger.journal import journal_verify
    from ledger.models import SettleBatch
    from ledger.outbox import tx_submit
    from market.models import Trade
    from market.rounds import round_clear
    from market.templatetags.gridbid import tokens

    capture = django_capture_on_commit_callbacks
    bls_key = register_provider(ctx, provider_user)
    fund_buyer(ctx, buyer, 1000 * TOKENS)
    sync_chain(ctx)  # the deposit confirmed: escrow to bid with
    sync_chain(ctx)
    make_offer(provider_user, price=2 * TOKENS, count=8)
    for _ in range(4):
        make_bid(buyer, gpus=1, max_price=3 * TOKENS, duration_s=3600)
    round_clear()
    won, lost, open_, plain = trades = list(Trade.objects.order_by("id"))
    assert len(trades) == 4
    tasks.trades_record.delay()
    sync_chain(ctx)
    # a few seconds of an hour's lock used: the chain pays that, the rest goes back to the buyer
    receipts = {t.pk: finish_with_receipt(t, bls_key, used) for t, used in zip(trades, (7, 9, 11, 13), strict=True)}
    tasks.batches_settle.delay()
    agents_cosign(SettleBatch.objects.get(), {provider_user.provider.chain_address: bls_key}, receipts)
    settle_as_beat_does(ctx, lambda: set(Trade.objects.values_list("state", flat=True)) == {"settled"})
    address = provider_user.provider.chain_address

    _dispute(client_for, capture, ctx, buyer, won)
    _rule(client_for, capture, ctx, operator, won, {"pay_provider": True})
    _dispute(client_for, capture, ctx, buyer, lost)
    # the most a slash may take: twice what the trade paid (the contract's bound, issue 17)
    _rule(client_for, capture, ctx, operator, lost, {"pay_provider": False, "slash": 2 * (lost.price * 9 // 3600)})
    _dispute(client_for, capture, ctx, buyer, open_)
    account = signer_from_hex(PROVIDER_KEYS[0])
    tx = tx_submit(client=ctx.client, signer=account, key="take-some", purpose="withdraw", call=ctx.market.functions.withdraw(5000))
    assert ctx.client.wait(tx.tx_hash).succeeded
    sync_chain(ctx)
    sync_chain(ctx)
    assert journal_verify(ctx=ctx) == []

    chain = rebuilt_from_chain(ctx, address)
    pay = {t.pk: t.price * used // 3600 for t, used in zip(trades, (7, 9, 11, 13), strict=True)}
    assert chain["settled"] == sum(pay.values()) < sum(t.amount for t in trades) // 100, "a few seconds' worth, not the locks"
    assert chain["paid"] == sum(pay.values()) - pay[lost.pk] and chain["held"] == pay[open_.pk]

    figures = earnings_of(provider=provider_user.provider)
    assert {k: figures[k] for k in chain} == chain
    assert {t["trade"]: (t["paid"], t["dispute"]) for t in figures["payments"]} == {
        won.pk: (pay[won.pk], "won"), lost.pk: (pay[lost.pk], "lost"), open_.pk: (pay[open_.pk], "open"), plain.pk: (pay[plain.pk], None)}
    api = client_for(provider_user).get("/api/v1/ledger/earnings/").json()
    assert {k: api[k] for k in chain} == chain

    page = Client()
    page.force_login(provider_user)
    html = page.get("/provider/").content.decode()
    for kpi in ("paid", "held", "free", "stake"):
        assert f'data-kpi="{kpi}">{tokens(chain[kpi])} USDC</dd>' in html, kpi  # issue 32: money with its unit

    # issue 32: the buyer's statement (API, CSV and wallet page) is the chain's events for
    # that buyer, to the unit: its deposits, the locks its trades were recorded with, what
    # settlements paid and refunded, what the lost dispute gave back; and it closes at the
    # contract's own balances
    buyer_chain = buyer_rebuilt_from_chain(ctx, ledger_address(buyer))
    statement = client_for(buyer).get("/api/v1/ledger/statement/").json()
    totals = statement["totals"]
    assert (totals.get("deposit", 0), totals["lock"], totals["pay"], totals["refund"], totals.get("slash", 0)) == (
        buyer_chain["deposited"], buyer_chain["locked"], buyer_chain["paid"], buyer_chain["refunded"], buyer_chain["slashed_to_me"])
    assert statement["closing"] == {"free": buyer_chain["free"], "locked": buyer_chain["locked_now"]}
    assert [line["kind"] for line in statement["lines"]][:1] == ["deposit"] and statement["months"]
    csv_rows = list(csv.DictReader(io.StringIO(client_for(buyer).get("/api/v1/ledger/statement/", {"as": "csv"}).content.decode())))
    assert [(int(r["seq"]), r["kind"], r["tx_hash"]) for r in csv_rows] == [(x["seq"], x["kind"], x["tx_hash"]) for x in statement["lines"]]
    assert sum(round(float(r["free_change"]) * 10**6) for r in csv_rows) == buyer_chain["free"]
    page.force_login(buyer)
    html = page.get("/wallet/").content.decode()
    assert f"free {tokens(buyer_chain['free'])} USDC · locked {tokens(buyer_chain['locked_now'])} USDC" in html
    assert page.get("/wallet/statement.csv", {"month": statement["months"][0]}).content.decode().splitlines()[1:] == \
        [line for line in client_for(buyer).get("/api/v1/ledger/statement/", {"as": "csv", "month": statement["months"][0]}).content.decode().splitlines()[1:]]


def ledger_address(user: Any) -> str:
    from ledger.balances import escrow_of

    return str(escrow_of(user=user)["address"])


def buyer_rebuilt_from_chain(ctx: Any, address: str) -> dict[str, int]:
    """A lone buyer's money from the market contract's logs alone: its deposits, the locks of
    the record batches (every trade here is its), what settlements paid and refunded, and
    what disputes it won gave back; checked against the contract's views."""
    events = ctx.client.events(ctx.market, ctx.deployment.deployed_block, ctx.client.block_number())
    me = address.lower()
    out = {"deposited": 0, "withdrawn": 0, "locked": 0, "paid": 0, "refunded": 0, "won_back": 0, "trade_refunds": 0, "slashed_to_me": 0}
    for e in events:
        a = e.args
        if e.name == "Deposited" and a["buyer"].lower() == me:
            out["deposited"] += int(a["amount"])
        elif e.name == "Withdrawn" and a["account"].lower() == me:
            out["withdrawn"] += int(a["amount"])
        elif e.name == "TradesRecorded":
            out["locked"] += int(a["locked"])
        elif e.name == "BatchSettled":
            out["paid"] += int(a["paid"])
            out["refunded"] += int(a["refunded"])
        elif e.name == "TradeRefunded" and a["buyer"].lower() == me:
            out["trade_refunds"] += int(a["amount"])
        elif e.name == "DisputeResolved" and not a["provider_paid"]:
            out["won_back"] += int(a["amount"])
            out["slashed_to_me"] += int(a["slashed"])
    out["refunded"] += out["won_back"] + out["trade_refunds"]
    out["locked_now"] = out["locked"] - int(out["paid"]) - (out["refunded"] - out["won_back"])
    out["free"] = out["deposited"] - out["withdrawn"] - out["locked"] + out["refunded"] + out["slashed_to_me"]
    assert int(ctx.client.view(ctx.market, "balance_of", address)) == out["free"]
    assert int(ctx.client.view(ctx.market, "total_locked")) == out["locked_now"]
    return out

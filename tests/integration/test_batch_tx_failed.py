"""A batch whose transaction failed for good frees its trades (issue 17: settlement that
cannot stall). A transaction ends `failed` when it reverted on chain or when another
transaction took its nonce; its batch stayed `submitted` for ever before, and its trades,
held by the batch's items, could never be batched again."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.helpers import TOKENS, fund_buyer, register_provider, sync_chain

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anvil]


def test_a_record_batch_whose_nonce_another_transaction_took_frees_its_trades_for_the_next_batch(
    ctx: Any, buyer: Any, provider_user: Any, make_offer: Any, make_bid: Any,
) -> None:
    from ledger import tasks
    from ledger.models import ChainTx, RecordBatch
    from market.models import Trade
    from market.rounds import round_clear

    client = ctx.client
    register_provider(ctx, provider_user)
    fund_buyer(ctx, buyer, 1000 * TOKENS)
    sync_chain(ctx)
    make_offer(provider_user, price=2 * TOKENS, count=8)
    make_bid(buyer, gpus=2, max_price=3 * TOKENS, duration_s=3600)
    round_clear()
    (trade,) = Trade.objects.all()

    client.rpc("evm_setAutomine", [False])
    try:
        tasks.trades_record.delay()
        (first,) = RecordBatch.objects.all()
        sent = ChainTx.objects.get(pk=first.chain_tx_id)
        # the operator's key sends something else with that nonce first (a second server, a
        # wallet holding the same key): the record can never be mined now
        other = ctx.operator.sign_transaction({
            "to": ctx.operator.address, "value": 0, "gas": 21_000, "nonce": sent.nonce, "chainId": ctx.chain_id,
            "maxFeePerGas": 10**12, "maxPriorityFeePerGas": 10**11,
        })
        client.rpc("eth_sendRawTransaction", ["0x" + bytes(other.raw_transaction).hex()])
        client.rpc("evm_mine")
    finally:
        client.rpc("evm_setAutomine", [True])
    assert client.receipt(sent.tx_hash) is None

    sync_chain(ctx)
    sent.refresh_from_db()
    assert sent.state == "failed"
    first.refresh_from_db()
    assert first.state == "failed" and "nonce" in first.error and sent.tx_hash in first.error
    trade.refresh_from_db()
    assert trade.state == "pending" and not RecordBatch.objects.filter(items__trade=trade).exists()

    # the next batch takes the trade and the chain records it
    tasks.trades_record.delay()
    sync_chain(ctx)
    sync_chain(ctx)
    second = RecordBatch.objects.exclude(pk=first.pk).get()
    assert second.state == "confirmed"
    trade.refresh_from_db()
    assert trade.state == "recorded"

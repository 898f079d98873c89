"""The demo's and the escrow API's deposit on a chain that does not mine each transaction
at once (any real chain; anvil with automine off and a block a second): the deposit must
not be estimated against an approval that is still pending ("allowance exceeded")."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

pytestmark = [pytest.mark.anvil, pytest.mark.postgres]


@pytest.fixture
def interval_mining(ctx: Any) -> Iterator[Any]:
    """The test's chain mines a block every second, not one per transaction."""
    ctx.client.rpc("evm_setAutomine", [False])
    ctx.client.rpc("evm_setIntervalMining", [1])
    try:
        yield ctx
    finally:
        ctx.client.rpc("evm_setIntervalMining", [0])
        ctx.client.rpc("evm_setAutomine", [True])


def test_demo_buyer_deposit_lands_when_blocks_come_once_a_second(interval_mining, make_user):
    from demo.chain import BUYER_DEPOSIT, demo_chain_setup
    from demo.market import BUYERS
    from ledger.custody import custodial_key_get_or_create

    ctx = interval_mining
    buyer = make_user(BUYERS[0][0])
    summary = demo_chain_setup(ctx)
    assert summary.startswith("1 demo buyers funded"), summary
    address = custodial_key_get_or_create(user=buyer).address
    assert ctx.client.view(ctx.market, "balance_of", address) == BUYER_DEPOSIT


def test_escrow_deposit_sends_both_transactions_before_the_approval_is_mined(interval_mining, make_user):
    """The API's deposit runs after its request commits: it must neither fail nor wait for a block."""
    import time

    from ledger.chain import Receipt
    from ledger.custody import custodial_key_get_or_create
    from ledger.services import escrow_deposit
    from tests.integration.helpers import TOKENS

    ctx = interval_mining
    buyer = make_user("buyer")
    address = custodial_key_get_or_create(user=buyer).address
    ctx.client.rpc("anvil_setBalance", [address, hex(10**20)])
    ctx.client.rpc("anvil_setBalance", [ctx.operator.address, hex(10**20)])
    mint = ctx.token.functions.mint(address, 500 * TOKENS)
    from ledger.outbox import tx_submit

    minted = tx_submit(client=ctx.client, signer=ctx.operator, key="mint:interval", purpose="mint", call=mint)
    assert ctx.client.wait(minted.tx_hash).succeeded
    started = time.monotonic()
    deposit = escrow_deposit(ctx=ctx, user=buyer, amount=500 * TOKENS, key="interval")
    assert time.monotonic() - started < 1.0, "escrow_deposit waited for a block"
    receipt: Receipt = ctx.client.wait(deposit.tx_hash, timeout_s=30)
    assert receipt.succeeded, receipt
    assert ctx.client.view(ctx.market, "balance_of", address) == 500 * TOKENS
    tx = ctx.client.w3.eth.get_transaction(deposit.tx_hash)
    print(f"deposit gas used {receipt.gas_used} of a limit of {tx['gas']}")
    assert receipt.gas_used < tx["gas"] * 0.8, "the deposit's gas limit leaves too little headroom"

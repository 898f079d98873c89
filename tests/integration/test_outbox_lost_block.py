"""A transaction confirmed in a block the chain then loses: the outbox sends it again with its
nonce, the operator's later transactions stop queueing behind the gap, and `ledger verify`
and `/readyz` name the gap until the chain has it again. On a real anvil: a reorg
(`anvil_reorg`), and a dev chain killed and restarted from an older state file."""

from __future__ import annotations

import io
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from tests.integration.helpers import (
    OPERATOR_KEY,
    chain_mined,
    cosigned_trade,
    settle_as_beat_does,
    settled_trade,
)
from tests.workers import free_port

pytestmark = pytest.mark.django_db


def verify() -> tuple[int, str]:
    """`gridbid ledger verify`: its exit code and what it printed."""
    from django.core.management import call_command

    out, err = io.StringIO(), io.StringIO()
    try:
        call_command("ledger_verify", stdout=out, stderr=err)
    except SystemExit as exc:
        return int(exc.code or 0), out.getvalue() + err.getvalue()
    return 0, out.getvalue() + err.getvalue()


def outbox_health() -> dict[str, Any]:
    from gridbid.health import readiness, readiness_cache_clear

    readiness_cache_clear()
    return readiness().parts["outbox"].as_dict()


def a_later_operator_transaction(ctx: Any) -> Any:
    """The operator's next transaction (a mint), sent without waiting for it to be mined."""
    from ledger.outbox import tx_submit

    return tx_submit(client=ctx.client, signer=ctx.operator, key="mint:after-the-loss", purpose="mint",
                     call=ctx.token.functions.mint(ctx.operator.address, 1))


def settled_again(trade: Any, *keys: str) -> Any:
    from ledger.models import ChainTx
    from market.models import Trade

    def done() -> bool:
        states = set(ChainTx.objects.filter(key__in=keys).values_list("state", flat=True))
        return Trade.objects.filter(pk=trade.pk, state="settled").exists() and states == {"confirmed"}

    return done


def assert_gap_named(ctx: Any, nonce: int) -> None:
    code, text = verify()
    assert code == 1, text
    assert f"nonce gap for {ctx.operator.address}" in text and f"nonce {nonce}" in text, text
    outbox = outbox_health()
    assert outbox["status"] == "failing" and f"nonce gap for {ctx.operator.address}" in outbox["detail"], outbox


def assert_settled_once(ctx: Any, trade: Any, provider: str) -> None:
    from ledger.models import JournalEntry

    code, text = verify()
    assert code == 0, text
    paid = trade.price * trade.gpus * 1800 // 3600
    assert ctx.client.view(ctx.market, "balance_of", provider) == paid
    assert JournalEntry.objects.filter(kind="pay", trade_id=trade.pk).count() == 1, "the settlement is journaled once"
    assert outbox_health()["status"] == "ok"


def test_a_settlement_confirmed_in_a_reorged_block_is_sent_again_and_the_chain_moves_on(
    ctx: Any, buyer: Any, provider_user: Any, make_offer: Any, make_bid: Any
) -> None:
    from ledger.models import ChainTx, SettleBatch

    trade, _, provider = settled_trade(ctx, buyer, provider_user, make_offer, make_bid)
    settle = ChainTx.objects.get(purpose="settle")
    assert settle.state == "confirmed"
    assert verify()[0] == 0

    # the settle's block is replaced by an empty one: the chain no longer has the transaction
    ctx.client.rpc("anvil_reorg", [ctx.client.block_number() - settle.block_number + 1, []])
    assert ctx.client.receipt(settle.tx_hash) is None
    later = a_later_operator_transaction(ctx)
    assert later.nonce == settle.nonce + 1
    chain_mined(ctx)
    assert ctx.client.receipt(later.tx_hash) is None, "the later transaction queues behind the lost nonce"
    assert_gap_named(ctx, settle.nonce)

    settle_as_beat_does(ctx, settled_again(trade, settle.key, later.key))
    again = ChainTx.objects.get(purpose="settle")
    assert again.tx_hash == settle.tx_hash and again.block_hash != settle.block_hash, "the same signed bytes, mined again"
    assert SettleBatch.objects.get().state == "confirmed"
    assert ctx.client.receipt(later.tx_hash) is not None
    assert_settled_once(ctx, trade, provider)


def test_a_lost_transaction_with_nothing_queued_behind_it_is_sent_again(ctx: Any) -> None:
    from ledger.models import ChainTx
    from ledger.outbox import tx_submit, txs_track

    tx = tx_submit(client=ctx.client, signer=ctx.operator, key="mint:lost-alone", purpose="mint",
                   call=ctx.token.functions.mint(ctx.operator.address, 3))
    chain_mined(ctx)
    txs_track(client=ctx.client, confirmations=1)
    tx.refresh_from_db()
    assert tx.state == "confirmed"
    ctx.client.rpc("anvil_reorg", [1, []])
    code, text = verify()
    assert code == 1 and f"the outbox holds nonces up to {tx.nonce} as mined" in text, text

    txs_track(client=ctx.client, confirmations=1)  # re-opens it and sends its bytes again
    chain_mined(ctx)
    txs_track(client=ctx.client, confirmations=1)
    again = ChainTx.objects.get(pk=tx.pk)
    assert again.state == "confirmed" and again.tx_hash == tx.tx_hash and again.block_hash != tx.block_hash
    assert ctx.client.view(ctx.token, "balanceOf", ctx.operator.address) == 3
    assert verify()[0] == 0


# --- a dev chain killed and restarted from an older state file ---------------------------------
@pytest.fixture
def chain_ctx(db: Any, tmp_path: Path) -> Iterator[dict[str, Any]]:
    """A chain context on an anvil of this test's own that keeps its state in a file (as the
    dev chain of `gridbid up` does), which the test may kill and start again."""
    from contracts.deploy import deploy_all
    from ledger.chain import ChainClient, signer_from_hex
    from ledger.chain.anvil import AnvilNotFound, find_anvil, start_anvil, stop_anvil
    from ledger.context import chain_context, chain_context_reset
    from ledger.models import Deployment

    try:
        find_anvil()
    except AnvilNotFound as exc:
        pytest.skip(str(exc))
    port, state = free_port(), tmp_path / "chain-state.json"
    chain = {"port": port, "state": state, "proc": start_anvil(port=port, state_file=state)}
    try:
        url = f"http://127.0.0.1:{port}"
        client = ChainClient(url)
        operator = signer_from_hex(OPERATOR_KEY).address
        addrs = deploy_all(client.w3, deployer=operator, operator=operator, arbiter=operator)
        Deployment.objects.create(chain_id=31337, rpc_url=url, market_address=addrs["market"], token_address=addrs["token"], deployed_block=1)
        chain_context_reset()
        context = chain_context()
        assert context is not None
        context.confirmations = 1
        chain["ctx"] = context
        yield chain
    finally:
        chain_context_reset()
        stop_anvil(chain["proc"])


def test_a_settlement_lost_with_a_chain_restarted_from_an_older_state_file_is_sent_again(
    chain_ctx: dict[str, Any], buyer: Any, provider_user: Any, make_offer: Any, make_bid: Any
) -> None:
    from ledger.chain.anvil import start_anvil, stop_anvil
    from ledger.listener import events_sync
    from ledger.models import ChainTx, SettleBatch
    from market.models import Trade

    ctx = chain_ctx["ctx"]
    trade, _ = cosigned_trade(ctx, buyer, provider_user, make_offer, make_bid)

    # the dev chain is stopped (it writes its state file) and started again before settling
    stop_anvil(chain_ctx["proc"])
    chain_ctx["proc"] = start_anvil(port=chain_ctx["port"], state_file=chain_ctx["state"])
    settle_as_beat_does(ctx, lambda: Trade.objects.filter(pk=trade.pk, state="settled").exists())
    settle = ChainTx.objects.get(purpose="settle")
    assert settle.state == "confirmed" and verify()[0] == 0

    # the whole process group is killed (no state written at exit): the chain comes back from
    # the state file of its last clean stop, from before the settlement
    chain_ctx["proc"].kill()
    chain_ctx["proc"].wait(timeout=10)
    chain_ctx["proc"] = start_anvil(port=chain_ctx["port"], state_file=chain_ctx["state"])
    assert ctx.client.block_number() < settle.block_number and ctx.client.receipt(settle.tx_hash) is None
    later = a_later_operator_transaction(ctx)
    chain_mined(ctx)
    assert ctx.client.receipt(later.tx_hash) is None, "the later transaction queues behind the lost nonce"
    # the listener rolls its journal back to the chain; the outbox's gap is what is left
    assert events_sync(ctx=ctx).rolled_back_to is not None
    assert Trade.objects.get(pk=trade.pk).state == "recorded"
    assert_gap_named(ctx, settle.nonce)

    settle_as_beat_does(ctx, settled_again(trade, settle.key, later.key))
    assert SettleBatch.objects.get().state == "confirmed"
    assert_settled_once(ctx, trade, provider_user.provider.chain_address)


# --- what verify and readiness say ----------------------------------------------------------
def test_verify_names_a_transaction_open_too_long_as_a_stuck_outbox(ctx: Any) -> None:
    from ledger.models import ChainTx

    mined = ctx.client.pending_nonce(ctx.operator.address)
    ChainTx.objects.create(purpose="record", key="record:stuck", chain_id=31337, sender=ctx.operator.address, nonce=mined,
                           tx_hash="0x" + "03" * 32, raw="0x00", state="sent", signed_at=timezone.now() - timedelta(hours=1))
    code, text = verify()
    assert code == 1, text
    assert "stuck outbox: 1 transaction(s) open for over 900 s" in text and "record:stuck" in text, text


def test_a_lost_nonce_whose_signed_bytes_are_not_stored_is_named_as_one_that_cannot_be_sent_again(ctx: Any) -> None:
    from ledger.models import ChainTx
    from ledger.outbox import outbox_problems

    mined = ctx.client.pending_nonce(ctx.operator.address)
    # the outbox believes nonce `mined` confirmed in a block the chain does not have, and keeps no bytes for it
    ChainTx.objects.create(purpose="record", key="record:bytes-lost", chain_id=31337, sender=ctx.operator.address, nonce=mined,
                           tx_hash="0x" + "04" * 32, raw="", state="confirmed", block_number=10**6, block_hash="0x" + "05" * 32,
                           signed_at=timezone.now())
    problems = outbox_problems(client=ctx.client, senders=(ctx.operator.address,))
    assert any(f"nonce gap for {ctx.operator.address}: the chain expects nonce {mined}" in p
               and f"nonce {mined} (record:bytes-lost): its signed bytes are not stored" in p for p in problems), problems


def test_a_loss_deeper_than_the_reorg_horizon_is_found_by_the_transaction_queued_behind_it(ctx: Any) -> None:
    from ledger.models import ChainTx
    from ledger.outbox import tx_submit, txs_track

    lost = tx_submit(client=ctx.client, signer=ctx.operator, key="mint:lost-deep", purpose="mint",
                     call=ctx.token.functions.mint(ctx.operator.address, 4))
    chain_mined(ctx)
    txs_track(client=ctx.client, confirmations=1)
    ctx.client.rpc("anvil_mine", [hex(3)])
    ctx.client.rpc("anvil_reorg", [4, []])  # its block and the three above it: four blocks back
    later = a_later_operator_transaction(ctx)
    chain_mined(ctx)
    assert ctx.client.receipt(later.tx_hash) is None

    # a horizon of one block: only the nonce the chain expects shows the loss
    txs_track(client=ctx.client, confirmations=1, horizon=1)
    chain_mined(ctx)
    txs_track(client=ctx.client, confirmations=1, horizon=1)
    assert set(ChainTx.objects.filter(pk__in=[lost.pk, later.pk]).values_list("state", flat=True)) == {"confirmed"}
    assert ctx.client.view(ctx.token, "balanceOf", ctx.operator.address) == 4 + 1

"""The ledger against a real anvil: nonces, the outbox across a crash, record -> settle
through the Celery tasks, the listener across a reorg, and the journal's verify."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.conftest import escrow_credit
from tests.integration.helpers import (
    PROVIDER_KEYS,
    TOKENS,
    agents_cosign,
    chain_mined,
    finish_with_receipt,
    fund_buyer,
    mint,
    register_provider,
    settled_trade,
    sync_chain,
)

pytestmark = pytest.mark.django_db

# --- nonces and the outbox ------------------------------------------------------------------
def test_a_tick_after_chain_mined_sees_every_transaction_sent_just_before_it(ctx: Any) -> None:
    # anvil answers a send as the transaction enters its pool and mines it on another task;
    # a test's sync on the next line read a head without it (tests/FLAKES.md)
    sender = ctx.client.w3.eth.accounts[0]
    hashes = [ctx.client.rpc("eth_sendTransaction", [{"from": sender, "to": sender, "value": "0x1"}]) for _ in range(20)]
    chain_mined(ctx)
    receipts = [ctx.client.receipt(h) for h in hashes]
    assert None not in receipts
    assert ctx.client.block_number() >= max(r.block_number for r in receipts if r is not None)


def test_the_nonce_manager_resumes_from_the_chain_when_its_cursor_is_behind(ctx: Any) -> None:
    from django.db import transaction

    from ledger.models import NonceCursor
    from ledger.outbox import NonceManager

    mint(ctx, ctx.operator.address, 1)  # the operator has sent transactions (the deploys, this mint)
    pending = ctx.client.pending_nonce(ctx.operator.address)
    NonceCursor.objects.filter(address=ctx.operator.address).update(next_nonce=0)  # a restored, older database
    with transaction.atomic():
        nonce = NonceManager(chain_id=31337, address=ctx.operator.address).reserve(chain_pending=pending)
    assert nonce == pending
    with transaction.atomic():
        again = NonceManager(chain_id=31337, address=ctx.operator.address).reserve(chain_pending=pending)
    assert again == pending + 1, "a reserved but unsent nonce is never handed out twice"


def test_a_crash_between_send_and_receipt_rebroadcasts_the_same_transaction(ctx: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from ledger.chain import ChainClient
    from ledger.models import ChainTx
    from ledger.outbox import tx_submit, txs_track

    client = ctx.client
    client.rpc("evm_setAutomine", [False])
    before = client.pending_nonce(ctx.operator.address)
    real_broadcast = ChainClient.broadcast

    def broadcast_then_die(self: ChainClient, signed: Any) -> str:
        real_broadcast(self, signed)
        raise SystemExit("worker killed after broadcast")

    monkeypatch.setattr(ChainClient, "broadcast", broadcast_then_die)
    with pytest.raises(SystemExit):
        tx_submit(client=client, signer=ctx.operator, key="mint:crash", purpose="mint", call=ctx.token.functions.mint(ctx.operator.address, 5))
    monkeypatch.setattr(ChainClient, "broadcast", real_broadcast)
    stored = ChainTx.objects.get(key="mint:crash")
    assert stored.state == "signed", "the signed bytes were stored before the broadcast"

    # the worker restarts: a fresh client, the same task delivered again
    fresh = ChainClient(ctx.client.rpc_url, expected_chain_id=31337)
    again = tx_submit(client=fresh, signer=ctx.operator, key="mint:crash", purpose="mint", call=ctx.token.functions.mint(ctx.operator.address, 5))
    assert again.tx_hash == stored.tx_hash
    assert fresh.pending_nonce(ctx.operator.address) == before + 1, "one transaction in the pool, not two"
    client.rpc("evm_mine")
    client.rpc("evm_setAutomine", [True])
    txs_track(client=fresh, confirmations=1)
    assert ChainTx.objects.get(key="mint:crash").state == "confirmed"
    assert ChainTx.objects.filter(purpose="mint", key__startswith="mint:crash").count() == 1
    assert fresh.view(ctx.token, "balanceOf", ctx.operator.address) == 5


def test_a_transaction_signed_but_never_broadcast_is_sent_by_the_tracker(ctx: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from ledger.chain import ChainClient
    from ledger.models import ChainTx
    from ledger.outbox import tx_submit, txs_track

    def die(self: ChainClient, signed: Any) -> str:
        raise SystemExit("worker killed before broadcast")

    monkeypatch.setattr(ChainClient, "broadcast", die)
    with pytest.raises(SystemExit):
        tx_submit(client=ctx.client, signer=ctx.operator, key="mint:lost", purpose="mint", call=ctx.token.functions.mint(ctx.operator.address, 7))
    monkeypatch.undo()
    assert ctx.client.receipt(ChainTx.objects.get(key="mint:lost").tx_hash) is None
    txs_track(client=ctx.client, confirmations=1)  # broadcasts the stored bytes
    chain_mined(ctx)
    txs_track(client=ctx.client, confirmations=1)  # sees the receipt
    assert ChainTx.objects.get(key="mint:lost").state == "confirmed"


# --- the whole path ---------------------------------------------------------------------------
def test_trades_are_recorded_settled_and_paid_through_the_celery_tasks(ctx: Any, buyer: Any, provider_user: Any, make_offer: Any, make_bid: Any) -> None:
    from django.core.management import call_command

    from ledger import tasks
    from ledger.journal import account_balances, journal_verify
    from ledger.models import RecordBatch, SettleBatch
    from market.models import Trade
    from market.rounds import round_clear

    bls_key = register_provider(ctx, provider_user)
    buyer_address = fund_buyer(ctx, buyer, 1000 * TOKENS)
    make_offer(provider_user, price=2 * TOKENS, count=8)
    make_bid(buyer, gpus=4, max_price=3 * TOKENS, duration_s=3600)
    round_clear()
    trade = Trade.objects.get()
    lock = trade.price * trade.gpus * trade.duration_s // 3600

    tasks.trades_record.delay()
    tasks.trades_record.delay()  # a duplicate delivery sends nothing more
    assert RecordBatch.objects.count() == 1
    sync_chain(ctx)
    trade.refresh_from_db()
    assert trade.state == "recorded"
    assert ctx.client.view(ctx.market, "balance_of", buyer_address) == 1000 * TOKENS - lock

    used = trade.gpus * 1800  # half the time bought
    r = finish_with_receipt(trade, bls_key, used)
    tasks.batches_settle.delay()
    batch = SettleBatch.objects.get()
    assert batch.state == "collecting"
    agents_cosign(batch, {provider_user.provider.chain_address: bls_key}, {trade.pk: r})
    tasks.batches_settle.delay()
    tasks.batches_settle.delay()
    sync_chain(ctx)
    trade.refresh_from_db()
    assert trade.state == "settled"
    paid = trade.price * used // 3600
    provider = provider_user.provider.chain_address
    assert ctx.client.view(ctx.market, "balance_of", provider) == paid
    assert ctx.client.view(ctx.market, "balance_of", buyer_address) == 1000 * TOKENS - paid
    balances = account_balances()
    assert balances[f"free:{provider}"] == paid
    assert balances[f"free:{buyer_address}"] == 1000 * TOKENS - paid
    assert balances.get(f"locked:{buyer_address}", 0) == 0
    assert journal_verify(ctx=ctx) == []
    call_command("ledger_verify")  # exits 0 (raises SystemExit otherwise)


# --- the listener and reorgs ------------------------------------------------------------------
def test_the_listener_rolls_back_a_reorged_deposit_and_applies_it_again_when_it_is_remined(ctx: Any, buyer: Any) -> None:
    from ledger.journal import account_balances, chain_check
    from ledger.listener import events_sync
    from ledger.models import ChainEvent, ChainTx, JournalEntry
    from ledger.outbox import txs_track

    address = fund_buyer(ctx, buyer, 50 * TOKENS, journal=False)
    result = events_sync(ctx=ctx, confirmations=0)
    assert result.rolled_back_to is None
    assert account_balances()[f"free:{address}"] == 50 * TOKENS
    deposit = ChainEvent.objects.get(name="Deposited")
    old_block_hash = deposit.block_hash

    # replace the approve and deposit blocks with three empty ones
    ctx.client.rpc("anvil_reorg", [2, []])
    ctx.client.rpc("anvil_mine", [hex(1)])
    assert ctx.client.view(ctx.market, "balance_of", address) == 0
    result = events_sync(ctx=ctx, confirmations=0)
    assert result.rolled_back_to is not None and result.rolled_back_to < deposit.block_number
    assert not ChainEvent.objects.filter(name="Deposited").exists()
    assert account_balances().get(f"free:{address}", 0) == 0, "the dropped deposit is rolled back"
    assert chain_check() == []

    # the outbox sends the same signed approve and deposit again; the new chain has them
    txs_track(client=ctx.client, confirmations=1)  # broadcasts them again
    chain_mined(ctx)
    txs_track(client=ctx.client, confirmations=1)  # sees the receipts
    assert set(ChainTx.objects.filter(purpose__in=["approve", "deposit"]).values_list("state", flat=True)) == {"confirmed"}
    events_sync(ctx=ctx, confirmations=0)
    again = ChainEvent.objects.get(name="Deposited")
    assert again.block_hash != old_block_hash and again.tx_hash == deposit.tx_hash
    assert account_balances()[f"free:{address}"] == 50 * TOKENS
    assert JournalEntry.objects.filter(kind="deposit").count() == 1
    assert chain_check() == []


def test_unconfirmed_events_are_not_journaled(ctx: Any, buyer: Any) -> None:
    from ledger.listener import events_sync
    from ledger.models import JournalEntry

    fund_buyer(ctx, buyer, 5 * TOKENS, journal=False)
    events_sync(ctx=ctx, confirmations=3)
    assert not JournalEntry.objects.filter(kind="deposit").exists()
    ctx.client.rpc("anvil_mine", [hex(2)])
    events_sync(ctx=ctx, confirmations=3)
    assert JournalEntry.objects.filter(kind="deposit").count() == 1


# --- verify ---------------------------------------------------------------------------------
def test_verify_exits_non_zero_on_an_edited_entry_or_a_balance_the_chain_disagrees_with(ctx: Any, buyer: Any) -> None:
    from django.core.management import call_command

    from ledger.listener import events_sync
    from ledger.models import JournalEntry

    address = fund_buyer(ctx, buyer, 9 * TOKENS)
    events_sync(ctx=ctx, confirmations=0)
    call_command("ledger_verify")

    JournalEntry.objects.filter(kind="deposit").update(amount=8 * TOKENS)
    with pytest.raises(SystemExit) as exit_info:
        call_command("ledger_verify")
    assert exit_info.value.code == 1
    from ledger.journal import journal_verify

    problems = journal_verify(ctx=ctx)
    assert any("hash does not match" in p for p in problems)
    assert any(f"free balance of {address}" in p for p in problems)


# --- the demo's chain side (gridbid up --demo) ----------------------------------------------
@pytest.mark.anvil
def test_the_demo_market_records_and_settles_its_trades_on_the_dev_chain(ctx: Any) -> None:
    """What `gridbid up --demo` does on its dev chain: buyers funded, providers registered
    with a stake and a proven BLS key, rounds' trades recorded, the simulated agents sign
    receipts and co-sign, batches settle, and the journal matches the chain."""
    from datetime import timedelta

    from django.utils import timezone

    from demo.chain import demo_agents_act, demo_chain_setup
    from demo.market import BUYERS, PROVIDERS, demo_load, demo_tick
    from ledger import tasks
    from ledger.journal import journal_verify
    from market.models import Bid, Trade
    from market.rounds import round_clear
    from providers.models import Provider

    demo_load()
    assert demo_chain_setup(ctx) == f"{len(BUYERS)} demo buyers funded, {len(PROVIDERS)} demo providers registered on chain"
    assert demo_chain_setup(ctx).startswith("0 demo buyers funded, 0 demo providers"), "a second start changes nothing"
    assert not Provider.objects.filter(chain_address="").exists()

    sync_chain(ctx)  # the buyers' deposits in the journal: the demo's buyers bid from escrow, like anyone
    assert Bid.objects.count() == 0, "no bid before its buyer has escrow"
    demo_tick(seed=1)
    round_clear()
    assert Trade.objects.exists(), "the demo's bids match some of its offers"
    tasks.trades_record.delay()
    sync_chain(ctx)
    recorded = list(Trade.objects.filter(state="recorded"))
    assert recorded, "the demo's trades are recorded on chain"

    Trade.objects.update(created_at=timezone.now() - timedelta(days=2))  # their booked time is over
    assert demo_tick(seed=1)["finished"] == len(Trade.objects.all())
    assert demo_agents_act(ctx)["receipts"] == len(recorded)
    tasks.batches_settle.delay()
    assert demo_agents_act(ctx)["cosigned"] >= 1
    tasks.batches_settle.delay()
    sync_chain(ctx)
    assert set(Trade.objects.filter(pk__in=[t.pk for t in recorded]).values_list("state", flat=True)) == {"settled"}
    assert journal_verify(ctx=ctx) == []


def test_the_demo_refuses_any_chain_but_the_dev_chain() -> None:
    from types import SimpleNamespace

    from demo.chain import DemoChainError, demo_agents_act, demo_chain_setup

    mainnet = SimpleNamespace(chain_id=1)
    for act in (demo_chain_setup, demo_agents_act):
        with pytest.raises(DemoChainError, match="only acts on the dev chain"):
            act(mainnet)  # type: ignore[arg-type]


@pytest.mark.anvil
def test_a_buyer_without_escrow_waits_and_does_not_hold_up_the_batch(ctx: Any, buyer: Any, stranger: Any, provider_user: Any, make_offer: Any, make_bid: Any) -> None:
    from ledger import tasks
    from ledger.models import RecordBatch
    from market.models import Trade
    from market.rounds import round_clear

    register_provider(ctx, provider_user)
    fund_buyer(ctx, buyer, 1000 * TOKENS)
    make_offer(provider_user, price=2 * TOKENS, count=8)
    make_bid(buyer, gpus=2, max_price=3 * TOKENS, duration_s=3600)
    # the journal says the stranger's escrow covers its bid, but the chain holds nothing (as after
    # a deposit the chain later lost): its trade is not sent, which the contract would revert
    escrow_credit(stranger, 6 * TOKENS)
    make_bid(stranger, gpus=2, max_price=3 * TOKENS, duration_s=3600)
    round_clear()
    assert Trade.objects.count() == 2
    tasks.trades_record.delay()
    sync_chain(ctx)
    assert dict(Trade.objects.values_list("buyer__username", "state")) == {buyer.username: "recorded", stranger.username: "pending"}
    assert not RecordBatch.objects.filter(state="failed").exists(), "nothing was sent that the contract would revert"
    tasks.trades_record.delay()
    assert RecordBatch.objects.count() == 1, "the unfunded bid keeps waiting without a batch"

    fund_buyer(ctx, stranger, 1000 * TOKENS)
    tasks.trades_record.delay()
    sync_chain(ctx)
    assert set(Trade.objects.values_list("state", flat=True)) == {"recorded"}


# --- wallet (non-custodial) buyers --------------------------------------------------------------
WALLET_KEY = "0x47e179ec197488593b187f80a00eb0da91f1b9d0b13f8733639f19c30a34926a"  # anvil account 5


def _link_wallet(client: Any, key: str = WALLET_KEY) -> str:
    from eth_account import Account
    from eth_account.messages import encode_defunct

    account = Account.from_key(key)
    message = client.post("/api/v1/me/wallet/challenge/", format="json").json()["message"]
    signature = account.sign_message(encode_defunct(text=message)).signature.hex()
    r = client.post("/api/v1/me/wallet/", {"address": account.address, "message": message, "signature": signature}, format="json")
    assert r.status_code == 200, r.json()
    return str(account.address)


@pytest.mark.anvil
def test_a_wallet_buyers_trade_is_recorded_only_with_its_wallets_signature(ctx: Any, buyer: Any, provider_user: Any, make_offer: Any, make_bid: Any, client_for: Any) -> None:
    from eth_account import Account

    from ledger import tasks
    from ledger.chain import signer_from_hex
    from ledger.outbox import tx_submit
    from market.models import Trade
    from market.rounds import round_clear

    client = client_for(buyer)
    address = _link_wallet(client)
    wallet = signer_from_hex(WALLET_KEY)
    mint(ctx, address, 1000 * TOKENS)
    approve = tx_submit(client=ctx.client, signer=wallet, key="w-approve", purpose="approve", call=ctx.token.functions.approve(ctx.deployment.market_address, 1000 * TOKENS))
    # the deposit's gas estimate runs against the chain as it is: the approve must be mined first
    assert ctx.client.wait(approve.tx_hash).succeeded
    tx = tx_submit(client=ctx.client, signer=wallet, key="w-deposit", purpose="deposit", call=ctx.market.functions.deposit(1000 * TOKENS))
    assert ctx.client.wait(tx.tx_hash).succeeded
    sync_chain(ctx)
    register_provider(ctx, provider_user)
    make_offer(provider_user, price=2 * TOKENS, count=8)
    bid = make_bid(buyer, gpus=2, max_price=3 * TOKENS, duration_s=3600)
    round_clear()
    tasks.trades_record.delay()
    assert Trade.objects.get().state == "pending", "no order is recorded without the wallet's signature"

    order = client.get(f"/api/v1/bids/{bid.pk}/order/").json()
    assert order["signed"] is False and order["typed_data"]["message"]["buyer"] == address
    assert client.get(f"/api/v1/bids/{bid.pk}/order/").json() == order, "the same order every time"
    other = Account.create().sign_typed_data(full_message=order["typed_data"]).signature.hex()
    r = client.post(f"/api/v1/bids/{bid.pk}/order/sign/", {"signature": other}, format="json")
    assert r.status_code == 400 and "linked wallet" in r.json()["error"]["message"]
    r = client.post(f"/api/v1/bids/{bid.pk}/order/sign/", {"signature": "0x1234"}, format="json")
    assert r.status_code == 400 and r.json()["error"]["fields"]["signature"]
    signature = Account.from_key(WALLET_KEY).sign_typed_data(full_message=order["typed_data"]).signature.hex()
    r = client.post(f"/api/v1/bids/{bid.pk}/order/sign/", {"signature": signature}, format="json")
    assert r.status_code == 200 and r.json()["signed"] is True

    tasks.trades_record.delay()
    sync_chain(ctx)
    trade = Trade.objects.get()
    assert trade.state == "recorded"
    lock = trade.price * trade.gpus * trade.duration_s // 3600
    assert ctx.client.view(ctx.market, "balance_of", address) == 1000 * TOKENS - lock


def test_wallet_linking_refuses_bad_challenges_and_custodial_accounts(buyer: Any, stranger: Any, client_for: Any) -> None:
    from eth_account import Account
    from eth_account.messages import encode_defunct

    from ledger.custody import custodial_key_get_or_create

    account = Account.from_key(WALLET_KEY)
    theirs = client_for(stranger).post("/api/v1/me/wallet/challenge/", format="json").json()["message"]
    sig = account.sign_message(encode_defunct(text=theirs)).signature.hex()
    r = client_for(buyer).post("/api/v1/me/wallet/", {"address": account.address, "message": theirs, "signature": sig}, format="json")
    assert r.status_code == 400 and "another account" in r.json()["error"]["message"]
    mine = client_for(buyer).post("/api/v1/me/wallet/challenge/", format="json").json()["message"]
    forged = Account.create().sign_message(encode_defunct(text=mine)).signature.hex()
    r = client_for(buyer).post("/api/v1/me/wallet/", {"address": account.address, "message": mine, "signature": forged}, format="json")
    assert r.status_code == 400 and r.json()["error"]["fields"]["signature"]
    r = client_for(buyer).post("/api/v1/me/wallet/", {"address": "0xnot", "message": mine, "signature": forged}, format="json")
    assert r.status_code == 400 and r.json()["error"]["fields"]["address"]
    custodial_key_get_or_create(user=buyer)
    ok = account.sign_message(encode_defunct(text=mine)).signature.hex()
    r = client_for(buyer).post("/api/v1/me/wallet/", {"address": account.address, "message": mine, "signature": ok}, format="json")
    assert r.status_code == 409 and "custodial" in r.json()["error"]["message"]


@pytest.mark.anvil
def test_trades_of_a_provider_not_registered_on_chain_wait_without_holding_up_the_batch(ctx: Any, buyer: Any, provider_user: Any, other_provider_user: Any, make_offer: Any, make_bid: Any) -> None:
    from ledger import tasks
    from ledger.models import RecordBatch
    from market.models import Trade
    from market.rounds import round_clear

    register_provider(ctx, provider_user)
    unstaked = other_provider_user.provider
    unstaked.chain_address = "0x14dC79964da2C08b23698B3D3cc7Ca32193d9955"  # proved an address, never staked
    unstaked.save()
    fund_buyer(ctx, buyer, 1000 * TOKENS)
    make_offer(provider_user, price=2 * TOKENS, count=2)
    make_offer(other_provider_user, price=2 * TOKENS, count=2)
    make_bid(buyer, gpus=2, max_price=3 * TOKENS, duration_s=3600)
    make_bid(buyer, gpus=2, max_price=3 * TOKENS, duration_s=3600)
    round_clear()
    assert Trade.objects.count() == 2
    tasks.trades_record.delay()
    sync_chain(ctx)
    assert dict(Trade.objects.values_list("provider__user__username", "state")) == {provider_user.username: "recorded", other_provider_user.username: "pending"}
    assert not RecordBatch.objects.filter(state="failed").exists()


@pytest.mark.anvil
def test_the_periodic_reconciliation_reports_to_the_operator_page(ctx: Any, buyer: Any, make_user: Any) -> None:
    from django.test import Client

    from ledger import tasks
    from ledger.journal import reconciliation_status
    from ledger.models import JournalEntry

    fund_buyer(ctx, buyer, 10 * TOKENS)
    sync_chain(ctx)
    assert tasks.ledger_reconcile.delay().get() is True
    status = reconciliation_status()
    assert status is not None and status["ok"] and status["entries"] == JournalEntry.objects.count() > 0
    operator = make_user("op", role="operator")
    page = Client()
    page.force_login(operator)
    html = page.get("/operator/").content.decode()
    assert "matches the chain" in html and f"{status['entries']} journal entries" in html

    JournalEntry.objects.filter(pk=JournalEntry.objects.order_by("seq").first().pk).update(amount=1)  # tampered
    assert tasks.ledger_reconcile.delay().get() is False
    assert "differs from the chain" in page.get("/operator/").content.decode()


@pytest.mark.anvil
def test_a_stuck_transaction_is_replaced_with_higher_fees_and_the_nonce_is_used_once(ctx: Any) -> None:
    client = ctx.client
    base = int(client.rpc("eth_getBlockByNumber", ["latest", False])["baseFeePerGas"], 16)
    try:
        _stuck_then_replaced(ctx, client)
    finally:
        # anvil does not roll its next base fee back with a snapshot: put it back for the next test
        client.rpc("anvil_setNextBlockBaseFeePerGas", [hex(base)])
        client.rpc("evm_setAutomine", [True])


def _stuck_then_replaced(ctx: Any, client: Any) -> None:
    from ledger.models import ChainTx
    from ledger.outbox import signers_of, tx_submit, txs_track

    client.rpc("evm_setAutomine", [False])
    before = client.pending_nonce(ctx.operator.address)
    tx = tx_submit(client=client, signer=ctx.operator, key="mint:stuck", purpose="mint", call=ctx.token.functions.mint(ctx.operator.address, 7))
    first = tx.tx_hash
    offered = client.fees_of(tx.raw).max_fee_per_gas
    # the base fee jumps past what it offered: it can no longer be mined
    client.rpc("anvil_setNextBlockBaseFeePerGas", [hex(offered * 4)])
    client.rpc("evm_mine")
    assert client.receipt(first) is None

    txs_track(client=client, confirmations=1, signer_for=signers_of(ctx.operator), bump_after_s=3600)
    assert ChainTx.objects.get(key="mint:stuck").tx_hash == first, "not stuck long enough: only rebroadcast"
    txs_track(client=client, confirmations=1, signer_for=signers_of(ctx.operator), bump_after_s=0)
    row = ChainTx.objects.get(key="mint:stuck")
    assert row.tx_hash != first and row.replaced == [first] and row.fee_bumps == 1 and row.nonce == tx.nonce
    assert client.fees_of(row.raw).max_fee_per_gas > offered * 4

    client.rpc("evm_mine")
    client.rpc("evm_setAutomine", [True])
    mint(ctx, ctx.operator.address, 1)  # one more block buries it
    txs_track(client=client, confirmations=1, signer_for=signers_of(ctx.operator), bump_after_s=3600)
    row.refresh_from_db()
    assert row.state == "confirmed" and client.receipt(first) is None
    assert client.pending_nonce(ctx.operator.address) == before + 2, "the replacement took the nonce; only the next mint followed"
    assert client.view(ctx.token, "balanceOf", ctx.operator.address) == 8


@pytest.mark.anvil
def test_a_deposit_reaches_the_buyers_balances_channel_once_confirmed(ctx: Any, buyer: Any, stranger: Any, django_capture_on_commit_callbacks: Any) -> None:
    from market.streams.hub import hub
    from market.streams.publish import group_name
    from market.streams.snapshots import snapshot

    class Socket:  # what the hub takes an update to: a socket's outbox
        def __init__(self) -> None:
            self.texts: list[str] = []

        def push(self, text: str) -> None:
            self.texts.append(text)

        def feed_lost(self, message: str) -> None:
            raise AssertionError(message)

    assert snapshot("balances", buyer)["balances"]["free"] == 0
    mine, theirs = Socket(), Socket()
    groups = {group_name("balances", buyer.pk): mine, group_name("balances", stranger.pk): theirs}
    for group, socket in groups.items():
        hub().add(group, socket)
    try:
        with django_capture_on_commit_callbacks(execute=True):
            address = fund_buyer(ctx, buyer, 25 * TOKENS)
            sync_chain(ctx)
    finally:
        for group, socket in groups.items():
            hub().leave(group, socket)
    assert len(mine.texts) == 1 and theirs.texts == []
    message = json.loads(mine.texts[0])  # the socket's frame, encoded once for all
    assert message["channel"] == "balances"
    got = message["data"]["balances"]
    assert (got["address"], got["free"], got["locked"], got["custodial"]) == (address, 25 * TOKENS, 0, True)


@pytest.mark.anvil
def test_a_provider_whose_stake_could_leave_before_disputes_close_is_not_settled(ctx: Any, buyer: Any, provider_user: Any, make_offer: Any, make_bid: Any) -> None:
    from ledger import tasks
    from ledger.chain import signer_from_hex
    from ledger.models import SettleBatch
    from ledger.outbox import tx_submit
    from market.models import Trade
    from market.rounds import round_clear

    bls_key = register_provider(ctx, provider_user)
    fund_buyer(ctx, buyer, 1000 * TOKENS)
    make_offer(provider_user, price=2 * TOKENS, count=8)
    make_bid(buyer, gpus=2, max_price=3 * TOKENS, duration_s=3600)
    round_clear()
    tasks.trades_record.delay()
    sync_chain(ctx)
    trade = Trade.objects.get()
    assert trade.state == "recorded"
    provider = signer_from_hex(PROVIDER_KEYS[0])
    tx = tx_submit(client=ctx.client, signer=provider, key="exit-request", purpose="exit", call=ctx.market.functions.request_exit())
    assert ctx.client.wait(tx.tx_hash).succeeded
    sync_chain(ctx)  # the listener has seen the exit request
    exit_at = int(ctx.market.functions.providers(provider.address).call()[0])
    window = int(ctx.market.functions.dispute_window().call())
    finish_with_receipt(trade, bls_key, trade.gpus * 600)
    ctx.client.rpc("evm_setNextBlockTimestamp", [exit_at - window - 3600])
    ctx.client.rpc("evm_mine")
    from ledger.services import _exits_before_disputes_close

    assert _exits_before_disputes_close(ctx, provider.address, {}) is False, "a day and an hour before: still safe to settle"
    ctx.client.rpc("evm_setNextBlockTimestamp", [exit_at - window + 60])
    ctx.client.rpc("evm_mine")
    tasks.batches_settle.delay()
    assert not SettleBatch.objects.exists(), "its stake could leave before the buyer's dispute window closes"


# --- disputes ---------------------------------------------------------------------------------
@pytest.mark.anvil
def test_a_buyer_disputes_through_the_api_and_the_arbiter_refunds_and_slashes(
    ctx: Any, buyer: Any, provider_user: Any, operator: Any, stranger: Any, make_offer: Any, make_bid: Any,
    client_for: Any, django_capture_on_commit_callbacks: Any,
) -> None:
    from ledger.journal import account_balances, journal_verify

    trade, buyer_address, provider = settled_trade(ctx, buyer, provider_user, make_offer, make_bid)
    paid = trade.price * trade.gpus * 1800 // 3600
    url = f"/api/v1/ledger/trades/{trade.pk}/dispute/"
    assert client_for(stranger).post(url).status_code == 404
    assert client_for(provider_user).post(url).status_code == 409  # only its buyer disputes
    with django_capture_on_commit_callbacks(execute=True):
        r = client_for(buyer).post(url, HTTP_IDEMPOTENCY_KEY="d1")
    assert r.status_code == 202, r.content
    assert r.json()["window_left_s"] > 0 and r.json()["transactions"][0]["key"] == f"dispute:api:{buyer.pk}:d1"
    sync_chain(ctx)
    sync_chain(ctx)
    trade.refresh_from_db()
    assert trade.state == "disputed"
    assert ctx.client.view(ctx.market, "total_held") == paid
    assert account_balances()[f"held:{trade.pk}"] == paid
    assert journal_verify(ctx=ctx) == []
    again = client_for(buyer).post(url)
    assert again.status_code == 409 and "disputed" in again.json()["error"]["message"]
    from market.models import AuditEvent

    (disputed,) = AuditEvent.objects.filter(action="trade.dispute")  # the refused tries left none
    assert (disputed.actor_id, disputed.address, disputed.object_type, disputed.object_id) == (buyer.pk, "127.0.0.1", "trade", str(trade.pk))

    ruling = f"/api/v1/ledger/trades/{trade.pk}/ruling/"
    assert client_for(buyer).post(ruling, {"pay_provider": False, "slash": 5}, format="json").status_code == 403
    bad = client_for(operator).post(ruling, {"pay_provider": True, "slash": 5}, format="json")
    assert bad.status_code == 400 and "slash" in bad.json()["error"]["fields"]
    # the contract bounds a slash by 2x what the trade paid (issue 17): the API says so first
    over = client_for(operator).post(ruling, {"pay_provider": False, "slash": 2 * paid + 1}, format="json")
    assert over.status_code == 400 and f"At most {2 * paid} base units" in over.json()["error"]["fields"]["slash"][0]
    with django_capture_on_commit_callbacks(execute=True):
        r = client_for(operator).post(ruling, {"pay_provider": False, "slash": 5 * TOKENS}, format="json")
    assert r.status_code == 202, r.content
    (ruled,) = AuditEvent.objects.filter(action="trade.ruling")
    assert (ruled.actor_id, ruled.object_id, ruled.details["pay_provider"], ruled.details["slash"]) == (operator.pk, str(trade.pk), False, 5 * TOKENS)
    sync_chain(ctx)
    sync_chain(ctx)
    trade.refresh_from_db()
    assert trade.state == "refunded"
    balances = account_balances()
    lock = trade.price * trade.gpus * trade.duration_s // 3600
    assert balances[f"free:{buyer_address}"] == 1000 * TOKENS - lock + (lock - paid) + paid + 5 * TOKENS
    assert balances[f"stake:{provider}"] == 95 * TOKENS
    state, stake, _ = ctx.client.view(ctx.market, "providers", provider)
    assert (state, stake) == (2, 95 * TOKENS), "slashed below the minimum: suspended"
    assert journal_verify(ctx=ctx) == []


@pytest.mark.anvil
def test_a_ruling_for_the_provider_puts_back_what_was_held_from_its_stake(
    ctx: Any, buyer: Any, provider_user: Any, operator: Any, make_offer: Any, make_bid: Any,
    client_for: Any, django_capture_on_commit_callbacks: Any,
) -> None:
    from ledger.chain import signer_from_hex
    from ledger.journal import account_balances, journal_verify
    from ledger.outbox import tx_submit

    trade, _, provider = settled_trade(ctx, buyer, provider_user, make_offer, make_bid)
    paid = trade.price * trade.gpus * 1800 // 3600
    account = signer_from_hex(PROVIDER_KEYS[0])
    tx = tx_submit(client=ctx.client, signer=account, key="take-earnings", purpose="withdraw", call=ctx.market.functions.withdraw(paid))
    assert ctx.client.wait(tx.tx_hash).succeeded
    with django_capture_on_commit_callbacks(execute=True):
        assert client_for(buyer).post(f"/api/v1/ledger/trades/{trade.pk}/dispute/").status_code == 202
    sync_chain(ctx)
    sync_chain(ctx)
    assert account_balances()[f"stake:{provider}"] == 100 * TOKENS - paid, "nothing free: held from the stake"
    assert ctx.client.view(ctx.market, "providers", provider)[0] == 2
    with django_capture_on_commit_callbacks(execute=True):
        r = client_for(operator).post(f"/api/v1/ledger/trades/{trade.pk}/ruling/", {"pay_provider": True}, format="json")
    assert r.status_code == 202, r.content
    sync_chain(ctx)
    sync_chain(ctx)
    trade.refresh_from_db()
    assert trade.state == "settled"
    assert account_balances()[f"stake:{provider}"] == 100 * TOKENS
    assert tuple(ctx.client.view(ctx.market, "providers", provider))[:2] == (1, 100 * TOKENS)
    assert journal_verify(ctx=ctx) == []


@pytest.mark.anvil
def test_the_trade_page_disputes_for_its_buyer_and_rules_for_an_operator(
    ctx: Any, buyer: Any, provider_user: Any, operator: Any, make_offer: Any, make_bid: Any,
    django_capture_on_commit_callbacks: Any,
) -> None:
    from django.test import Client

    trade, _, _ = settled_trade(ctx, buyer, provider_user, make_offer, make_bid)
    page = f"/trades/{trade.pk}/"
    as_buyer, as_provider, as_operator = Client(), Client(), Client()
    as_buyer.force_login(buyer)
    as_provider.force_login(provider_user)
    as_operator.force_login(operator)
    assert b'value="dispute"' in as_buyer.get(page).content
    assert b'value="dispute"' not in as_provider.get(page).content
    # unconfirmed (no JavaScript dialog), the page only asks again
    asked = as_buyer.post(page, {"action": "dispute", "nonce": "n1"}).content
    assert b'id="confirm"' in asked and b"Dispute sent" not in asked
    with django_capture_on_commit_callbacks(execute=True):
        r = as_buyer.post(page, {"action": "dispute", "nonce": "n1", "confirmed": "yes"}, follow=True)
    assert b"Dispute sent" in r.content
    # sent, not yet confirmed: pending with its transaction, not the old state with the same button
    assert b"dispute pending" in r.content and b'value="dispute"' not in r.content
    sent = as_buyer.get(page).content  # its transaction signed and sent once the request committed
    assert b"dispute pending" in sent and b'id="pending-tx">0x' in sent and b'value="dispute"' not in sent
    sync_chain(ctx)
    sync_chain(ctx)
    trade.refresh_from_db()
    assert trade.state == "disputed"
    disputed = as_buyer.get(page).content.decode()
    assert 'value="dispute"' not in disputed and "dispute pending" not in disputed
    assert 'id="dispute-tx">0x' in disputed and 'id="dispute-held">' in disputed and "USDC" in disputed and 'id="dispute-deadline">closes' in disputed
    assert f'href="{page}">rule'.encode() in as_operator.get("/operator/").content  # listed as open
    shown = as_operator.get(page).content
    assert b'value="pay-provider"' in shown and b'value="refund-buyer"' in shown
    r = as_operator.post(page, {"action": "refund-buyer", "slash": "lots", "nonce": "n2", "confirmed": "yes"}, follow=True)
    assert b"slash" in r.content and b"not a number of USDC" in r.content  # refused, nothing sent
    with django_capture_on_commit_callbacks(execute=True):
        r = as_operator.post(page, {"action": "refund-buyer", "slash": "0", "nonce": "n3", "confirmed": "yes"}, follow=True)
    assert b"Ruling sent" in r.content
    sync_chain(ctx)
    sync_chain(ctx)
    trade.refresh_from_db()
    assert trade.state == "refunded"


@pytest.mark.anvil
def test_the_dev_chain_keeps_a_current_market_and_redeploys_an_older_one(ctx: Any) -> None:
    from ledger.devchain import deployment_ensure
    from ledger.models import Deployment

    kept = deployment_ensure(ctx.client)
    assert kept.pk == ctx.deployment.pk, "the market there is this code's: kept"
    # code at the address, but not this GridBid's market (as after an upgrade)
    Deployment.objects.filter(pk=kept.pk).update(market_address=ctx.deployment.token_address)
    fresh = deployment_ensure(ctx.client)
    assert fresh.pk != kept.pk and fresh.active and not Deployment.objects.get(pk=kept.pk).active
    assert ctx.client.code(fresh.market_address) != ctx.client.code(ctx.deployment.token_address)
    assert deployment_ensure(ctx.client).pk == fresh.pk

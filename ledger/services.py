"""Settlement services: record new trades on chain, collect co-signatures of completion
roots, settle them; escrow deposits for custodial buyers.

Batches are claimed in one database transaction (a trade belongs to one live batch:
`RecordItem.trade` and `SettleItem.trade` are unique) and submitted after it
commits through the outbox, keyed by the batch, so a retried task never sends a
batch twice. Trade states change only when the listener applies the confirmed
event (ledger/listener.py), never when a transaction is merely sent.
"""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any

from django.db import transaction
from django.utils import timezone
from eth_utils import to_checksum_address

from contracts import bls
from contracts.batches import (
    MAX_BUYERS,
    MAX_FILLERS,
    MAX_ORDERS,
    MAX_SEGMENTS,
    MAX_SIGNERS,
    MAX_TRADES,
    Completion,
    RecordedTrade,
    TradeFill,
    record_args,
    settlement_args,
)
from contracts.merkle import merkle_root
from contracts.orders import Order, SignedOrder, sign_order
from ledger.chain import ChainError
from ledger.context import ChainContext
from ledger.custody import custodial_key_get_or_create, custodial_signer
from ledger.journal import account_balances
from ledger.models import (
    BatchState,
    ChainEvent,
    ChainTx,
    ChainTxState,
    Cosign,
    CustodialKey,
    RecordBatch,
    RecordItem,
    SettleBatch,
    SettleItem,
)
from ledger.outbox import tx_submit
from ledger.wallet import is_wallet_buyer, signed_order_of
from market.events import OperatorChanged, announce
from market.models import Bid, Trade, User
from market.states import JobState, TradeState
from providers.models import Provider

log = logging.getLogger("gridbid.ledger")

ORDER_TTL_S = 24 * 3600  # an order without a bid deadline can be recorded for a day after the match
FINISHED_JOBS = (JobState.COMPLETED, JobState.FAILED, JobState.PREEMPTED, JobState.STOPPED)


class SettlementError(Exception):
    pass


def _hex(b: bytes) -> str:
    return "0x" + b.hex()


# --- record --------------------------------------------------------------------------------
def _order_for(bid: Bid, *, buyer: str, deadline: int) -> Order:
    return Order(order_id=bid.pk, buyer=buyer, max_price=bid.max_price, gpus=bid.gpus, duration=bid.duration_s, deadline=deadline)


def _record_call(ctx: ChainContext, batch: RecordBatch) -> Any:
    """The `record_trades` call of a stored batch, rebuilt from its items (orders are signed
    again: ECDSA here is deterministic, RFC 6979, so the same bytes come out)."""
    items = list(batch.items.select_related("trade__bid", "trade__buyer").order_by("position"))
    orders = {}
    fills = []
    for item in items:
        bid = item.trade.bid
        if bid.pk not in orders:
            key = CustodialKey.objects.filter(address=item.buyer).first()
            if key is not None:
                order = _order_for(bid, buyer=item.buyer, deadline=item.deadline)
                orders[bid.pk] = sign_order(bytes(custodial_signer(key).key), order, chain_id=ctx.chain_id, market=ctx.deployment.market_address)
            else:  # a wallet buyer's order: the signature its wallet gave
                signed = signed_order_of(bid, chain_id=ctx.chain_id, market=ctx.deployment.market_address)
                if signed is None:
                    raise SettlementError(f"record batch {batch.pk}: bid {bid.pk}'s wallet signature is gone")
                orders[bid.pk] = signed
        fills.append(TradeFill(trade_id=item.trade_id, order_id=bid.pk, provider=item.provider, price=item.price, gpus=item.gpus))
    call = record_args(list(orders.values()), fills)
    if [r.leaf for r in call.recorded] != [bytes.fromhex(i.leaf[2:]) for i in items]:
        raise SettlementError(f"record batch {batch.pk}: rebuilt trades differ from the stored ones")
    return ctx.market.functions.record_trades(*call.args)


def _registered(ctx: ChainContext, address: str, seen: dict[str, bool]) -> bool:
    """Whether the contract holds an active registration (stake + BLS key) for a provider."""
    key = address.lower()
    if key not in seen:
        seen[key] = int(ctx.client.view(ctx.market, "providers", address)[0]) == 1
    return seen[key]


def _claim_record_batch(ctx: ChainContext, *, limit: int) -> RecordBatch | None:
    pending = Trade.objects.filter(state=TradeState.PENDING, record_item__isnull=True)
    bid_ids = list(dict.fromkeys(pending.order_by("id").values_list("bid_id", flat=True)[:limit]))
    trades = list(pending.filter(bid_id__in=bid_ids).select_related("bid", "buyer", "provider").order_by("bid_id", "id"))
    now = int(time.time())
    fills: list[TradeFill] = []
    orders = {}
    deadlines: dict[int, int] = {}
    budget: dict[str, int] = {}  # per buyer address: free escrow on chain, less this batch's locks
    wallet_orders: dict[int, SignedOrder] = {}
    registered: dict[str, bool] = {}
    by_bid: dict[int, list[Trade]] = {}
    for trade in trades:
        by_bid.setdefault(trade.bid_id, []).append(trade)
    ready: list[Trade] = []
    bids_ready: set[int] = set()
    for bid_trades in by_bid.values():
        # an order is used once, so a bid's trades go into one batch together or wait together
        if any(not t.provider.chain_address or t.duration_s != t.bid.duration_s for t in bid_trades):
            continue  # a provider has not proven an address yet; the trades wait
        if not all(_registered(ctx, t.provider.chain_address, registered) for t in bid_trades):
            continue  # the contract would refuse the whole batch ("bad provider"): wait for its stake
        buyer = bid_trades[0].buyer
        if is_wallet_buyer(buyer):
            signed = signed_order_of(bid_trades[0].bid, chain_id=ctx.chain_id, market=ctx.deployment.market_address)
            if signed is None or signed.order.deadline <= now:
                continue  # a wallet buyer's trades wait for its wallet to sign the order
            wallet_orders[bid_trades[0].bid_id] = signed
            address = buyer.chain_address
        else:
            address = custodial_key_get_or_create(user=buyer).address
        if address not in budget:
            budget[address] = int(ctx.client.view(ctx.market, "balance_of", address))
        lock = sum(t.price * t.gpus * t.duration_s // 3600 for t in bid_trades)
        if lock > budget[address]:
            # the contract would revert the whole batch: this bid waits for a deposit instead
            log.info("bid %s waits: its lock %s exceeds its buyer's free escrow %s", bid_trades[0].bid_id, lock, budget[address])
            continue
        # one order per bid: a bid's trades fit in a batch together or wait for the next
        if len(ready) + len(bid_trades) > MAX_TRADES or len(bids_ready) + 1 > MAX_ORDERS:
            if not ready:
                log.error("bid %s has %d trades, more than one record batch takes (%d): it cannot be recorded",
                          bid_trades[0].bid_id, len(bid_trades), MAX_TRADES)
            continue  # the contract's bounds on one batch: the next batch takes it
        budget[address] -= lock
        ready.extend(bid_trades)
        bids_ready.add(bid_trades[0].bid_id)
    for trade in ready:
        bid = trade.bid
        provider = trade.provider.chain_address
        if bid.pk not in orders and bid.pk in wallet_orders:
            orders[bid.pk] = wallet_orders[bid.pk]
            deadlines[bid.pk] = wallet_orders[bid.pk].order.deadline
        if bid.pk not in orders:
            key = custodial_key_get_or_create(user=trade.buyer)
            deadline = int(bid.deadline.timestamp()) if bid.deadline else now + bid.duration_s + ORDER_TTL_S
            if deadline <= now:
                continue
            deadlines[bid.pk] = deadline
            order = _order_for(bid, buyer=key.address, deadline=deadline)
            orders[bid.pk] = sign_order(bytes(custodial_signer(key).key), order, chain_id=ctx.chain_id, market=ctx.deployment.market_address)
        fills.append(TradeFill(trade_id=trade.pk, order_id=bid.pk, provider=provider, price=trade.price, gpus=trade.gpus))
    if not fills:
        return None
    recorded = record_args(list(orders.values()), fills).recorded
    with transaction.atomic():
        batch = RecordBatch.objects.create(
            deployment=ctx.deployment, root=_hex(merkle_root([r.leaf for r in recorded])),
            locked=sum(r.lock for r in recorded),
        )
        for position, (fill, rt) in enumerate(zip(fills, recorded, strict=True)):
            RecordItem.objects.create(
                batch=batch, trade_id=fill.trade_id, position=position, order_id=fill.order_id, buyer=rt.buyer,
                provider=rt.provider, price=rt.price, gpus=rt.gpus, duration=rt.duration, deadline=rt.deadline, leaf=_hex(rt.leaf),
            )
    return batch


def _submit(ctx: ChainContext, batch: RecordBatch | SettleBatch, *, purpose: str, call_of: Any) -> None:
    """Send a claimed batch once (key = purpose:pk); a call that would revert frees its trades."""
    try:
        row = tx_submit(client=ctx.client, signer=ctx.operator, key=f"{purpose}:{batch.pk}", purpose=purpose, call=call_of())
    except ChainError as exc:
        log.warning("%s batch %s not sent: %s", purpose, batch.pk, exc)
        batch_fail(batch=batch, error=str(exc))
        return
    type(batch).objects.filter(pk=batch.pk).update(chain_tx=row, state=BatchState.SUBMITTED)
    announce(OperatorChanged())  # the operator's settlement queue


@transaction.atomic
def batch_fail(*, batch: RecordBatch | SettleBatch, error: str) -> None:
    """Give up on a batch: its trades can be batched again."""
    type(batch).objects.filter(pk=batch.pk).update(state=BatchState.FAILED, error=error[:2000])
    batch.items.all().delete()
    if isinstance(batch, SettleBatch):
        batch.cosigns.all().delete()
    announce(OperatorChanged())


def batches_release_failed(*, ctx: ChainContext) -> int:
    """Give up on the submitted batches whose transaction failed for good: it reverted at its
    confirmation depth, or another transaction took its nonce (ledger/outbox.py). Nothing of
    theirs happened on chain, so their trades go back to be batched again; before, such a
    batch stayed `submitted` and held its trades for ever. Returns how many."""
    released = 0
    for model in (RecordBatch, SettleBatch):
        failed = model.objects.filter(deployment=ctx.deployment, state=BatchState.SUBMITTED,
                                      chain_tx__state=ChainTxState.FAILED).select_related("chain_tx")
        for batch in failed:
            tx = batch.chain_tx
            why = tx.error or "reverted"
            log.warning("%s batch %s: its transaction %s (nonce %s) failed (%s); its trades are free again",
                        model.__name__, batch.pk, tx.tx_hash, tx.nonce, why)
            batch_fail(batch=batch, error=f"transaction {tx.tx_hash} (nonce {tx.nonce}) failed: {why}")
            released += 1
    return released


def batch_record(*, ctx: ChainContext, limit: int = MAX_TRADES) -> RecordBatch | None:
    """Submit record batches left unsent by a crash, then claim and submit a new one."""
    for stale in RecordBatch.objects.filter(deployment=ctx.deployment, state=BatchState.SUBMITTED, chain_tx__isnull=True):
        _submit(ctx, stale, purpose="record", call_of=lambda b=stale: _record_call(ctx, b))
    batch = _claim_record_batch(ctx, limit=limit)
    if batch is not None:
        _submit(ctx, batch, purpose="record", call_of=lambda: _record_call(ctx, batch))
        batch.refresh_from_db()
    return batch


# --- settle --------------------------------------------------------------------------------
def recorded_trade(item: RecordItem) -> RecordedTrade:
    """A recorded trade as the contract locked it, from its ledger row (to prove it again)."""
    return RecordedTrade(item.trade_id, item.buyer, item.provider, item.price, item.gpus, item.duration, item.deadline)


def _settlement(ctx: ChainContext, completions: list[Completion]) -> Any:
    numbers = {c.batch for c in completions}
    record_batches = {}
    for rb in RecordBatch.objects.filter(deployment=ctx.deployment, number__in=numbers):
        record_batches[rb.number] = [recorded_trade(i) for i in rb.items.order_by("position")]
    return settlement_args(
        completions, record_batches, chain_id=ctx.chain_id, market=ctx.deployment.market_address,
        keys=_registered_keys(ctx, {c.trade.provider for c in completions}),
    )


def _registered_keys(ctx: ChainContext, addresses: set[str]) -> dict[str, bytes]:
    """Each provider's BLS key as the contract holds it: from its (latest) ProviderRegistered
    event, or, before the listener has seen that, the key the provider gave the market."""
    wanted = {a.lower() for a in addresses}
    keys: dict[str, bytes] = {}
    for event in ChainEvent.objects.filter(deployment=ctx.deployment, name="ProviderRegistered").order_by("block_number", "log_index"):
        address = str(event.args.get("provider", "")).lower()
        if address in wanted:
            keys[address] = bytes.fromhex(str(event.args["pubkey"])[2:])
    spellings = {form for a in addresses if a.lower() not in keys for form in (a, a.lower(), to_checksum_address(a))}
    for p in Provider.objects.filter(chain_address__in=spellings).exclude(bls_public_key=""):
        keys.setdefault(p.chain_address.lower(), bytes.fromhex(p.bls_public_key))
    return keys


def _completions(items: list[SettleItem] | list[tuple[RecordItem, int, bytes]]) -> list[Completion]:
    out = []
    for entry in items:
        if isinstance(entry, SettleItem):
            ri, gpu_seconds, digest = entry.record_item, entry.gpu_seconds, bytes.fromhex(entry.digest[2:])
        else:
            ri, gpu_seconds, digest = entry
        out.append(Completion(trade=recorded_trade(ri), batch=int(ri.batch.number or 0), position=ri.position, gpu_seconds=gpu_seconds, digest=digest))
    return out


def _exits_before_disputes_close(ctx: ChainContext, address: str, seen: dict[str, bool]) -> bool:
    """Whether a provider has asked to exit and its stake may leave within one dispute window
    from now. A buyer's dispute would then find no stake to hold, so the contract refuses to
    settle it ("market: provider exiting") and the operator does not try: its trades are
    refunded after their deadline instead. The exit request is read from the listener's
    events (it lands days before it matters: exit_delay >= the dispute window), so only a
    provider that asked to exit costs a call to the node."""
    key = address.lower()
    if key not in seen:
        requests_ = ChainEvent.objects.filter(deployment=ctx.deployment, name="ExitRequested").order_by("-block_number", "-log_index")
        exit_at = next((int(e.args["exit_at"]) for e in requests_ if str(e.args.get("provider", "")).lower() == key), None)
        if exit_at is None:
            seen[key] = False
        else:
            window = int(ctx.client.view(ctx.market, "dispute_window"))
            seen[key] = ctx.client.block_timestamp() + window >= exit_at
    return seen[key]


def _suspended(ctx: ChainContext, address: str, seen: dict[str, bool]) -> bool:
    """Whether disputes took a provider's stake below the minimum: the contract then refuses
    to settle it ("market: provider suspended") until it tops the stake up. Only a provider
    a buyer has disputed can be, so only those cost a call to the node."""
    key = address.lower()
    if key not in seen:
        disputed = any(
            str(e.args.get("provider", "")).lower() == key
            for e in ChainEvent.objects.filter(deployment=ctx.deployment, name="DisputeOpened").only("args")
        )
        seen[key] = disputed and int(ctx.client.view(ctx.market, "providers", address)[0]) == 2
    return seen[key]


def settle_collect(*, ctx: ChainContext, limit: int = MAX_TRADES) -> SettleBatch | None:
    """Batch the recorded trades whose jobs finished with a receipt and ask each provider
    to co-sign the root (with the proof of one of its leaves). The batch stays inside the
    contract's bounds (contracts/batches.py): at most MAX_TRADES receipts, MAX_SIGNERS
    providers, MAX_BUYERS buyers, MAX_SEGMENTS record batches touched and MAX_FILLERS
    leaves of those batches not settled here; a trade that would break one waits for the
    next batch (oldest first, so none waits forever).

    A provider still asked to co-sign an earlier batch is left out: its finished trades
    wait and go together into the batch after it answers. Each signature costs the agent
    (and the check here) about a second of py-ecc, so a batch every tick asked a slow
    provider for signatures faster than it could give them, and its backlog, and its
    trades' settlement, grew without bound. One open request per provider keeps the work
    to one signature per answer, however many trades it covers, and never holds the others."""
    unanswered = Cosign.objects.filter(batch__deployment=ctx.deployment, batch__state=BatchState.COLLECTING, signature="")
    candidates = (
        Trade.objects.filter(
            state=TradeState.RECORDED, settle_item__isnull=True, job__state__in=FINISHED_JOBS,
            record_item__batch__state=BatchState.CONFIRMED, record_item__batch__deployment=ctx.deployment,
        )
        .exclude(provider_id__in=unanswered.values("provider_id"))  # they wait for the batch after its answer
        .select_related("job", "provider", "record_item__batch")
        .order_by("id")[:limit]
    )
    entries: list[tuple[RecordItem, int, bytes]] = []
    exiting: dict[str, bool] = {}
    suspended: dict[str, bool] = {}
    signers: set[str] = set()
    buyers: set[str] = set()
    touched: dict[int, int] = {}  # record batch id -> its trades settled here
    sizes: dict[int, int] = {}  # record batch id -> its trades
    fillers = 0
    for trade in candidates:
        receipt = (trade.job.checkpoint or {}).get("receipt")
        if not receipt or not trade.provider.bls_public_key:
            continue
        if _exits_before_disputes_close(ctx, trade.provider.chain_address, exiting):
            continue  # the contract refuses it: its stake could leave before the buyer could dispute
        if _suspended(ctx, trade.provider.chain_address, suspended):
            continue  # the contract refuses it until its stake is back to the minimum
        signer, buyer = trade.provider.chain_address.lower(), trade.record_item.buyer.lower()
        if len(signers | {signer}) > MAX_SIGNERS or len(buyers | {buyer}) > MAX_BUYERS:
            continue  # the contract's bounds on one settlement: the next batch takes it
        record_batch = trade.record_item.batch_id
        if record_batch not in touched:
            if record_batch not in sizes:
                sizes[record_batch] = RecordItem.objects.filter(batch_id=record_batch).count()
            if len(touched) + 1 > MAX_SEGMENTS or fillers + sizes[record_batch] - 1 > MAX_FILLERS:
                continue  # its record batch's other leaves would not fit: the next batch takes it
            touched[record_batch] = 0
            fillers += sizes[record_batch]
        touched[record_batch] += 1
        fillers -= 1
        signers.add(signer)
        buyers.add(buyer)
        entries.append((trade.record_item, int(receipt["body"]["gpu_seconds"]), bytes.fromhex(receipt["digest"])))
    if not entries:
        return None
    settlement = _settlement(ctx, _completions(entries))
    providers = {p.chain_address.lower(): p for p in Provider.objects.filter(pk__in={ri.trade.provider_id for ri, _, _ in entries})}
    by_trade = {ri.trade_id: (ri, gs, d) for ri, gs, d in entries}
    with transaction.atomic():
        batch = SettleBatch.objects.create(deployment=ctx.deployment, root=_hex(settlement.root), message=_hex(settlement.message))
        asked: set[str] = set()
        for index, c in enumerate(settlement.completions):
            ri, gs, d = by_trade[c.trade.trade_id]
            paid = c.trade.payment(c.gpu_seconds)
            SettleItem.objects.create(batch=batch, trade_id=ri.trade_id, record_item=ri, index=index, gpu_seconds=gs,
                                      digest=_hex(d), paid=paid, refund=c.trade.lock - paid)
            address = c.trade.provider
            if address.lower() in asked:
                continue
            asked.add(address.lower())
            Cosign.objects.create(batch=batch, provider=providers[address.lower()], address=address, request={
                "trade": ri.trade_id, "root": _hex(settlement.root), "index": index,
                "proof": [_hex(p) for p in settlement.tree.proof(index)],
                "chain_id": ctx.chain_id, "market": ctx.deployment.market_address,
            })
        batch.paid = sum(i.paid for i in batch.items.all())
        batch.refunded = sum(i.refund for i in batch.items.all())
        batch.save(update_fields=["paid", "refunded"])
        announce(OperatorChanged())
    return batch


def cosign_submit(*, cosign_id: int, provider: Provider, signature_hex: str) -> Cosign:
    """Keep a provider's BLS signature of the batch's settlement message, once it verifies
    against the provider's registered key (~0.5 s of py-ecc: never inside a request)."""
    cosign = Cosign.objects.select_related("batch").get(pk=cosign_id, provider=provider)
    if cosign.signature:
        return cosign
    message = bytes.fromhex(cosign.batch.message[2:])
    try:
        ok = bls.verify(bytes.fromhex(provider.bls_public_key), message, bytes.fromhex(signature_hex.removeprefix("0x")))
    except ValueError:
        ok = False
    if not ok:
        raise SettlementError("the co-signature does not verify against the provider's BLS key")
    Cosign.objects.filter(pk=cosign.pk, signature="").update(signature=signature_hex.removeprefix("0x"), signed_at=timezone.now())
    cosign.refresh_from_db()
    return cosign


def settle_submit_ready(*, ctx: ChainContext) -> list[SettleBatch]:
    """Submit every collecting batch whose providers have all co-signed."""
    sent = []
    for batch in SettleBatch.objects.filter(deployment=ctx.deployment, state=BatchState.COLLECTING).order_by("id"):
        sigs = list(batch.cosigns.order_by("address").values_list("signature", flat=True))
        if not sigs or not all(sigs):
            continue

        def call(b: SettleBatch = batch, sigs: list[str] = sigs) -> Any:
            items = list(b.items.select_related("record_item__batch").order_by("index"))
            settlement = _settlement(ctx, _completions(items))
            if _hex(settlement.root) != b.root:
                raise SettlementError(f"settle batch {b.pk}: rebuilt root differs")
            aggregate = bls.g2_to_eip2537(bls.aggregate([bytes.fromhex(s) for s in sigs]))
            return ctx.market.functions.settle_batch(*settlement.args(aggregate))

        _submit(ctx, batch, purpose="settle", call_of=call)
        batch.refresh_from_db()
        sent.append(batch)
    return sent


# --- escrow --------------------------------------------------------------------------------
# gas of GridBidMarket.deposit beyond the token transfer it makes: the balance word, the
# Deposited log and transferFrom's allowance update: ~25k on anvil with the test token
# (deposit 76,115 gas; the limit came to 151,465), so 80k leaves room for costlier tokens
DEPOSIT_MARKET_GAS = 80_000


def escrow_deposit(*, ctx: ChainContext, user: User, amount: int, key: str) -> ChainTx:
    """Approve and deposit `amount` from a custodial buyer's key (it must hold the tokens and gas).
    `key` makes the pair idempotent."""
    custodial = custodial_key_get_or_create(user=user)
    signer = custodial_signer(custodial)
    market = ctx.deployment.market_address
    # Estimating the deposit after the approve runs its transferFrom before the approve is
    # mined: on any chain that does not mine each transaction at once that reverts
    # ("allowance exceeded"; it crashed `gridbid up --demo`). The signer's nonces already
    # order the two, so the deposit gets a gas limit instead of an estimate: what a plain
    # transfer of this token costs this sender plus the market's own bookkeeping. It is
    # estimated first, so a buyer without the tokens fails before anything is sent, and
    # only for a new pair: a retry of a mined deposit (the tokens gone) sends nothing.
    gas_limit = None
    if not ChainTx.objects.filter(key=f"deposit:{key}").exists():
        gas_limit = int(ctx.client.build(ctx.token.functions.transfer(market, amount), signer.address)["gas"]) + DEPOSIT_MARKET_GAS
    tx_submit(client=ctx.client, signer=signer, key=f"approve:{key}", purpose="approve", call=ctx.token.functions.approve(market, amount))
    return tx_submit(client=ctx.client, signer=signer, key=f"deposit:{key}", purpose="deposit", call=ctx.market.functions.deposit(amount),
                     gas_limit=gas_limit)


def escrow_summary(*, address: str) -> dict[str, Any]:
    """An account's balances as the journal has them (confirmed chain events only)."""
    balances = account_balances(prefix_filter=address)
    return {kind: balances.get(f"{kind}:{address}", 0) for kind in ("free", "locked", "stake")}


def locks_of(*, address: str) -> list[dict[str, Any]]:
    by_trade: dict[int, dict[str, Any]] = defaultdict(dict)
    for item in RecordItem.objects.filter(buyer__iexact=address, trade__state=TradeState.RECORDED).select_related("batch"):
        by_trade[item.trade_id] = {"trade": item.trade_id, "amount": item.lock, "deadline": item.deadline, "batch": item.batch.number}
    return list(by_trade.values())

"""The event listener: reads the market's logs by block range, remembers the hashes of
the blocks it derived something from, and applies events once they are confirmed.

Reorgs: before reading on, the stored block hashes are compared with the chain,
newest first. If the newest no longer matches, everything after the last block
that still matches is rolled back (stored events, journal entries, trade and
batch states) and read again from the new chain. Effects are applied in chain
order, only for blocks buried under CHAIN_CONFIRMATIONS blocks (0: at once).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from django.db import transaction

from ledger.chain import ContractCall
from ledger.context import ChainContext
from ledger.journal import journal_append, journal_truncate
from ledger.legs import CALL_OF, DerivationError, Leg, event_legs
from ledger.models import (
    BatchState,
    ChainEvent,
    ListenerCursor,
    RecordBatch,
    SeenBlock,
    SettleBatch,
)
from market import states
from market.events import BalancesChanged, JobsChanged, OperatorChanged, TradesMoved, announce
from market.models import Trade
from market.states import TradeState

log = logging.getLogger("gridbid.ledger.listener")

MAX_RANGE = 2000  # blocks per eth_getLogs
KEEP_EMPTY_BLOCKS = 256  # hashes of blocks without events older than this are pruned


@dataclass(frozen=True)
class SyncResult:
    head: int
    scanned_to: int
    applied_to: int
    new_events: int
    applied: int
    rolled_back_to: int | None


def _cursor(ctx: ChainContext) -> ListenerCursor:
    start = max(ctx.deployment.deployed_block - 1, -1)
    cursor, _ = ListenerCursor.objects.get_or_create(deployment=ctx.deployment, defaults={"scanned_to": start, "applied_to": start})
    return cursor


def _fork_point(ctx: ChainContext) -> int | None:
    """None when the newest stored block is still canonical, else the last one that is."""
    newest = True
    for seen in SeenBlock.objects.filter(deployment=ctx.deployment).order_by("-number").iterator():
        if ctx.client.block_hash(seen.number) == seen.hash:
            return None if newest else int(seen.number)
        newest = False
    if newest:
        return None  # nothing stored yet
    return max(ctx.deployment.deployed_block - 1, -1)


@transaction.atomic
def rollback(*, ctx: ChainContext, to_block: int) -> None:
    """Undo what was derived from blocks after `to_block`."""
    cursor = ListenerCursor.objects.select_for_update().get(deployment=ctx.deployment)
    dropped = list(ChainEvent.objects.filter(deployment=ctx.deployment, block_number__gt=to_block, applied=True).order_by("-block_number", "-log_index"))
    for event in dropped:
        _undo(ctx, event)
    journal_truncate(after_block=to_block)
    ChainEvent.objects.filter(deployment=ctx.deployment, block_number__gt=to_block).delete()
    SeenBlock.objects.filter(deployment=ctx.deployment, number__gt=to_block).delete()
    cursor.scanned_to = min(cursor.scanned_to, to_block)
    cursor.applied_to = min(cursor.applied_to, to_block)
    cursor.save()
    log.warning("reorg: rolled back %d applied events after block %d", len(dropped), to_block)
    announce(OperatorChanged())


def _undo(ctx: ChainContext, event: ChainEvent) -> None:
    # the state machine has no backward moves: a reorg is the one place that needs them
    if event.name == "TradesRecorded":
        batch = RecordBatch.objects.filter(deployment=ctx.deployment, root=event.args["root"]).first()
        if batch is not None:
            RecordBatch.objects.filter(pk=batch.pk).update(state=BatchState.SUBMITTED, number=None)
            Trade.objects.filter(record_item__batch=batch, state=TradeState.RECORDED).update(state=TradeState.PENDING)
    elif event.name == "BatchSettled":
        batch = SettleBatch.objects.filter(deployment=ctx.deployment, root=event.args["root"]).first()
        if batch is not None:
            SettleBatch.objects.filter(pk=batch.pk).update(state=BatchState.SUBMITTED)
            Trade.objects.filter(settle_item__batch=batch, state=TradeState.SETTLED).update(state=TradeState.RECORDED)
    elif event.name == "TradeRefunded":
        Trade.objects.filter(pk=int(event.args["trade_id"]), state=TradeState.REFUNDED).update(state=TradeState.RECORDED)


def _advance_trades(qs: Any, target: str, *, cause: str = "") -> None:
    moved = []
    for trade in qs.select_for_update():
        if trade.state != target:
            states.advance("trade", trade, target)
            trade.save(update_fields=["state"])
            moved.append(trade.pk)
    if moved:
        announce(TradesMoved(trade_ids=tuple(moved), state=target, cause=cause))  # e.g. a refund gives back the trade's GPUs
    announce(JobsChanged(trade_ids=tuple(moved)))  # the buyer's page shows recorded / settled live


def _effects(ctx: ChainContext, event: ChainEvent, opened: dict[str, Any] | None) -> None:
    """An event's effect on trades and batches (its money is `event_legs`'s)."""
    a = event.args
    name = event.name
    if name == "TradesRecorded":
        batch = RecordBatch.objects.filter(deployment=ctx.deployment, root=a["root"]).first()
        if batch is None:
            log.error("TradesRecorded %s: no record batch of ours has this root", a["root"])
            return
        if batch.items.count() != int(a["trades"]) or sum(i.lock for i in batch.items.all()) != int(a["locked"]):
            log.error("TradesRecorded %s: the event does not match our batch %s", a["root"], batch.pk)
        RecordBatch.objects.filter(pk=batch.pk).update(number=int(a["batch"]), state=BatchState.CONFIRMED)
        _advance_trades(Trade.objects.filter(record_item__batch=batch), TradeState.RECORDED, cause=name)
    elif name == "BatchSettled":
        sbatch = SettleBatch.objects.filter(deployment=ctx.deployment, root=a["root"]).first()
        if sbatch is None:
            log.error("BatchSettled %s: no settle batch of ours has this root", a["root"])
            return
        SettleBatch.objects.filter(pk=sbatch.pk).update(state=BatchState.CONFIRMED)
        _advance_trades(Trade.objects.filter(settle_item__batch=sbatch), TradeState.SETTLED, cause=name)
    elif name == "TradeRefunded":
        _advance_trades(Trade.objects.filter(pk=int(a["trade_id"])), TradeState.REFUNDED, cause=name)
    elif name == "DisputeOpened":
        _advance_trades(Trade.objects.filter(pk=int(a["trade_id"])), TradeState.DISPUTED, cause=name)
    elif name == "DisputeResolved" and opened is not None:
        target = TradeState.SETTLED if a["provider_paid"] else TradeState.REFUNDED
        _advance_trades(Trade.objects.filter(pk=int(a["trade_id"])), target, cause=name)


def _opened(ctx: ChainContext, event: ChainEvent) -> dict[str, Any] | None:
    """For a DisputeResolved, the args of its trade's DisputeOpened (who is refunded, who slashed)."""
    if event.name != "DisputeResolved":
        return None
    found = ChainEvent.objects.filter(deployment=ctx.deployment, name="DisputeOpened",
                                      args__trade_id=int(event.args["trade_id"])).order_by("-block_number").first()
    return dict(found.args) if found is not None else None


def _legs(event: ChainEvent, calls: dict[str, ContractCall | None], opened: dict[str, Any] | None) -> list[Leg]:
    """The journal legs of one event (ledger/legs.py, which `ledger verify` derives again)."""
    try:
        return event_legs(event.name, event.args, call=calls.get(event.tx_hash.lower()), opened=opened)
    except DerivationError as exc:
        # journaled as nothing: the balances now differ from the chain, and verify names the entries
        log.error("%s at %s:%s: %s", event.name, event.block_number, event.log_index, exc)
        return []


def events_sync(*, ctx: ChainContext, confirmations: int | None = None, max_range: int = MAX_RANGE) -> SyncResult:
    """One listener tick: detect and roll back a reorg, read new logs, apply confirmed events."""
    depth = ctx.confirmations if confirmations is None else confirmations
    cursor = _cursor(ctx)
    fork = _fork_point(ctx)
    if fork is not None:
        rollback(ctx=ctx, to_block=fork)
        cursor.refresh_from_db()
    head = ctx.client.block_number()
    start, end = cursor.scanned_to + 1, min(head, cursor.scanned_to + max_range)
    new = 0
    if start <= end:
        found = ctx.client.events(ctx.market, start, end)
        end_hash = ctx.client.block_hash(end)
        with transaction.atomic():
            cursor = ListenerCursor.objects.select_for_update().get(pk=cursor.pk)
            if cursor.scanned_to + 1 == start:  # no other listener got here first
                for e in found:
                    ChainEvent.objects.get_or_create(
                        deployment=ctx.deployment, block_hash=e.block_hash, log_index=e.log_index,
                        defaults={"block_number": e.block_number, "tx_hash": e.tx_hash, "name": e.name, "args": e.args},
                    )
                    SeenBlock.objects.update_or_create(deployment=ctx.deployment, number=e.block_number, defaults={"hash": e.block_hash})
                if end_hash is not None:
                    SeenBlock.objects.update_or_create(deployment=ctx.deployment, number=end, defaults={"hash": end_hash})
                cursor.scanned_to = end
                cursor.save(update_fields=["scanned_to", "updated_at"])
                new = len(found)
        SeenBlock.objects.filter(deployment=ctx.deployment, number__lt=end - KEEP_EMPTY_BLOCKS).exclude(
            number__in=ChainEvent.objects.filter(deployment=ctx.deployment).values("block_number")
        ).delete()
    safe = head - max(depth, 1) + 1 if depth > 0 else head
    applied = events_apply(ctx=ctx, up_to=safe)
    cursor.refresh_from_db()
    return SyncResult(head=head, scanned_to=cursor.scanned_to, applied_to=cursor.applied_to, new_events=new, applied=applied, rolled_back_to=fork)


def events_apply(*, ctx: ChainContext, up_to: int) -> int:
    """Apply stored events up to block `up_to` in chain order, under the listener lock. The
    calls of record and settle transactions are read from the chain first, outside the
    database transaction."""
    cursor = ListenerCursor.objects.get(deployment=ctx.deployment)
    limit = min(up_to, cursor.scanned_to)
    hashes = ChainEvent.objects.filter(deployment=ctx.deployment, applied=False, block_number__lte=limit,
                                       name__in=list(CALL_OF)).values_list("tx_hash", flat=True).distinct()
    calls = {h.lower(): ctx.client.transaction_call(ctx.market, h) for h in hashes}
    return _events_apply_locked(ctx=ctx, limit=limit, calls=calls)


@transaction.atomic
def _events_apply_locked(*, ctx: ChainContext, limit: int, calls: dict[str, ContractCall | None]) -> int:
    cursor = ListenerCursor.objects.select_for_update().get(deployment=ctx.deployment)
    limit = min(limit, cursor.scanned_to)
    events = list(ChainEvent.objects.filter(deployment=ctx.deployment, applied=False, block_number__lte=limit).order_by("block_number", "log_index"))
    touched: set[str] = set()
    applied = 0
    for event in events:
        if event.name in CALL_OF and event.tx_hash.lower() not in calls:
            # stored (after a reorg) since its call was read: the next tick applies it
            limit = event.block_number - 1
            break
        opened = _opened(ctx, event)
        _effects(ctx, event, opened)
        legs = _legs(event, calls, opened)
        journal_append(legs=legs, tx_hash=event.tx_hash, log_index=event.log_index, block_number=event.block_number, block_hash=event.block_hash)
        ChainEvent.objects.filter(pk=event.pk).update(applied=True)
        touched |= {acct.split(":", 1)[1] for leg in legs for acct in (leg.debit, leg.credit) if ":" in acct}
        applied += 1
    if limit > cursor.applied_to:
        cursor.applied_to = limit
        cursor.save(update_fields=["applied_to", "updated_at"])
    if applied:
        announce(OperatorChanged())  # batches confirmed, trades recorded or settled: the settlement queue moved
        announce(BalancesChanged(addresses=tuple(sorted(touched))))  # each owner's escrow, live
    return applied

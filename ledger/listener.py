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

from ledger.context import ChainContext
from ledger.journal import Leg, journal_append, journal_truncate
from ledger.models import (
    BatchState,
    ChainEvent,
    ListenerCursor,
    RecordBatch,
    SeenBlock,
    SettleBatch,
)
from ledger.signals import trades_moved
from market import states
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
    from market.streams import events as stream_events

    stream_events.operator_changed()


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
    from market.streams import events

    moved = []
    for trade in qs.select_for_update():
        if trade.state != target:
            states.advance("trade", trade, target)
            trade.save(update_fields=["state"])
            moved.append(trade.pk)
    if moved:
        trades_moved.send(sender=_advance_trades, trade_ids=moved, state=target, cause=cause)  # e.g. a refund gives back the trade's GPUs
    events.jobs_changed(trade_ids=moved)  # the buyer's page shows recorded / settled live


def _legs(ctx: ChainContext, event: ChainEvent) -> list[Leg]:
    """The journal legs of one event, and its effect on trades and batches."""
    a = event.args
    name = event.name
    if name == "Deposited":
        return [Leg("deposit", f"free:{a['buyer']}", f"wallet:{a['buyer']}", int(a["amount"]))]
    if name == "Withdrawn":
        return [Leg("withdraw", f"wallet:{a['account']}", f"free:{a['account']}", int(a["amount"]))]
    if name == "ProviderRegistered":
        return [Leg("stake", f"stake:{a['provider']}", f"wallet:{a['provider']}", int(a["stake"]))]
    if name == "StakeAdded":
        return [Leg("stake", f"stake:{a['provider']}", f"wallet:{a['provider']}", int(a["amount"]))]
    if name == "ProviderExited":
        return [Leg("unstake", f"wallet:{a['provider']}", f"stake:{a['provider']}", int(a["stake"]))]
    if name == "TradesRecorded":
        batch = RecordBatch.objects.filter(deployment=ctx.deployment, root=a["root"]).first()
        if batch is None:
            log.error("TradesRecorded %s: no record batch of ours has this root", a["root"])
            return []
        items = list(batch.items.order_by("position"))
        if sum(i.lock for i in items) != int(a["locked"]) or len(items) != int(a["trades"]):
            log.error("TradesRecorded %s: the event does not match our batch %s", a["root"], batch.pk)
        RecordBatch.objects.filter(pk=batch.pk).update(number=int(a["batch"]), state=BatchState.CONFIRMED)
        _advance_trades(Trade.objects.filter(record_item__batch=batch), TradeState.RECORDED, cause=name)
        return [Leg("lock", f"locked:{i.buyer}", f"free:{i.buyer}", i.lock, i.trade_id) for i in items]
    if name == "BatchSettled":
        sbatch = SettleBatch.objects.filter(deployment=ctx.deployment, root=a["root"]).first()
        if sbatch is None:
            log.error("BatchSettled %s: no settle batch of ours has this root", a["root"])
            return []
        SettleBatch.objects.filter(pk=sbatch.pk).update(state=BatchState.CONFIRMED)
        _advance_trades(Trade.objects.filter(settle_item__batch=sbatch), TradeState.SETTLED, cause=name)
        legs = []
        for s in sbatch.items.select_related("record_item").order_by("index"):
            ri = s.record_item
            legs.append(Leg("pay", f"free:{ri.provider}", f"locked:{ri.buyer}", s.paid, ri.trade_id))
            legs.append(Leg("refund", f"free:{ri.buyer}", f"locked:{ri.buyer}", s.refund, ri.trade_id))
        return legs
    if name == "TradeRefunded":
        _advance_trades(Trade.objects.filter(pk=int(a["trade_id"])), TradeState.REFUNDED, cause=name)
        return [Leg("refund", f"free:{a['buyer']}", f"locked:{a['buyer']}", int(a["amount"]), int(a["trade_id"]))]
    if name == "DisputeOpened":
        provider, held, trade_id = a["provider"], int(a["held"]), int(a["trade_id"])
        from_stake = int(a["from_stake"])
        _advance_trades(Trade.objects.filter(pk=trade_id), TradeState.DISPUTED, cause=name)
        return [Leg("hold", f"held:{trade_id}", f"free:{provider}", held - from_stake, trade_id),
                Leg("hold", f"held:{trade_id}", f"stake:{provider}", from_stake, trade_id)]
    if name == "DisputeResolved":
        trade_id = int(a["trade_id"])
        opened = ChainEvent.objects.filter(deployment=ctx.deployment, name="DisputeOpened", args__trade_id=trade_id).order_by("-block_number").first()
        if opened is None:
            log.error("DisputeResolved for trade %s without a DisputeOpened", trade_id)
            return []
        buyer, provider = opened.args["buyer"], opened.args["provider"]
        if a["provider_paid"]:
            _advance_trades(Trade.objects.filter(pk=trade_id), TradeState.SETTLED, cause=name)
            restaked = int(a["restaked"])
            return [Leg("release", f"free:{provider}", f"held:{trade_id}", int(a["amount"]) - restaked, trade_id),
                    Leg("release", f"stake:{provider}", f"held:{trade_id}", restaked, trade_id)]
        _advance_trades(Trade.objects.filter(pk=trade_id), TradeState.REFUNDED, cause=name)
        return [Leg("refund", f"free:{buyer}", f"held:{trade_id}", int(a["amount"]), trade_id),
                Leg("slash", f"free:{buyer}", f"stake:{provider}", int(a["slashed"]), trade_id)]
    return []  # ExitRequested, PausedSet, OperatorChanged, ArbiterChanged move no money


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


@transaction.atomic
def events_apply(*, ctx: ChainContext, up_to: int) -> int:
    """Apply stored events up to block `up_to` in chain order, under the listener lock."""
    cursor = ListenerCursor.objects.select_for_update().get(deployment=ctx.deployment)
    limit = min(up_to, cursor.scanned_to)
    events = list(ChainEvent.objects.filter(deployment=ctx.deployment, applied=False, block_number__lte=limit).order_by("block_number", "log_index"))
    touched: set[str] = set()
    for event in events:
        legs = _legs(ctx, event)
        journal_append(legs=legs, tx_hash=event.tx_hash, log_index=event.log_index, block_number=event.block_number, block_hash=event.block_hash)
        ChainEvent.objects.filter(pk=event.pk).update(applied=True)
        touched |= {acct.split(":", 1)[1] for leg in legs for acct in (leg.debit, leg.credit) if ":" in acct}
    if limit > cursor.applied_to:
        cursor.applied_to = limit
        cursor.save(update_fields=["applied_to", "updated_at"])
    if events:
        from market.streams import events as stream_events

        stream_events.operator_changed()  # batches confirmed, trades recorded or settled: the settlement queue moved
        stream_events.balances_changed(addresses=sorted(touched))  # each owner's escrow, live
    return len(events)

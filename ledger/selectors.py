"""Reads of the ledger for the money API and the wallet and trade pages.

Everything here comes from the database: the journal (confirmed chain events only),
the batches and the stored transactions. Nothing calls the chain, so these answer
even when no node is reachable.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db.models import Max, Q, Sum

from contracts.merkle import MerkleTree, receipt_leaf, verify_proof
from ledger.context import deployment_current
from ledger.journal import account_balances
from ledger.models import (
    BatchState,
    ChainEvent,
    ChainTx,
    ChainTxState,
    Cosign,
    CustodialKey,
    JournalEntry,
    RecordItem,
    SettleItem,
)
from market.models import AuditAction, AuditEvent, Trade, User
from market.states import TradeState
from providers.models import Provider


def _hex(b: bytes) -> str:
    return "0x" + b.hex()


def chain_info() -> dict[str, Any] | None:
    """The deployment in use, or None when there is no chain to settle on."""
    d = deployment_current()
    if d is None:
        return None
    return {"chain_id": d.chain_id, "market": d.market_address, "token": d.token_address}


def chain_public_rpc_url() -> str | None:
    """The node URL providers may use: CHAIN_PUBLIC_RPC_URL, else the embedded dev chain's
    own URL. A CHAIN_RPC_URL set for the server is never shown (it may carry an API key)."""
    from django.conf import settings

    cfg = settings.CONFIG
    if cfg.chain_public_rpc_url:
        return cfg.chain_public_rpc_url
    d = deployment_current()
    if d is None or cfg.chain_rpc_url:
        return None
    return d.rpc_url or None


def _tx(row: ChainTx | None) -> dict[str, Any] | None:
    if row is None:
        return None
    return {"tx_hash": row.tx_hash, "state": row.state, "block": row.block_number, "block_hash": row.block_hash or None}


# --- escrow ------------------------------------------------------------------------------------
def escrow_of(*, user: User | None = None, address: str | None = None) -> dict[str, Any]:
    """An account's escrow as the journal has it: free and locked balances, the locks per
    trade (what is still locked for each), and transactions of its key not yet final."""
    custodial = None
    if user is not None:
        custodial = CustodialKey.objects.filter(user=user).first()
        address = custodial.address if custodial is not None else (user.chain_address or None)
    out: dict[str, Any] = {"address": address, "custodial": custodial is not None, "free": 0, "locked": 0, "locks": [], "pending": []}
    if not address:
        return out
    balances = account_balances(prefix_filter=address)
    out["free"] = balances.get(f"free:{address}", 0)
    out["locked"] = balances.get(f"locked:{address}", 0)
    per_trade: dict[int, int] = defaultdict(int)
    account = f"locked:{address}"
    entries = JournalEntry.objects.filter(Q(debit__iexact=account) | Q(credit__iexact=account), trade_id__isnull=False)
    for e in entries.values("trade_id", "debit", "amount"):
        per_trade[e["trade_id"]] += e["amount"] if e["debit"].lower() == account.lower() else -e["amount"]
    items = {i.trade_id: i for i in RecordItem.objects.filter(trade_id__in=list(per_trade)).select_related("batch")}
    for trade_id in sorted(t for t, amount in per_trade.items() if amount):
        item = items.get(trade_id)
        out["locks"].append({"trade": trade_id, "amount": per_trade[trade_id], "deadline": item.deadline if item else None,
                             "batch": item.batch.number if item else None})
    open_states = (ChainTxState.SIGNED, ChainTxState.SENT, ChainTxState.MINED)
    for row in ChainTx.objects.filter(sender__iexact=address, state__in=open_states).order_by("id"):
        out["pending"].append({"purpose": row.purpose, "tx_hash": row.tx_hash, "state": row.state})
    return out


def earnings_of(*, provider: Provider, series_limit: int = 500) -> dict[str, Any]:
    """A provider's money, built only from journal entries (confirmed chain events), so each
    figure is the chain's to the unit. The one source for the earnings API, the provider page
    and `gridbid-agent earnings`. Token base units:

    * `settled`: what settlement batches paid it (price x GPU-seconds used; the share of a
      lock refunded to the buyer is never its money);
    * `paid`: `settled` less what disputes it lost gave back to buyers. A dispute it won
      counts once: the released amount is the payment coming back, not new earnings;
    * `held`: the part of `paid` held now in open disputes over its trades (from its free
      balance or its stake), with `disputes` counting open, won and lost ones and amounts;
    * `free` (withdrawable, the contract's `balance_of`), `withdrawn`, `stake`, `slashed`;
    * `payments`: per trade, newest first, what it paid and where its dispute stands;
    * `series`: (unix time, cumulative `paid` less `held`) after each event that moved it.
    """
    address = provider.chain_address or None
    disputes = {"open": 0, "held": 0, "won": 0, "won_amount": 0, "lost": 0, "lost_amount": 0}
    out: dict[str, Any] = {"provider": provider.pk, "address": address, "settled": 0, "paid": 0, "held": 0, "free": 0,
                           "withdrawn": 0, "stake": 0, "slashed": 0, "disputes": disputes, "payments": [], "series": []}
    if not address:
        return out
    free, stake = f"free:{address}", f"stake:{address}"
    mine = Q(debit__iexact=free) | Q(credit__iexact=free) | Q(debit__iexact=stake) | Q(credit__iexact=stake)
    balances = {k.lower(): v for k, v in account_balances(prefix_filter=address).items()}
    out["free"], out["stake"] = balances.get(free.lower(), 0), balances.get(stake.lower(), 0)
    pays = JournalEntry.objects.filter(kind="pay", debit__iexact=free)
    out["settled"] = int(pays.aggregate(total=Sum("amount"))["total"] or 0)
    out["withdrawn"] = int(JournalEntry.objects.filter(kind="withdraw", credit__iexact=free).aggregate(total=Sum("amount"))["total"] or 0)
    out["slashed"] = int(JournalEntry.objects.filter(kind="slash", credit__iexact=stake).aggregate(total=Sum("amount"))["total"] or 0)

    # disputes, trade by trade: what was held from this provider (its free balance or stake),
    # given back to it (won) or passed to the buyer (lost: that leg touches none of its accounts)
    holds = list(JournalEntry.objects.filter(mine, kind__in=["hold", "release"], trade_id__isnull=False).order_by("seq"))
    held_trades = {e.trade_id for e in holds if e.kind == "hold"}
    losses = list(JournalEntry.objects.filter(kind="refund", trade_id__in=held_trades, credit__startswith="held:").order_by("seq")) if held_trades else []
    held_now: dict[int, int] = defaultdict(int)
    outcome: dict[int, str] = {}
    for e in sorted([*holds, *losses], key=lambda e: e.seq):
        trade_id = int(e.trade_id)  # type: ignore[arg-type]
        if e.kind == "hold":
            held_now[trade_id] += e.amount
            outcome[trade_id] = "open"
        elif e.kind == "release":
            held_now[trade_id] -= e.amount
            outcome[trade_id] = "won"
            disputes["won_amount"] += e.amount
        elif e.credit == f"held:{trade_id}":
            held_now[trade_id] -= e.amount
            outcome[trade_id] = "lost"
            disputes["lost_amount"] += e.amount
    for state in outcome.values():
        disputes["open" if state == "open" else state] += 1
    disputes["held"] = out["held"] = sum(held_now.values())
    out["paid"] = out["settled"] - disputes["lost_amount"]

    per_trade = pays.exclude(trade_id__isnull=True).values("trade_id").annotate(paid=Sum("amount"), seq=Max("seq")).order_by("-trade_id")[:100]
    last = {e.seq: e for e in JournalEntry.objects.filter(seq__in=[row["seq"] for row in per_trade])}
    out["payments"] = [{"trade": row["trade_id"], "paid": int(row["paid"]), "dispute": outcome.get(row["trade_id"]),
                        "tx_hash": last[row["seq"]].tx_hash, "block": last[row["seq"]].block_number} for row in per_trade]

    if series_limit > 0:
        # paid less held after each confirmed event that moved it; events applied together share a point
        moves = JournalEntry.objects.filter(Q(kind="pay", debit__iexact=free) | Q(pk__in=[e.pk for e in holds])).order_by("seq")
        series: list[tuple[float, int]] = []
        running = 0
        for kind, amount, at in moves.values_list("kind", "amount", "created_at").iterator():
            running += -amount if kind == "hold" else amount
            t = round(at.timestamp(), 3)
            if series and t - series[-1][0] < 1:
                series[-1] = (series[-1][0], running)
            else:
                series.append((t, running))
        out["series"] = series[-series_limit:]
    return out


# --- one trade ---------------------------------------------------------------------------------
def trade_ledger(*, trade: Trade) -> dict[str, Any]:
    """Where a trade stands on chain: its record transaction and batch root (with the proof
    of its trade leaf), and its settlement transaction and the Merkle proof of its receipt
    leaf in the completion root, with the inputs to recompute that leaf."""
    out: dict[str, Any] = {"trade": trade.pk, "state": trade.state, "chain": chain_info(), "record": None, "settlement": None}
    item = RecordItem.objects.filter(trade=trade).select_related("batch__chain_tx").first()
    if item is not None:
        leaves = [bytes.fromhex(x[2:]) for x in item.batch.items.order_by("position").values_list("leaf", flat=True)]
        tree = MerkleTree(leaves)
        out["record"] = {
            "batch": item.batch.number, "state": item.batch.state, "root": item.batch.root, "tx": _tx(item.batch.chain_tx),
            "position": item.position, "leaf": item.leaf, "proof": [_hex(p) for p in tree.proof(item.position)], "lock": item.lock,
        }
    settle = SettleItem.objects.filter(trade=trade).select_related("batch__chain_tx").first()
    if settle is not None and settle.batch.state != BatchState.FAILED:
        rows = list(settle.batch.items.order_by("index").values_list("trade_id", "gpu_seconds", "digest"))
        tree = MerkleTree([receipt_leaf(t, gs, bytes.fromhex(d[2:])) for t, gs, d in rows])
        leaf = receipt_leaf(trade.pk, settle.gpu_seconds, bytes.fromhex(settle.digest[2:]))
        proof = tree.proof(settle.index)
        signed = Cosign.objects.filter(batch=settle.batch).exclude(signature="").count()
        out["settlement"] = {
            "state": settle.batch.state, "root": settle.batch.root, "message": settle.batch.message, "tx": _tx(settle.batch.chain_tx),
            "index": settle.index, "gpu_seconds": settle.gpu_seconds, "digest": settle.digest, "leaf": _hex(leaf),
            "proof": [_hex(p) for p in proof], "paid": settle.paid, "refund": settle.refund,
            "verified": verify_proof(leaf, proof, bytes.fromhex(settle.batch.root[2:]), settle.index),
            "cosigned": signed, "cosigners": settle.batch.cosigns.count(),
        }
    return out


def trade_visible(*, user: User, trade: Trade, operator: bool) -> bool:
    """Whether `user` may see `trade`: its buyer, its provider, or with `operator` (an
    operator's session, or a token with `operate`) anyone."""
    if operator:
        return True
    return trade.buyer_id == user.pk or Provider.objects.filter(pk=trade.provider_id, user=user).exists()


# --- a trade's dispute -------------------------------------------------------------------------
REQUEST_UNSENT_AFTER_S = 600  # a request with no transaction by then was not sent (the log says why)


def trade_dispute(*, trade: Trade) -> dict[str, Any]:
    """A trade's dispute as its page shows it: the dispute or ruling asked for and not yet
    applied from a confirmed event (``pending``: its transaction and that transaction's
    state), the chain's DisputeOpened (transaction, amount held, how much from the stake)
    and DisputeResolved, and when the dispute window closes(d), by the chain's clock as the
    dispute request read it."""
    import datetime as dt

    from django.utils import timezone

    out: dict[str, Any] = {"opened": None, "resolved": None, "pending": None, "failed": None, "window_closes": None}
    for e in ChainEvent.objects.filter(name__in=("DisputeOpened", "DisputeResolved"), args__trade_id=trade.pk).order_by("block_number", "log_index"):
        row = {"tx_hash": e.tx_hash, "block": e.block_number, "confirmed": e.applied, **e.args}
        out["opened" if e.name == "DisputeOpened" else "resolved"] = row
    requests = list(AuditEvent.objects.filter(object_type="trade", object_id=str(trade.pk),
                                              action__in=(AuditAction.TRADE_DISPUTE, AuditAction.TRADE_RULING)).order_by("-id")[:20])
    for r in requests:
        if r.action == AuditAction.TRADE_DISPUTE and isinstance(r.details.get("window_left_s"), int):
            out["window_closes"] = r.at + dt.timedelta(seconds=r.details["window_left_s"])
            break
    # what is still to come: a request the trade's state does not show yet
    waiting_for = {AuditAction.TRADE_DISPUTE: TradeState.SETTLED, AuditAction.TRADE_RULING: TradeState.DISPUTED}
    unapplied = {k: v for k, v in (("dispute", out["opened"]), ("ruling", out["resolved"])) if v and not v["confirmed"]}
    newest = requests[0] if requests else None
    if newest is None or trade.state != waiting_for[AuditAction(newest.action)]:
        return out
    action = "dispute" if newest.action == AuditAction.TRADE_DISPUTE else "ruling"
    keys = [k for k in newest.details.get("transactions") or [] if isinstance(k, str)]
    tx = ChainTx.objects.filter(key__in=keys).order_by("-id").first() if keys else None
    seen = unapplied.get(action)
    if tx is not None and tx.state == ChainTxState.FAILED:
        out["failed"] = {"action": action, "tx": _tx(tx), "error": tx.error}
    elif tx is not None or seen is not None:
        out["pending"] = {"action": action, "tx": _tx(tx) if tx else {"tx_hash": seen["tx_hash"], "state": "mined", "block": seen["block"], "block_hash": None},
                          "at": newest.at, "details": newest.details}
    elif keys and (timezone.now() - newest.at).total_seconds() < REQUEST_UNSENT_AFTER_S:
        out["pending"] = {"action": action, "tx": None, "at": newest.at, "details": newest.details}
    return out

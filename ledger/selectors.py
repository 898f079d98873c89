"""Reads of the ledger for the money API and the wallet and trade pages.

Everything here comes from the database: the journal (confirmed chain events only),
the batches and the stored transactions. Nothing calls the chain, so these answer
even when no node is reachable.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from django.db.models import Q

from contracts.merkle import MerkleTree, receipt_leaf, verify_proof
from ledger.context import deployment_current
from ledger.journal import account_balances
from ledger.models import (
    BatchState,
    ChainTx,
    ChainTxState,
    Cosign,
    CustodialKey,
    JournalEntry,
    RecordItem,
    SettleItem,
)
from market.models import Trade, User
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
    free, stake = f"free:{address}".lower(), f"stake:{address}".lower()
    mine = Q(debit__iexact=free) | Q(credit__iexact=free) | Q(debit__iexact=stake) | Q(credit__iexact=stake)
    entries = list(JournalEntry.objects.filter(mine).order_by("seq"))
    # trades whose dispute held money of this provider: what leaves their held account to a
    # buyer (a lost dispute) touches none of its accounts, so it is read by trade
    held_trades = {e.trade_id for e in entries if e.kind == "hold" and e.trade_id is not None}
    if held_trades:
        lost_legs = JournalEntry.objects.filter(kind="refund", trade_id__in=held_trades, credit__startswith="held:")
        entries = sorted([*entries, *lost_legs], key=lambda e: e.seq)
    balance = {free: 0, stake: 0}
    per_trade: dict[int, dict[str, Any]] = {}
    held_now: dict[int, int] = defaultdict(int)
    outcome: dict[int, str] = {}
    running = 0
    for e in entries:
        debit, credit = e.debit.lower(), e.credit.lower()
        if debit in balance:
            balance[debit] += e.amount
        if credit in balance:
            balance[credit] -= e.amount
        trade = per_trade.setdefault(e.trade_id, {"trade": e.trade_id, "paid": 0, "dispute": None, "tx_hash": e.tx_hash, "block": e.block_number}) \
            if e.trade_id is not None else None
        moved = 0
        if e.kind == "pay" and debit == free:
            out["settled"] += e.amount
            moved = e.amount
            if trade is not None:
                trade.update(paid=trade["paid"] + e.amount, tx_hash=e.tx_hash, block=e.block_number)
        elif e.kind == "hold" and credit in balance and e.trade_id is not None:
            held_now[e.trade_id] += e.amount
            outcome[e.trade_id] = "open"
            moved = -e.amount
        elif e.kind == "release" and debit in balance and e.trade_id is not None:
            held_now[e.trade_id] -= e.amount
            outcome[e.trade_id] = "won"
            disputes["won_amount"] += e.amount
            moved = e.amount
        elif e.kind == "refund" and e.trade_id in held_trades and credit == f"held:{e.trade_id}":
            held_now[e.trade_id] -= e.amount
            outcome[e.trade_id] = "lost"
            disputes["lost_amount"] += e.amount
        elif e.kind == "withdraw" and credit == free:
            out["withdrawn"] += e.amount
        elif e.kind == "slash" and credit == stake:
            out["slashed"] += e.amount
        if moved:
            running += moved
            out["series"].append((round(e.created_at.timestamp(), 3), running))
    for trade_id, state in outcome.items():
        if state == "won":
            disputes["won"] += 1
        elif state == "lost":
            disputes["lost"] += 1
        else:
            disputes["open"] += 1
        if trade_id in per_trade:
            per_trade[trade_id]["dispute"] = state
    disputes["held"] = sum(held_now.values())
    out["held"] = disputes["held"]
    out["paid"] = out["settled"] - disputes["lost_amount"]
    out["free"], out["stake"] = balance[free], balance[stake]
    out["payments"] = sorted((t for t in per_trade.values() if t["paid"]), key=lambda t: -t["trade"])[:100]
    # one point per moment: events applied together share their time
    series: list[tuple[float, int]] = []
    for at, value in out["series"]:
        if series and at - series[-1][0] < 1:
            series[-1] = (series[-1][0], value)
        else:
            series.append((at, value))
    out["series"] = series[-series_limit:] if series_limit > 0 else []
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


def trade_visible(*, user: User, trade: Trade) -> bool:
    if user.is_operator:
        return True
    return trade.buyer_id == user.pk or Provider.objects.filter(pk=trade.provider_id, user=user).exists()

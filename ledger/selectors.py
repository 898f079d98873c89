"""Reads of the ledger for the money API and the wallet and trade pages.

Everything here comes from the database: the journal (confirmed chain events only),
the batches and the stored transactions. Nothing calls the chain, so these answer
even when no node is reachable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from contracts.merkle import MerkleTree, receipt_leaf, verify_proof
from ledger.context import deployment_current
from ledger.models import (
    BatchState,
    ChainEvent,
    ChainTx,
    ChainTxState,
    Cosign,
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


@dataclass(frozen=True)
class TradeMoney:
    """A trade's money as the chain moved it (confirmed journal legs, token base units):
    locked from the buyer's escrow when recorded; at settlement, paid to the provider for
    the GPU-time used and the rest refunded (a dispute the buyer wins refunds what was paid)."""

    locked: int = 0
    paid: int = 0
    refunded: int = 0

    @property
    def open(self) -> int:
        """Still locked: neither paid nor refunded yet."""
        return max(0, self.locked - self.paid - self.refunded)


def trades_money(trade_ids: list[int]) -> dict[int, TradeMoney]:
    """Per trade, what the journal says was locked, paid and refunded (absent: nothing yet)."""
    sums: dict[int, dict[str, int]] = {}
    rows = JournalEntry.objects.filter(trade_id__in=trade_ids, kind__in=("lock", "pay", "refund")).values_list("trade_id", "kind", "credit", "amount")
    for trade_id, kind, credit, amount in rows:
        k = sums.setdefault(int(trade_id), {"lock": 0, "pay": 0, "refund": 0})
        k[kind] += int(amount)
        if kind == "refund" and str(credit).startswith("held:"):
            k["pay"] -= int(amount)  # a dispute the buyer won: what was paid came back
    return {t: TradeMoney(locked=k["lock"], paid=k["pay"], refunded=k["refund"]) for t, k in sums.items()}


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

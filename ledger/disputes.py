"""Disputes: a buyer contests a settled trade inside the dispute window, the arbiter rules.

The contract takes the trade and its receipt again, each with its Merkle proof (against
the record root and the settled completion root); ``dispute_call`` builds that call from
the ledger's own records. A custodial buyer's dispute is signed with its custodial key
and sent by the server; a wallet buyer gets the call to send from its wallet. The arbiter
rules through the server when the server's operator key is the contract's arbiter (the
dev chain); otherwise it gets the call to send from the arbiter's wallet.

The money moves (the hold, the release or refund and slash) reach the journal from the
confirmed events, like every other movement.
"""

from __future__ import annotations

import logging
from typing import Any

from django.db import transaction

from ledger.custody import custodial_signer
from ledger.escrow import UNREACHABLE, ChainUnavailable, chain_for_writes
from ledger.models import BatchState, CustodialKey, RecordItem, SettleItem
from ledger.outbox import tx_submit
from ledger.selectors import REQUEST_UNSENT_AFTER_S, trade_dispute, trade_ledger
from ledger.services import recorded_trade
from ledger.wallet import is_wallet_buyer
from market.audit import AuditAction, audit_record
from market.errors import Conflict, DomainError
from market.models import Trade, User
from market.states import TradeState

# GridBidMarket.vy's MAX_SLASH_MULTIPLE: a slash takes at most this multiple of what the
# disputed trade paid (tests/integration/test_settle_bounds.py keeps the two equal)
MAX_SLASH_MULTIPLE = 2

log = logging.getLogger("gridbid.ledger.disputes")

__all__ = ["dispute_args", "dispute_request", "ruling_request"]


def dispute_args(trade: Trade) -> tuple[Any, ...]:
    """The arguments of the contract's ``dispute`` for ``trade`` (settled, with a confirmed
    record and settlement): the trade and its receipt, each with its Merkle proof."""
    ledger = trade_ledger(trade=trade)
    record, settlement = ledger["record"], ledger["settlement"]
    confirmed = (record or {}).get("state") == BatchState.CONFIRMED and (settlement or {}).get("state") == BatchState.CONFIRMED
    if not confirmed or record["batch"] is None:
        raise Conflict(f"Trade {trade.pk} has no confirmed settlement on chain to dispute.")
    return (
        recorded_trade(RecordItem.objects.get(trade=trade)).as_abi(),
        int(record["batch"]),
        record["position"],
        [bytes.fromhex(p[2:]) for p in record["proof"]],
        settlement["gpu_seconds"],
        bytes.fromhex(settlement["digest"][2:]),
        bytes.fromhex(settlement["root"][2:]),
        settlement["index"],
        [bytes.fromhex(p[2:]) for p in settlement["proof"]],
    )


def _window_left(ctx: Any, args: tuple[Any, ...]) -> int:
    """Seconds left to dispute, by the chain's own clock (``args``: the dispute's, root at 6)."""
    settled_at = int(ctx.client.view(ctx.market, "settled_at", args[6]))
    window = int(ctx.client.view(ctx.market, "dispute_window"))
    return settled_at + window - ctx.client.block_timestamp()


def _calldata(ctx: Any, name: str, args: tuple[Any, ...], sender: str) -> dict[str, Any]:
    """A call for the user's own wallet to send (eth_sendTransaction fields)."""
    data = ctx.market.encode_abi(name, args=list(args))
    return {"to": ctx.deployment.market_address, "from": sender, "data": data, "chain_id": ctx.chain_id}


def _refusal(trade: Trade, dispute: str | None, message: str) -> Conflict:
    exc = Conflict(message)
    exc.details = {"trade": trade.pk, "state": trade.state, "dispute": dispute}
    return exc


def _disputed_once(trade: Trade) -> None:
    """Refuse a dispute of a trade that is not settled, or whose dispute is on its way, open
    or ruled on (the trade is settled again after a ruling for the provider, and closed on
    chain for good). Without this a second request was answered "accepted" while its
    transaction, which would revert, was never sent."""
    seen = trade_dispute(trade=trade)
    resolved, pending = seen["resolved"], seen["pending"]
    if trade.state != TradeState.SETTLED:
        dispute = "open" if trade.state == TradeState.DISPUTED else "resolved" if resolved is not None else None
        raise _refusal(trade, dispute, f"Trade {trade.pk} is {trade.state}: only a settled trade can be disputed, once, inside its dispute window.")
    if resolved is not None:
        outcome = "the provider was paid" if resolved.get("provider_paid") else "the buyer was refunded"
        raise _refusal(trade, "resolved", f"Trade {trade.pk} is settled and its dispute was already ruled on ({outcome}, transaction "
                                          f"{resolved['tx_hash']}): a trade is disputed once, and the ruling is final.")
    if pending is not None and pending["action"] == "dispute":
        tx = pending["tx"]
        if tx is None:
            raise _refusal(trade, "pending", f"Trade {trade.pk} is settled and its dispute, accepted at {pending['at']:%Y-%m-%d %H:%M:%S} UTC, "
                                             f"is pending: its transaction is not sent yet. If none is sent within {REQUEST_UNSENT_AFTER_S // 60} "
                                             f"minutes of that, dispute again (GET /api/v1/ledger/trades/{trade.pk}/ shows the trade).")
        raise _refusal(trade, "pending", f"Trade {trade.pk} is settled and its dispute is pending: transaction {tx['tx_hash']} is {tx['state']}. "
                                         f"Wait for the chain to confirm it; the trade is then disputed (GET /api/v1/ledger/trades/{trade.pk}/).")
    if seen["opened"] is not None:  # sent from a wallet and seen on chain, not yet applied here
        raise _refusal(trade, "pending", f"Trade {trade.pk} is settled and its dispute is pending: transaction {seen['opened']['tx_hash']} "
                                         f"opened it on chain; the trade is disputed once that is confirmed.")


def dispute_request(*, user: User, trade: Trade, key: str) -> dict[str, Any]:
    """Dispute a settled trade of ``user``'s. Custodial buyers: checked, then sent once the
    database transaction commits (once per ``key``). Wallet buyers: the call to send."""
    if trade.buyer_id != user.pk:
        raise Conflict("Only the buyer of a trade can dispute it.")
    _disputed_once(trade)
    ctx = chain_for_writes()
    args = dispute_args(trade)
    try:
        left = _window_left(ctx, args)
    except UNREACHABLE as exc:
        raise ChainUnavailable(f"The chain node does not answer ({exc}).") from exc
    if left < 0:
        raise Conflict(f"The dispute window of trade {trade.pk} closed {-left:,} s ago.")
    if is_wallet_buyer(user):
        audit_record(actor=user, action=AuditAction.TRADE_DISPUTE, obj=trade, details={"state": "sign in your wallet", "window_left_s": left})
        return {"action": "dispute", "trade": trade.pk, "state": "sign in your wallet",
                "window_left_s": left, "call": _calldata(ctx, "dispute", args, user.chain_address)}
    signer = custodial_signer(CustodialKey.objects.get(user=user))

    def send() -> None:
        try:
            live = chain_for_writes()
            tx_submit(client=live.client, signer=signer, key=f"dispute:{key}", purpose="dispute",
                      call=live.market.functions.dispute(*args))
        except (*UNREACHABLE, ChainUnavailable, Conflict) as exc:
            log.warning("dispute of trade %s (%s) not sent: %s", trade.pk, key, exc)

    transaction.on_commit(send)
    audit_record(actor=user, action=AuditAction.TRADE_DISPUTE, obj=trade, details={"state": "accepted", "window_left_s": left, "transactions": [f"dispute:{key}"]})
    return {"action": "dispute", "trade": trade.pk, "state": "accepted", "window_left_s": left,
            "transactions": [f"dispute:{key}"]}


def ruling_request(*, trade: Trade, pay_provider: Any, slash: Any, key: str, actor: User | None = None) -> dict[str, Any]:
    """The arbiter's ruling on a disputed trade: ``pay_provider`` (bool) and ``slash`` (token
    base units from the provider's stake, only when the buyer was right). ``actor``: the
    operator who rules, for the audit log."""
    errors: dict[str, list[str]] = {}
    if not isinstance(pay_provider, bool):
        errors["pay_provider"] = ["true (the provider was right: it keeps the payment) or false (refund the buyer)."]
    if isinstance(slash, bool) or not isinstance(slash, int) or slash < 0 or slash >= 2**255:
        errors["slash"] = ["A whole number of token base units, 0 or more."]
    elif pay_provider is True and slash:
        errors["slash"] = ["Only a provider found at fault is slashed: send 0 with pay_provider true."]
    if errors:
        raise DomainError("Invalid input. " + "; ".join(f"{k}: {v[0]}" for k, v in errors.items()), fields=errors)
    if trade.state != TradeState.DISPUTED:
        raise Conflict(f"Trade {trade.pk} is {trade.state}: only a disputed trade takes a ruling.")
    paid = SettleItem.objects.filter(trade=trade).values_list("paid", flat=True).first()
    if paid is not None and slash > MAX_SLASH_MULTIPLE * paid:
        bound = MAX_SLASH_MULTIPLE * paid
        message = (f"At most {bound} base units: a slash is bounded by {MAX_SLASH_MULTIPLE}x what the trade paid "
                   f"({paid}), and the contract refuses more.")
        raise DomainError("Invalid input. slash: " + message, fields={"slash": [message]})
    ctx = chain_for_writes()
    args = (trade.pk, pay_provider, slash)
    try:
        arbiter = str(ctx.client.view(ctx.market, "arbiter"))
    except UNREACHABLE as exc:
        raise ChainUnavailable(f"The chain node does not answer ({exc}).") from exc
    ruling = {"pay_provider": pay_provider, "slash": slash}
    if arbiter.lower() != ctx.operator.address.lower():
        audit_record(actor=actor, action=AuditAction.TRADE_RULING, obj=trade, details={**ruling, "state": "sign with the arbiter's wallet"})
        return {"action": "ruling", "trade": trade.pk, "state": "sign with the arbiter's wallet",
                "call": _calldata(ctx, "resolve_dispute", args, arbiter)}

    def send() -> None:
        try:
            live = chain_for_writes()
            tx_submit(client=live.client, signer=live.operator, key=f"ruling:{key}", purpose="ruling",
                      call=live.market.functions.resolve_dispute(*args))
        except (*UNREACHABLE, ChainUnavailable) as exc:
            log.warning("ruling on trade %s (%s) not sent: %s", trade.pk, key, exc)

    transaction.on_commit(send)
    audit_record(actor=actor, action=AuditAction.TRADE_RULING, obj=trade, details={**ruling, "state": "accepted", "transactions": [f"ruling:{key}"]})
    return {"action": "ruling", "trade": trade.pk, "state": "accepted", "transactions": [f"ruling:{key}"]}

"""What the ledger tells the rest of the market, without importing it (DESIGN.md: ledger
may import market's models and states only; market connects to these)."""

from __future__ import annotations

from django.dispatch import Signal

# Confirmed chain events moved trades to a new state (recorded, settled, refunded,
# disputed). Sent inside the listener's transaction, so a receiver's writes commit or roll
# back with the event: kwargs `trade_ids` (list of int), `state` (a TradeState value) and
# `cause` (the chain event's name: "BatchSettled", "DisputeResolved", ...), so a receiver
# can tell a batch's settlement from an arbiter's ruling that also ends in `settled`.
trades_moved = Signal()

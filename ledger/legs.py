"""What each market event moves: the journal legs of one event, derived from the event's
arguments and, for a record or settle batch, its transaction's call as the ABI decodes it
(the event carries only totals; the calldata names every trade).

Pure: no database, no chain. The listener (ledger/listener.py) writes these legs as the
events are confirmed; `ledger verify` (ledger/journal.py) derives them again from the
chain and compares, so the two can never disagree on what an event means.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from contracts.batches import recorded_of, settled_of

# the events whose legs need their transaction's call, and the function it must call
CALL_OF = {"TradesRecorded": "record_trades", "BatchSettled": "settle_batch"}


class DerivationError(Exception):
    """An event's legs cannot be derived from what was given (no call, another function)."""


@dataclass(frozen=True)
class Leg:
    kind: str
    debit: str
    credit: str
    amount: int
    trade_id: int | None = None


def _call_args(name: str, call: Any) -> Mapping[str, Any]:
    want = CALL_OF[name]
    if call is None:
        raise DerivationError(f"{name}: its transaction does not call the market directly (no {want} calldata)")
    if call.function != want:
        raise DerivationError(f"{name}: its transaction calls {call.function}, not {want}")
    args: Mapping[str, Any] = call.args
    return args


def event_legs(name: str, args: Mapping[str, Any], *, call: Any = None, opened: Mapping[str, Any] | None = None) -> list[Leg]:
    """The legs of one market event, in the order they are journaled (zero legs included:
    the journal skips them but counts them in `leg`).

    `call`: the decoded call of the event's transaction (a `ledger.chain.ContractCall`:
    `.function`, `.args` by the ABI's names), needed for the names in `CALL_OF`.
    `opened`: for `DisputeResolved`, the args of the trade's `DisputeOpened`."""
    a = args
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
        c = _call_args(name, call)
        trades = recorded_of([(o["buyer"], int(o["terms"])) for o in c["orders"]], list(c["providers"]), [int(t) for t in c["trades"]])
        if len(trades) != int(a["trades"]) or sum(t.lock for t in trades) != int(a["locked"]):
            raise DerivationError(f"TradesRecorded {a['root']}: its call locks {len(trades)} trades, {sum(t.lock for t in trades)} in all; "
                                  f"the event says {a['trades']}, {a['locked']}")
        return [Leg("lock", f"locked:{t.buyer}", f"free:{t.buyer}", t.lock, t.trade_id) for t in trades]
    if name == "BatchSettled":
        c = _call_args(name, call)
        done = settled_of([(int(r["terms"]), int(r["place"]), r["digest"]) for r in c["receipts"]], list(c["buyers"]),
                          [s["account"] for s in c["signers"]])
        legs = []
        for d in done:
            t, paid = d.trade, d.trade.payment(d.gpu_seconds)
            legs.append(Leg("pay", f"free:{t.provider}", f"locked:{t.buyer}", paid, t.trade_id))
            legs.append(Leg("refund", f"free:{t.buyer}", f"locked:{t.buyer}", t.lock - paid, t.trade_id))
        if len(done) != int(a["trades"]) or sum(leg.amount for leg in legs[::2]) != int(a["paid"]):
            raise DerivationError(f"BatchSettled {a['root']}: its call settles {len(done)} trades paying {sum(leg.amount for leg in legs[::2])}; "
                                  f"the event says {a['trades']}, {a['paid']}")
        return legs
    if name == "TradeRefunded":
        return [Leg("refund", f"free:{a['buyer']}", f"locked:{a['buyer']}", int(a["amount"]), int(a["trade_id"]))]
    if name == "DisputeOpened":
        provider, held, trade_id, from_stake = a["provider"], int(a["held"]), int(a["trade_id"]), int(a["from_stake"])
        return [Leg("hold", f"held:{trade_id}", f"free:{provider}", held - from_stake, trade_id),
                Leg("hold", f"held:{trade_id}", f"stake:{provider}", from_stake, trade_id)]
    if name == "DisputeResolved":
        trade_id = int(a["trade_id"])
        if opened is None:
            raise DerivationError(f"DisputeResolved for trade {trade_id} without a DisputeOpened")
        buyer, provider = opened["buyer"], opened["provider"]
        if a["provider_paid"]:
            restaked = int(a["restaked"])
            return [Leg("release", f"free:{provider}", f"held:{trade_id}", int(a["amount"]) - restaked, trade_id),
                    Leg("release", f"stake:{provider}", f"held:{trade_id}", restaked, trade_id)]
        return [Leg("refund", f"free:{buyer}", f"held:{trade_id}", int(a["amount"]), trade_id),
                Leg("slash", f"free:{buyer}", f"stake:{provider}", int(a["slashed"]), trade_id)]
    return []  # ExitRequested, PausedSet, OperatorChanged, ArbiterChanged move no money

"""Domain events: the one way any part of the server says that something happened.

A service announces a small frozen dataclass; it neither knows nor imports who reacts.
Who reacts to what is one table, `market.apps.MarketConfig.ready()`, in the style of
cosmicpython's bootstrap. A handler is one of two kinds:

- **now**: runs at once, inside the announcer's transaction, so what it writes commits or
  rolls back with the event (a booking's GPUs given back, webhook deliveries written);
- **after commit**: runs once the transaction commits, and never when it rolls back (live
  stream messages, tasks enqueued). Payloads are read then, so a subscriber never sees a
  state the database rolled back. Outside a transaction it runs at once.

After-commit handlers are queued when the event is announced, so they run in the order
their events were. This module imports no project code: every layer may announce.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from django.db import transaction


@dataclass(frozen=True)
class Event:
    """The base of every event."""


# --- orders, rounds and the book -----------------------------------------------------------------
@dataclass(frozen=True)
class BidChanged(Event):
    """A bid was placed, amended, cancelled or moved state: its buyer's ``orders`` channel."""

    bid_id: int
    user_id: int


@dataclass(frozen=True)
class BookChanged(Event):
    """The open orders of one (GPU model, region) book changed."""

    gpu_model: str
    region: str


@dataclass(frozen=True)
class RoundCleared(Event):
    """An auction round cleared (its trades, if any, are written); the bids it left open,
    which its buyers hear about again (their explanations changed). They come with the
    event: the round's stored result holds them, with every reason, megabytes at 10k bids."""

    round_id: int
    unmatched_bid_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class TradesMatched(Event):
    """A round matched bids to offers: these trades are new."""

    trade_ids: tuple[int, ...]


# --- jobs, machines and money --------------------------------------------------------------------
@dataclass(frozen=True)
class JobsChanged(Event):
    """Jobs moved (state, progress), or their trades' money did (recorded, settled, refunded)."""

    job_ids: tuple[int, ...] = ()
    trade_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class CheckpointKept(Event):
    """A preempted job's checkpoint is kept by the market now (its agent uploaded it)."""

    job_id: int


@dataclass(frozen=True)
class JobReached(Event):
    """A job reached a new state (running, completed, failed, preempted, ...)."""

    job_id: int


@dataclass(frozen=True)
class MachinesChanged(Event):
    """Machines sent a heartbeat or went quiet; `states_changed` when one came or went."""

    machine_ids: tuple[int, ...]
    states_changed: bool = False


@dataclass(frozen=True)
class OperatorChanged(Event):
    """Rounds, the settlement queue or job states moved: the operator's overview."""


@dataclass(frozen=True)
class TradesMoved(Event):
    """Confirmed chain events moved trades to `state` (a TradeState value); `cause` is the
    chain event's name ("BatchSettled", "DisputeResolved", ...), so a batch's settlement
    and an arbiter's ruling that also ends in `settled` can be told apart."""

    trade_ids: tuple[int, ...]
    state: str
    cause: str = ""


@dataclass(frozen=True)
class BalancesChanged(Event):
    """Confirmed chain events moved the escrow of these addresses."""

    addresses: tuple[str, ...]


# --- accounts and what they are told -------------------------------------------------------------
@dataclass(frozen=True)
class TokenRevoked(Event):
    """An API token was revoked: the sockets it opened close."""

    token_id: int


@dataclass(frozen=True)
class UserDeactivated(Event):
    """An account was disabled: all its sockets close."""

    user_id: int


@dataclass(frozen=True)
class WebhookDeliveriesWritten(Event):
    """Webhook deliveries were written (an outbox): they are sent once they commit."""

    delivery_ids: tuple[int, ...]


@dataclass(frozen=True)
class EmailsWanted(Event):
    """Notification emails to send once the transaction commits: (user id, event type, data)."""

    mails: tuple[tuple[int, str, dict[str, Any]], ...] = field(default=())


# --- the one table of who reacts -----------------------------------------------------------------
Handler = Callable[[Any], None]

_now: dict[type[Event], list[Handler]] = {}
_after_commit: dict[type[Event], list[Handler]] = {}


def subscribe(*, now: Mapping[type[Event], Sequence[Handler]], after_commit: Mapping[type[Event], Sequence[Handler]]) -> None:
    """Install the handlers (MarketConfig.ready() calls this once; a second call replaces them)."""
    _now.clear()
    _after_commit.clear()
    for table, given in ((_now, now), (_after_commit, after_commit)):
        for event_type, handlers in given.items():
            table[event_type] = list(handlers)


def handlers_of(event_type: type[Event]) -> tuple[list[Handler], list[Handler]]:
    """The handlers of one event type: (now, after commit)."""
    return list(_now.get(event_type, [])), list(_after_commit.get(event_type, []))


def announce(event: Event) -> None:
    """Something happened: run its `now` handlers, and queue its after-commit ones."""
    for handler in _now.get(type(event), ()):
        handler(event)
    for handler in _after_commit.get(type(event), ()):
        transaction.on_commit(partial(handler, event))

"""Explicit state machines for bids, offers, rounds, trades and jobs.

Each machine is a table of allowed moves. Services change a row's state only
through `advance()`, which refuses any move the table does not list, so a
cancelled bid can never be matched and a settled trade can never be refunded.
"""

from __future__ import annotations

from collections.abc import Mapping

from django.db import models


class InvalidTransition(Exception):
    def __init__(self, kind: str, current: str, target: str) -> None:
        super().__init__(f"a {kind} that is {current} cannot become {target}")
        self.kind, self.current, self.target = kind, current, target


class BidState(models.TextChoices):
    OPEN = "open"
    MATCHED = "matched"
    CANCELLED = "cancelled"
    EXPIRED = "expired"


class OfferState(models.TextChoices):
    OPEN = "open"
    PAUSED = "paused"  # machine offline, or paused by its provider
    WITHDRAWN = "withdrawn"


class RoundState(models.TextChoices):
    CLEARING = "clearing"
    CLEARED = "cleared"
    FAILED = "failed"


class TradeState(models.TextChoices):
    PENDING = "pending"  # matched, not yet recorded on chain
    RECORDED = "recorded"  # buyer's funds locked on chain
    SETTLED = "settled"  # provider paid, unused time refunded
    REFUNDED = "refunded"  # lock returned to the buyer
    DISPUTED = "disputed"


class BookingState(models.TextChoices):
    HELD = "held"  # its GPUs are taken
    RELEASED = "released"  # its GPUs came back: the job ended, the trade was refunded or the booking ran out


class JobState(models.TextChoices):
    ASSIGNED = "assigned"
    RUNNING = "running"
    CHECKPOINTED = "checkpointed"
    PREEMPTED = "preempted"  # taken back for a higher class or by the operator: resumes from its checkpoint
    STOPPED = "stopped"  # its buyer stopped it: billed for what ran, never resumed
    COMPLETED = "completed"
    FAILED = "failed"
    REFUNDED = "refunded"


TRANSITIONS: Mapping[str, Mapping[str, frozenset[str]]] = {
    "bid": {
        BidState.OPEN: frozenset({BidState.MATCHED, BidState.CANCELLED, BidState.EXPIRED}),
        BidState.MATCHED: frozenset(),
        BidState.CANCELLED: frozenset(),
        BidState.EXPIRED: frozenset(),
    },
    "offer": {
        OfferState.OPEN: frozenset({OfferState.PAUSED, OfferState.WITHDRAWN}),
        OfferState.PAUSED: frozenset({OfferState.OPEN, OfferState.WITHDRAWN}),
        OfferState.WITHDRAWN: frozenset(),
    },
    "round": {
        RoundState.CLEARING: frozenset({RoundState.CLEARED, RoundState.FAILED}),
        RoundState.CLEARED: frozenset(),
        RoundState.FAILED: frozenset(),
    },
    "trade": {
        TradeState.PENDING: frozenset({TradeState.RECORDED, TradeState.REFUNDED}),
        TradeState.RECORDED: frozenset({TradeState.SETTLED, TradeState.REFUNDED}),
        TradeState.SETTLED: frozenset({TradeState.DISPUTED}),
        TradeState.DISPUTED: frozenset({TradeState.SETTLED, TradeState.REFUNDED}),
        TradeState.REFUNDED: frozenset(),
    },
    "booking": {
        BookingState.HELD: frozenset({BookingState.RELEASED}),
        BookingState.RELEASED: frozenset(),
    },
    "job": {
        JobState.ASSIGNED: frozenset({JobState.RUNNING, JobState.FAILED, JobState.REFUNDED, JobState.PREEMPTED, JobState.STOPPED}),
        JobState.RUNNING: frozenset({JobState.CHECKPOINTED, JobState.PREEMPTED, JobState.STOPPED, JobState.COMPLETED, JobState.FAILED}),
        JobState.CHECKPOINTED: frozenset({JobState.RUNNING, JobState.PREEMPTED, JobState.STOPPED, JobState.COMPLETED, JobState.FAILED}),
        JobState.PREEMPTED: frozenset({JobState.REFUNDED}),
        JobState.STOPPED: frozenset({JobState.REFUNDED}),
        JobState.COMPLETED: frozenset(),
        JobState.FAILED: frozenset({JobState.REFUNDED}),
        JobState.REFUNDED: frozenset(),
    },
}


def can_advance(kind: str, current: str, target: str) -> bool:
    return target in TRANSITIONS[kind][current]


def advance(kind: str, row: models.Model, target: str) -> None:
    """Move `row.state` to `target`, or raise InvalidTransition."""
    current = row.state  # type: ignore[attr-defined]
    if not can_advance(kind, current, target):
        raise InvalidTransition(kind, current, target)
    row.state = target  # type: ignore[attr-defined]

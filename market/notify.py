"""Telling accounts what happened to their orders: webhooks (market.webhooks) and emails.

These are handlers of the domain events (market.events), run inside the announcing
transaction: a round's write (TradesMatched), a job's report (JobReached: running,
completed, failed, preempted), and the ledger's confirmed chain events (TradesMoved:
payment settled, dispute ruled). Both parties of a trade
are told, each event saying which one it is (`role`). Webhook deliveries are written in
the same transaction; emails are enqueued after it commits (EmailsWanted), to accounts that have an
email address and have not turned them off.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime
from typing import Any

from django.conf import settings
from django.core.mail import send_mail

from market.events import EmailsWanted, JobReached, TradesMatched, TradesMoved, announce
from market.jobs import job_preemption
from market.models import Job, Trade, User
from market.states import JobState, TradeState
from market.webhooks import EVENT_TYPES, Event, deliveries_create

JOB_EVENTS = {
    JobState.RUNNING: "job.running",
    JobState.COMPLETED: "job.completed",
    JobState.FAILED: "job.failed",
    JobState.PREEMPTED: "job.preempted",
    JobState.STOPPED: "job.stopped",
}
TRADE_FIELDS = ("id", "bid_id", "offer_id", "gpu_model_id", "region_id", "price", "gpus", "duration_s", "amount", "state", "buyer_id", "provider__user_id")


def _iso(at: datetime | None) -> str | None:
    return at.isoformat() if at else None


def _trades(trade_ids: Iterable[int]) -> list[dict[str, Any]]:
    rows = Trade.objects.filter(pk__in=list(trade_ids)).order_by("id").values(*TRADE_FIELDS)
    return [
        {"id": r["id"], "bid": r["bid_id"], "offer": r["offer_id"], "gpu_model": r["gpu_model_id"], "region": r["region_id"], "price": r["price"],
         "gpus": r["gpus"], "duration_s": r["duration_s"], "amount": r["amount"], "state": r["state"],
         "_buyer": r["buyer_id"], "_provider": r["provider__user_id"]}
        for r in rows
    ]


def _public(trade: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in trade.items() if not k.startswith("_")}


def _both(trade: dict[str, Any], event_type: str, data: dict[str, Any]) -> list[Event]:
    """The event for the trade's buyer and for its provider (one account may be both)."""
    parties = {trade["_buyer"]: "buyer", trade["_provider"]: "provider"}
    return [Event(user_id=user_id, type=event_type, data={**data, "role": role}) for user_id, role in parties.items()]


def emit(events: list[Event]) -> None:
    """Webhook deliveries now (in the caller's transaction), emails after the commit."""
    if not events:
        return
    deliveries_create(events=events)
    readers = set(User.objects.filter(pk__in={e.user_id for e in events}, email_notifications=True).exclude(email="").values_list("pk", flat=True))
    mails = [(e.user_id, e.type, e.data) for e in events if e.user_id in readers]
    if mails:
        announce(EmailsWanted(mails=tuple(mails)))


# --- where events happen -----------------------------------------------------------------------
def trades_matched(event: TradesMatched) -> None:
    """A round matched bids: each buyer is told per bid, each provider per bid it sold to."""
    trade_ids = list(event.trade_ids)
    job_of = dict(Job.objects.filter(trade_id__in=trade_ids).values_list("trade_id", "pk"))
    by_party: dict[tuple[int, int, str], list[dict[str, Any]]] = {}
    for trade in _trades(trade_ids):
        by_party.setdefault((trade["bid"], trade["_buyer"], "buyer"), []).append(trade)
        by_party.setdefault((trade["bid"], trade["_provider"], "provider"), []).append(trade)
    emit([
        Event(user_id=user_id, type="bid.matched", data={"bid": bid_id, "role": role, "trades": [_public(t) | {"job": job_of.get(t["id"])} for t in trades]})
        for (bid_id, user_id, role), trades in sorted(by_party.items())
    ])


def job_reached(event: JobReached) -> None:
    """A job reached a state its parties are told about (running, completed, failed, preempted)."""
    job = Job.objects.get(pk=event.job_id)
    event_type = JOB_EVENTS.get(job.state)
    if event_type is None:
        return
    trade = _trades([job.trade_id])[0]
    meta = job.checkpoint or {}
    data: dict[str, Any] = {
        "job": {"id": job.pk, "trade": job.trade_id, "state": job.state, "started_at": _iso(job.started_at), "ended_at": _iso(job.ended_at),
                "exit_code": job.exit_code, "gpu_seconds": job.gpu_seconds, "reason": meta.get("reason", "")},
        "trade": _public(trade),
    }
    if job.state == JobState.PREEMPTED:
        data["preemption"] = job_preemption(job)
    events = _both(trade, event_type, data)
    resume = meta.get("resume_from")
    if job.state == JobState.RUNNING and resume:
        # the rest of a preempted job: running, and resumed, from the checkpoint it names
        events += _both(trade, "job.resumed", {**data, "resumed_from": {"trade": resume.get("trade"), "sha256": resume.get("sha256"), "size": resume.get("size")}})
    emit(events)


def trades_moved(event: TradesMoved) -> None:
    """The ledger's listener moved trades: a batch settled, or the arbiter ruled on a
    dispute (for the provider: settled; for the buyer: refunded)."""
    if event.cause == "DisputeResolved":
        outcome = "provider_paid" if event.state == TradeState.SETTLED else "buyer_refunded"
        emit([e for t in _trades(event.trade_ids) for e in _both(t, "dispute.ruled", {"trade": _public(t), "outcome": outcome})])
    elif event.state == TradeState.SETTLED:
        emit([e for t in _trades(event.trade_ids) for e in _both(t, "payment.settled", {"trade": _public(t)})])


# --- email -------------------------------------------------------------------------------------
def _subject(event_type: str, data: dict[str, Any]) -> str:
    job = data.get("job") or {}
    trade = data.get("trade") or {}
    if event_type == "bid.matched":
        n = len(data.get("trades", []))
        if data.get("role") == "provider":
            return f"GridBid: your GPUs sold to bid {data.get('bid')} ({n} trade(s))"
        return f"GridBid: bid {data.get('bid')} matched ({n} trade(s))"
    if event_type == "job.resumed":
        return f"GridBid: job {job.get('id')} resumed from the checkpoint of trade {(data.get('resumed_from') or {}).get('trade')}"
    if event_type.startswith("job."):
        return f"GridBid: job {job.get('id')} {job.get('state')}"
    if event_type == "payment.settled":
        return f"GridBid: trade {trade.get('id')} settled"
    if event_type == "dispute.ruled":
        return f"GridBid: dispute on trade {trade.get('id')} ruled ({str(data.get('outcome', '')).replace('_', ' ')})"
    return f"GridBid: {event_type}"


def email_send(*, user_id: int, event_type: str, data: dict[str, Any]) -> bool:
    """Email one event to its account, if it still wants emails. True when one was sent."""
    user = User.objects.filter(pk=user_id, email_notifications=True).exclude(email="").first()
    if user is None or event_type not in EVENT_TYPES:
        return False
    body = (
        f"{EVENT_TYPES[event_type]}.\n\n"
        f"{json.dumps(data, indent=2, sort_keys=True)}\n\n"
        "You get these emails because email notifications are on for your GridBid account; "
        "turn them off on your account page.\n"
    )
    send_mail(_subject(event_type, data), body, settings.DEFAULT_FROM_EMAIL, [user.email])
    return True

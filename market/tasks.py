"""Celery tasks of the market. They take ids and primitives and are idempotent."""

from __future__ import annotations

from celery import shared_task
from django.utils import timezone

from market.models import Bid
from market.states import BidState


@shared_task(name="market.tasks.bids_expire")
def bids_expire() -> int:
    """Open bids whose deadline can no longer be met expire (a claim by conditional update)."""
    now = timezone.now()
    expired = 0
    for bid_id, duration_s, deadline in Bid.objects.filter(state=BidState.OPEN, deadline__isnull=False).values_list("id", "duration_s", "deadline"):
        if deadline <= now + timezone.timedelta(seconds=duration_s):
            expired += Bid.objects.filter(id=bid_id, state=BidState.OPEN).update(state=BidState.EXPIRED, updated_at=now)
    return expired


@shared_task(name="market.tasks.bookings_expire")
def bookings_expire() -> int:
    """Give back the GPUs of bookings whose window ran out (nobody reported the job's end)."""
    from market.bookings import bookings_expire as expire

    return expire()


@shared_task(name="market.tasks.idempotency_prune")
def idempotency_prune() -> int:
    from market.api.idempotency import idempotency_prune as prune

    return prune()


@shared_task(name="market.tasks.outputs_expire")
def outputs_expire() -> int:
    """Delete job outputs kept past OUTPUTS_TTL_S, files and rows."""
    from market.outputs import outputs_expire as expire

    return expire()


@shared_task(name="market.tasks.round_run", ignore_result=True)
def round_run() -> int | None:
    """Clear the round of the current schedule slot; a duplicate delivery is a no-op."""
    from market.rounds import round_clear

    rnd = round_clear()
    return rnd.number if rnd else None


@shared_task(name="market.tasks.demo_tick", ignore_result=True)
def demo_tick() -> dict[str, int]:
    from market.demo import demo_tick as tick

    return tick()

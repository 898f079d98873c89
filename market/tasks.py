"""Celery tasks of the market. They take ids and primitives and are idempotent."""

from __future__ import annotations

from celery import shared_task


@shared_task(name="market.tasks.bids_expire")
def bids_expire() -> int:
    """Open bids past their expires_at, or whose deadline can no longer be met, leave the
    book with the reason (rounds do the same first; this covers a market with no rounds)."""
    from market.rounds import bids_expire as expire

    return len(expire())


@shared_task(name="market.tasks.bookings_expire")
def bookings_expire() -> int:
    """Give back the GPUs of bookings whose window ran out (nobody reported the job's end)."""
    from market.bookings import bookings_expire as expire

    return expire()


@shared_task(name="market.tasks.idempotency_prune")
def idempotency_prune() -> int:
    from market.api.idempotency import idempotency_prune as prune

    return prune()


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

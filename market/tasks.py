"""Celery tasks of the market. They take ids and primitives and are idempotent."""

from __future__ import annotations

from celery import shared_task

import gridbid.celery  # noqa: F401 - binds the tasks to the configured app (eager in tests), wherever .delay() is called


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


@shared_task(name="market.tasks.outputs_expire")
def outputs_expire() -> int:
    """Delete job outputs kept past OUTPUTS_TTL_S, files and rows."""
    from market.outputs import outputs_expire as expire

    return expire()


@shared_task(name="market.tasks.round_run", ignore_result=True)
def round_run() -> int | None:
    """Clear the round of the current schedule slot; a duplicate delivery, or a tick that
    comes while another round is still clearing, is a no-op (that slot is skipped)."""
    from market.rounds import round_clear

    rnd = round_clear()
    return rnd.number if rnd else None


@shared_task(name="market.tasks.demo_tick", ignore_result=True)
def demo_tick() -> dict[str, int]:
    from market.demo import demo_tick as tick

    return tick()


# --- notifications (queue `notify`): slow receivers never hold up rounds or settlement ----------
@shared_task(name="market.tasks.webhook_deliver", ignore_result=True)
def webhook_deliver(delivery_id: int) -> None:
    """Send one webhook delivery if it is still due; a failure schedules its next attempt
    (exponential backoff, bounded attempts: market.webhooks), recorded on its row."""
    from market.webhooks import delivery_attempt

    retry_in = delivery_attempt(delivery_id=delivery_id)
    if retry_in is not None:
        webhook_deliver.apply_async((delivery_id,), countdown=retry_in)


@shared_task(name="market.tasks.webhooks_retry", ignore_result=True)
def webhooks_retry() -> int:
    """Send again the deliveries whose retry message was lost (a restarted worker or broker)."""
    from market.webhooks import deliveries_due

    due = deliveries_due()
    for delivery_id in due:
        webhook_deliver.delay(delivery_id)
    return len(due)


# an SMTP server that is down or refuses for a while: tried again with backoff, then dropped
@shared_task(name="market.tasks.email_notify", ignore_result=True, autoretry_for=(OSError,), retry_backoff=30,
             retry_backoff_max=3600, retry_jitter=True, max_retries=6)
def email_notify(user_id: int, event_type: str, data: dict[str, object]) -> bool:
    from market.notify import email_send

    return email_send(user_id=user_id, event_type=event_type, data=data)

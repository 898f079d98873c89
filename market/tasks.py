"""Celery tasks of the market. They take ids and primitives and are idempotent."""

from __future__ import annotations

from celery import shared_task

import gridbid.celery  # noqa: F401 - binds the tasks to the configured app (eager in tests), wherever .delay() is called
from market import bookings, grid_carbon, notify, outputs, predictions, rounds, selectors, webhooks
from market.api import idempotency
from market.events import EmailsWanted, JobReached, WebhookDeliveriesWritten


@shared_task(name="market.tasks.bids_expire")
def bids_expire() -> int:
    """Open bids past their expires_at, or whose deadline can no longer be met, leave the
    book with the reason (rounds do the same first; this covers a market with no rounds)."""
    return len(rounds.bids_expire())


@shared_task(name="market.tasks.markets_refresh", ignore_result=True)
def markets_refresh() -> int:
    """Compute the markets list for every reader (beat, every MARKETS_CACHE_SECONDS)."""
    return len(selectors.markets_refresh())


@shared_task(name="market.tasks.bookings_expire")
def bookings_expire() -> int:
    """Give back the GPUs of bookings whose window ran out (nobody reported the job's end)."""
    return bookings.bookings_expire()


@shared_task(name="market.tasks.idempotency_prune")
def idempotency_prune() -> int:
    return idempotency.idempotency_prune()


@shared_task(name="market.tasks.outputs_expire")
def outputs_expire() -> int:
    """Delete job outputs kept past OUTPUTS_TTL_S, files and rows."""
    return outputs.outputs_expire()


@shared_task(name="market.tasks.job_carbon")
def job_carbon(job_id: int) -> float | None:
    """Measure an ended job's kg CO2 over the hours it ran (issue 37); once per job."""
    return grid_carbon.job_carbon(job_id)


def job_carbon_measure(event: JobReached) -> None:
    """After a job's report commits: measure its carbon if it ended (the task skips the rest)."""
    job_carbon.delay(event.job_id)


@shared_task(name="market.tasks.runtime_refit")
def runtime_refit() -> int | None:
    """Refit the runtime predictor on the latest completed jobs (skipped when none is new);
    the new fit's id."""
    fit = predictions.runtime_fit()
    return None if fit is None else fit.pk


@shared_task(name="market.tasks.round_run", ignore_result=True)
def round_run() -> int | None:
    """Clear the round of the current schedule slot; a duplicate delivery, or a tick that
    comes while another round is still clearing, is a no-op (that slot is skipped)."""
    rnd = rounds.round_clear()
    return rnd.number if rnd else None


# --- notifications (queue `notify`): slow receivers never hold up rounds or settlement ----------
@shared_task(name="market.tasks.webhook_deliver", ignore_result=True)
def webhook_deliver(delivery_id: int) -> None:
    """Send one webhook delivery if it is still due; a failure schedules its next attempt
    (exponential backoff, bounded attempts: market.webhooks), recorded on its row."""
    retry_in = webhooks.delivery_attempt(delivery_id=delivery_id)
    if retry_in is not None:
        webhook_deliver.apply_async((delivery_id,), countdown=retry_in)


@shared_task(name="market.tasks.webhooks_retry", ignore_result=True)
def webhooks_retry() -> int:
    """Send again the deliveries whose retry message was lost (a restarted worker or broker)."""
    due = webhooks.deliveries_due()
    for delivery_id in due:
        webhook_deliver.delay(delivery_id)
    return len(due)


# an SMTP server that is down or refuses for a while: tried again with backoff, then dropped
@shared_task(name="market.tasks.email_notify", ignore_result=True, autoretry_for=(OSError,), retry_backoff=30,
             retry_backoff_max=3600, retry_jitter=True, max_retries=6)
def email_notify(user_id: int, event_type: str, data: dict[str, object]) -> bool:
    return notify.email_send(user_id=user_id, event_type=event_type, data=data)


# --- handlers of the domain events (market.events) that enqueue, after the commit --------------
def webhook_deliveries_send(event: WebhookDeliveriesWritten) -> None:
    """Deliveries written by a committed transaction go out on the `notify` queue."""
    for delivery_id in event.delivery_ids:
        webhook_deliver.delay(delivery_id)


def emails_send(event: EmailsWanted) -> None:
    for user_id, event_type, data in event.mails:
        email_notify.delay(user_id, event_type, data)

"""Celery tasks of the ledger, all on the chain queue and all idempotent: each re-reads
the database and the chain, and each step is keyed (batches by trade uniqueness,
transactions by their outbox key), so a duplicate or retried delivery sends nothing twice."""

from __future__ import annotations

from typing import Any

from celery import shared_task

import gridbid.celery  # noqa: F401 - binds the tasks to the configured app (eager in tests)
from ledger.context import chain_context
from ledger.journal import reconcile
from ledger.listener import events_sync
from ledger.outbox import signers_of, txs_track
from ledger.services import (
    batch_record,
    batches_release_failed,
    settle_collect,
    settle_submit_ready,
)
from market.events import OperatorChanged, announce

# their queues (chain; the demo's tick: demo) are set in gridbid.celery.TASK_QUEUES
RETRY: dict[str, Any] = {"ignore_result": True, "autoretry_for": (ConnectionError, TimeoutError), "retry_backoff": True, "retry_backoff_max": 60, "max_retries": 5}


@shared_task(name="ledger.tasks.trades_record", **RETRY)
def trades_record() -> int | None:
    """Record pending trades on chain in one batch."""
    ctx = chain_context()
    if ctx is None:
        return None
    batch = batch_record(ctx=ctx)
    return batch.pk if batch else None


@shared_task(name="ledger.tasks.batches_settle", **RETRY)
def batches_settle() -> int:
    """Batch finished jobs' receipts for co-signing, and submit fully co-signed batches."""
    ctx = chain_context()
    if ctx is None:
        return 0
    settle_collect(ctx=ctx)
    return len(settle_submit_ready(ctx=ctx))


@shared_task(name="ledger.tasks.chain_txs_track", **RETRY)
def chain_txs_track() -> int:
    """Rebroadcast unmined transactions (with higher fees once stuck) and follow receipts to
    the confirmation depth; a batch whose transaction failed for good frees its trades."""
    ctx = chain_context()
    if ctx is None:
        return 0
    tracked = txs_track(client=ctx.client, confirmations=ctx.confirmations, signer_for=signers_of(ctx.operator))
    batches_release_failed(ctx=ctx)
    return tracked


@shared_task(name="ledger.tasks.chain_events_sync", **RETRY)
def chain_events_sync() -> int:
    """One tick of the event listener."""
    ctx = chain_context()
    if ctx is None:
        return 0
    return events_sync(ctx=ctx).applied


@shared_task(name="ledger.tasks.ledger_reconcile", **RETRY)
def ledger_reconcile() -> bool | None:
    """The journal against the chain (hash chain, every balance, totals): the operator page
    shows the outcome; a discrepancy is logged as an error."""
    import logging

    ctx = chain_context()
    if ctx is None:
        return None
    status = reconcile(ctx=ctx)
    if not status["ok"]:
        logging.getLogger("gridbid.ledger").error("reconciliation: %s", "; ".join(status["problems"]))
    announce(OperatorChanged())
    return bool(status["ok"])


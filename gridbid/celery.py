"""The Celery app. Queue names live in `Queue`; beat's schedule is built from settings."""

from __future__ import annotations

import enum
import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gridbid.settings")


class Queue(enum.StrEnum):
    DEFAULT = "default"
    ROUNDS = "rounds"
    CHAIN = "chain"


app = Celery("gridbid")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_default_queue = Queue.DEFAULT
app.autodiscover_tasks(["market", "ledger", "providers"])


@app.on_after_finalize.connect
def _schedule(sender: Celery, **_: object) -> None:
    from django.conf import settings

    sender.conf.beat_schedule = {
        "auction-round": {
            "task": "market.tasks.round_run",
            "schedule": settings.GRIDBID["ROUND_SECONDS"],
            "options": {"queue": Queue.ROUNDS, "expires": settings.GRIDBID["ROUND_SECONDS"] * 2},
        },
        "expire-bids": {"task": "market.tasks.bids_expire", "schedule": 30.0, "options": {"queue": Queue.DEFAULT}},
        "machines-offline": {"task": "providers.tasks.machines_mark_offline", "schedule": 10.0},
        "idempotency-prune": {"task": "market.tasks.idempotency_prune", "schedule": 3600.0},
        # ledger (settlement): all on the chain queue, each idempotent
        "ledger-record": {"task": "ledger.tasks.trades_record", "schedule": 5.0, "options": {"queue": Queue.CHAIN, "expires": 10}},
        "ledger-settle": {"task": "ledger.tasks.batches_settle", "schedule": 10.0, "options": {"queue": Queue.CHAIN, "expires": 20}},
        "ledger-txs": {"task": "ledger.tasks.chain_txs_track", "schedule": 3.0, "options": {"queue": Queue.CHAIN, "expires": 6}},
        "ledger-events": {"task": "ledger.tasks.chain_events_sync", "schedule": 3.0, "options": {"queue": Queue.CHAIN, "expires": 6}},
        "ledger-reconcile": {"task": "ledger.tasks.ledger_reconcile", "schedule": 60.0, "options": {"queue": Queue.CHAIN, "expires": 120}},
    }

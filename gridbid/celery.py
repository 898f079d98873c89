"""The Celery app. Queue names live in `Queue`; beat's schedule is built from settings."""

from __future__ import annotations

import enum
import os

from celery import Celery
from celery.signals import before_task_publish, setup_logging, task_postrun, task_prerun

from gridbid import logs

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "gridbid.settings")


class Queue(enum.StrEnum):
    DEFAULT = "default"
    ROUNDS = "rounds"
    CHAIN = "chain"
    DEMO = "demo"  # the demo market's tick: heartbeats, jobs ending, buyers bidding
    DEMO_AGENTS = "demo-agents"  # the demo providers' receipts and co-signatures: BLS, seconds a tick
    NOTIFY = "notify"  # webhooks and notification emails


# Every task by name, so a task lands on its queue however it is sent (beat, .delay,
# apply_async): a round that takes seconds must never sit in front of chain work, nor
# the demo's ticks in front of either. tests/integration/test_queues.py fails on a task
# registered without a route here.
TASK_QUEUES: dict[str, Queue] = {
    "market.tasks.round_run": Queue.ROUNDS,
    "market.tasks.bids_expire": Queue.DEFAULT,
    "market.tasks.markets_refresh": Queue.DEFAULT,
    "market.tasks.bookings_expire": Queue.DEFAULT,
    "market.tasks.idempotency_prune": Queue.DEFAULT,
    "market.tasks.outputs_expire": Queue.DEFAULT,
    "market.tasks.runtime_refit": Queue.DEFAULT,
    "market.tasks.job_carbon": Queue.DEFAULT,
    "demo.tasks.tick": Queue.DEMO,
    "market.tasks.webhook_deliver": Queue.NOTIFY,
    "market.tasks.webhooks_retry": Queue.NOTIFY,
    "market.tasks.email_notify": Queue.NOTIFY,
    "providers.tasks.machines_mark_offline": Queue.DEFAULT,
    "providers.tasks.machines_wake_send": Queue.DEFAULT,
    "ledger.tasks.trades_record": Queue.CHAIN,
    "ledger.tasks.batches_settle": Queue.CHAIN,
    "ledger.tasks.chain_txs_track": Queue.CHAIN,
    "ledger.tasks.chain_events_sync": Queue.CHAIN,
    "ledger.tasks.ledger_reconcile": Queue.CHAIN,
    "demo.tasks.agents_tick": Queue.DEMO_AGENTS,
}

# The queues one worker serves together: the embedded mode runs one worker thread per
# group, and the README's production section one `gridbid worker -Q` per group. Notifications
# have their own: a receiver that takes its full timeout to answer delays only other notices.
# The demo's agents sign with py-ecc (~0.2 s a signature, dozens a tick once jobs finish):
# on a thread of their own they never hold up the demo tick that rounds wait for.
WORKER_GROUPS: tuple[tuple[Queue, ...], ...] = ((Queue.ROUNDS,), (Queue.CHAIN,), (Queue.DEFAULT, Queue.DEMO), (Queue.NOTIFY,), (Queue.DEMO_AGENTS,))

app = Celery("gridbid")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.conf.task_default_queue = Queue.DEFAULT
app.conf.task_routes = {name: {"queue": queue.value} for name, queue in TASK_QUEUES.items()}
app.autodiscover_tasks(["market", "ledger", "providers", "demo"])


@app.on_after_finalize.connect
def _schedule(sender: Celery, **_: object) -> None:
    from django.conf import settings

    # queues come from TASK_QUEUES (task_routes); the entries say only when and how stale
    sender.conf.beat_schedule = {
        "auction-round": {
            "task": "market.tasks.round_run",
            "schedule": settings.GRIDBID["ROUND_SECONDS"],
            "options": {"expires": settings.GRIDBID["ROUND_SECONDS"] * 2},
        },
        "expire-bids": {"task": "market.tasks.bids_expire", "schedule": 30.0},
        "expire-bookings": {"task": "market.tasks.bookings_expire", "schedule": 15.0},
        "machines-offline": {"task": "providers.tasks.machines_mark_offline", "schedule": 10.0},
        "idempotency-prune": {"task": "market.tasks.idempotency_prune", "schedule": 3600.0},
        "outputs-expire": {"task": "market.tasks.outputs_expire", "schedule": 300.0, "options": {"expires": 600}},
        "runtime-refit": {"task": "market.tasks.runtime_refit", "schedule": settings.GRIDBID["RUNTIME_REFIT_S"],
                          "options": {"expires": settings.GRIDBID["RUNTIME_REFIT_S"]}},
        "webhooks-retry": {"task": "market.tasks.webhooks_retry", "schedule": 30.0, "options": {"expires": 60}},
        # the markets list, computed in a worker before a request would find it due (selectors.market_buckets)
        **({"markets-refresh": {"task": "market.tasks.markets_refresh", "schedule": markets_s, "options": {"expires": markets_s}}}
           if (markets_s := settings.GRIDBID.get("MARKETS_CACHE_SECONDS", 0)) else {}),
        # ledger (settlement): all on the chain queue, each idempotent
        "ledger-record": {"task": "ledger.tasks.trades_record", "schedule": 5.0, "options": {"expires": 10}},
        "ledger-settle": {"task": "ledger.tasks.batches_settle", "schedule": 10.0, "options": {"expires": 20}},
        "ledger-txs": {"task": "ledger.tasks.chain_txs_track", "schedule": 3.0, "options": {"expires": 6}},
        "ledger-events": {"task": "ledger.tasks.chain_events_sync", "schedule": 3.0, "options": {"expires": 6}},
        "ledger-reconcile": {"task": "ledger.tasks.ledger_reconcile", "schedule": 60.0, "options": {"expires": 120}},
    }


# --- the request id follows a request into the tasks it enqueues (gridbid/logs.py) ---------
@before_task_publish.connect
def _request_id_to_headers(headers: dict[str, object] | None = None, **_: object) -> None:
    rid = logs.request_id.get()
    if rid and headers is not None:
        headers.setdefault("request_id", rid)


@task_prerun.connect
def _request_id_from_headers(task: object = None, **_: object) -> None:
    request = getattr(task, "request", None)
    if request is None:
        return
    # a worker sees message headers as request attributes; an eager call keeps them in .headers
    rid = getattr(request, "request_id", None) or (getattr(request, "headers", None) or {}).get("request_id")
    if rid is None and getattr(request, "is_eager", False):
        rid = logs.request_id.get()  # run inline: still inside the request that called it
    # an insane id is dropped, not logged: headers come from whoever can publish
    request.gridbid_request_id_token = logs.request_id.set(rid if logs.request_id_sane(rid) else "")


@task_postrun.connect
def _request_id_restore(task: object = None, **_: object) -> None:
    token = getattr(getattr(task, "request", None), "gridbid_request_id_token", None)
    if token is not None:
        try:
            logs.request_id.reset(token)
        except ValueError:  # ran in another context than it started in
            logs.request_id.set("")


@setup_logging.connect
def _logging_from_settings(**_: object) -> None:
    """Workers log as the web processes do (LOG_LEVEL, LOG_FORMAT), not in Celery's format."""
    from logging.config import dictConfig

    from django.conf import settings

    dictConfig(settings.LOGGING)

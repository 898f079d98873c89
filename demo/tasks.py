"""The demo's Celery tasks (queues `demo` and `demo_agents`, gridbid.celery), scheduled by the
runner only under `gridbid up --demo`."""

from __future__ import annotations

from celery import shared_task

import gridbid.celery  # noqa: F401 - binds the tasks to the configured app (eager in tests)
from demo import chain, market
from ledger.context import DEV_CHAIN_ID, chain_context
from ledger.tasks import RETRY


@shared_task(name="demo.tasks.tick", ignore_result=True)
def tick() -> dict[str, int]:
    """The demo market moves on: buyers bid, demo machines send heartbeats, jobs finish."""
    return market.demo_tick()


@shared_task(name="demo.tasks.agents_tick", **RETRY)
def agents_tick() -> dict[str, int]:
    """The demo providers' simulated agents sign receipts and co-sign settlement batches."""
    ctx = chain_context()
    if ctx is None or ctx.chain_id != DEV_CHAIN_ID:
        return {}
    return chain.demo_agents_act(ctx=ctx)

"""GPU capacity belongs to bookings: sold GPUs come back when a job ends, is refunded or its
booking runs out, whichever comes first, exactly once; no two jobs share a GPU; the free
count is what the held bookings leave, never a counter that can drift.

The jobs here run on the real agent daemon (driven in-process over the Django test
transport) reporting through the real agent API, not on the demo's simulated machines.
"""

from __future__ import annotations

import random
import sys
from datetime import timedelta

import pytest
from django.db import transaction
from django.db.models import Sum
from django.utils import timezone

from market.models import Booking, Job, Offer, Trade
from market.rounds import round_clear
from tests.integration.helpers import drive

pytestmark = pytest.mark.django_db(transaction=True)

_slot = iter(range(10_000_000, 20_000_000))


def clear() -> None:
    round_clear(slot=next(_slot))


def quick_spec(seconds: float = 0.3) -> dict:
    return {"command": [sys.executable, "-c", f"import time; time.sleep({seconds}); open('outputs/done', 'w').write('1')"], "output_dir": "outputs"}


def held(offer: Offer) -> list[Booking]:
    return list(Booking.objects.filter(offer=offer, state="held"))


def test_a_real_agents_sold_gpus_come_back_when_its_jobs_end_and_sell_again(provider_user, buyer, make_machine, make_bid, agent_for):
    from market import services
    from providers.models import GpuModel

    machine = make_machine(provider_user, count=2)
    offer = services.offer_publish(user=provider_user, machine=machine, gpu_model=GpuModel.objects.get(pk="H100-SXM-80GB"), gpus=2, price=2_000_000)
    make_bid(buyer, gpus=1, duration_s=600, job_spec=quick_spec())
    make_bid(buyer, gpus=1, duration_s=600, job_spec=quick_spec())
    clear()
    offer.refresh_from_db()
    trades = list(Trade.objects.filter(offer=offer).order_by("id"))
    assert len(trades) == 2 and offer.gpus_free == 0
    assert sorted(i for b in held(offer) for i in b.gpu_indexes) == [0, 1]  # one GPU each, never both on GPU 0

    from ledger.listener import _advance_trades

    with transaction.atomic():
        _advance_trades(Trade.objects.filter(offer=offer), "recorded")  # the listener applying TradesRecorded: agents run funded trades only
    agent = agent_for(provider_user, machine)
    agent.connect()

    def both_ended() -> bool:
        return Job.objects.filter(trade__in=trades, state="completed").count() == 2

    drive(agent, both_ended)
    offer.refresh_from_db()
    assert offer.gpus_free == 2, "the GPUs of both finished jobs are free again"
    assert held(offer) == []
    assert sorted(Booking.objects.filter(offer=offer).values_list("release_reason", flat=True)) == ["completed", "completed"]

    from market.selectors import provider_machines

    (row,) = provider_machines(provider_user.provider.pk)
    assert (row["offered"], row["busy"], row["booked_pct"]) == (2, 0, 0)

    # the agent's utilisation pricing reads the offers the market returns: back to its floor
    from providers.agent.pricing import PricingRule, plan_offers

    rule = PricingRule("H100-SXM-80GB", kind="utilisation", price=2_000_000, premium=1_000_000)
    assert plan_offers([rule], {"H100-SXM-80GB": 2}, agent.client.offers(machine.pk)) == [], "no premium for bookings that ended"

    # and they sell again: a 2-GPU bid matches the freed machine in the next round
    again = make_bid(buyer, gpus=2, duration_s=600, job_spec=quick_spec())
    clear()
    again.refresh_from_db()
    assert again.state == "matched"
    offer.refresh_from_db()
    assert offer.gpus_free == 0 and sorted(held(offer)[0].gpu_indexes) == [0, 1]


def test_a_refund_from_the_chain_gives_the_gpus_back_once_even_after_the_job_ended(provider_user, make_job):
    from ledger.listener import _advance_trades
    from market.jobs import job_event

    job = make_job(provider_user, gpus=2, count=4, trade_state="recorded")
    offer = job.trade.offer
    offer.refresh_from_db()
    assert offer.gpus_free == 2
    with transaction.atomic():
        _advance_trades(Trade.objects.filter(pk=job.trade_id), "refunded")  # the listener applying TradeRefunded
    offer.refresh_from_db()
    assert offer.gpus_free == 4
    booking = Booking.objects.get(trade=job.trade)
    assert (booking.state, booking.release_reason) == ("released", "refunded")
    # the agent's late report of the job's end changes nothing: the GPUs came back once
    job_event(user=provider_user, job_id=job.pk, event="failed", exit_code=1)
    offer.refresh_from_db()
    booking.refresh_from_db()
    assert offer.gpus_free == 4 and booking.release_reason == "refunded"


@pytest.mark.parametrize("event", ["completed", "failed", "preempted"])
def test_every_end_of_a_job_frees_its_gpus_in_the_same_report(provider_user, make_job, event):
    from market.jobs import job_event

    job = make_job(provider_user, gpus=3, count=4)
    offer = job.trade.offer
    job_event(user=provider_user, job_id=job.pk, event="started")
    offer.refresh_from_db()
    assert offer.gpus_free == 1
    job_event(user=provider_user, job_id=job.pk, event=event, exit_code=0, gpu_seconds=30)
    offer.refresh_from_db()
    assert offer.gpus_free == 4
    assert Booking.objects.get(trade=job.trade).release_reason == event


def test_a_booking_nobody_reports_on_runs_out_and_its_unstarted_job_fails_with_a_reason(provider_user, client_for, make_job):
    from market.bookings import bookings_expire

    job = make_job(provider_user, gpus=2, count=2, duration_s=600)
    offer = job.trade.offer
    booking = Booking.objects.get(trade=job.trade)
    assert bookings_expire(now=booking.ends_at - timedelta(seconds=1)) == 0
    assert bookings_expire(now=booking.ends_at + timedelta(seconds=1)) == 1
    offer.refresh_from_db()
    job.refresh_from_db()
    assert offer.gpus_free == 2 and job.state == "failed" and "never started" in job.checkpoint["reason"]
    # and the agent is no longer told to run it
    machine = offer.machine
    assert client_for(provider_user, ["provide"]).get(f"/api/v1/agent/machines/{machine.pk}/assignments/").json()["assignments"] == []


def test_a_started_job_keeps_its_gpus_for_its_whole_duration_from_its_start(provider_user, make_job):
    from market.bookings import bookings_expire, grace
    from market.jobs import job_event

    job = make_job(provider_user, gpus=1, count=1, duration_s=600)
    late = timezone.now() + timedelta(seconds=200)  # its agent took 200 s to start it
    job_event(user=provider_user, job_id=job.pk, event="started", at=int(late.timestamp()))
    booking = Booking.objects.get(trade=job.trade)
    assert booking.ends_at >= late + timedelta(seconds=600) + grace() - timedelta(seconds=1)
    assert bookings_expire(now=late + timedelta(seconds=600)) == 0


def test_over_many_rounds_and_job_ends_no_gpu_is_booked_twice_and_the_free_count_never_drifts(provider_user, buyer, make_machine, make_bid):
    from market import services
    from market.jobs import job_event
    from providers.models import GpuModel

    rng = random.Random(16)
    model = GpuModel.objects.get(pk="H100-SXM-80GB")
    offers = [services.offer_publish(user=provider_user, machine=make_machine(provider_user, count=8), gpu_model=model, gpus=8, price=2_000_000) for _ in range(2)]
    for step in range(12):
        for _ in range(rng.randint(1, 4)):
            make_bid(buyer, gpus=rng.choice([1, 2, 3, 4]), duration_s=600, max_price=3_000_000)
        clear()
        for job in Job.objects.filter(state__in=["assigned", "running"]).select_related("trade__provider__user"):
            if rng.random() < 0.4:
                job_event(user=provider_user, job_id=job.pk, event="started")
                job_event(user=provider_user, job_id=job.pk, event=rng.choice(["completed", "failed"]), exit_code=0, gpu_seconds=1)
        for offer in offers:
            offer.refresh_from_db()
            bookings = held(offer)
            indexes = [i for b in bookings for i in b.gpu_indexes]
            assert len(indexes) == len(set(indexes)), f"step {step}: GPUs {indexes} booked twice on offer {offer.pk}"
            taken = Booking.objects.filter(offer=offer, state="held").aggregate(n=Sum("gpus"))["n"] or 0
            assert offer.gpus_free == offer.gpus - taken, f"step {step}: free {offer.gpus_free} but {taken} of {offer.gpus} held"
    assert Booking.objects.filter(state="released").exists() and Booking.objects.filter(state="held").exists()


def test_a_refunded_trades_job_does_not_run_on_gpus_given_back(provider_user, make_job):
    """A trade refunded on chain gives its GPUs back; its job must not start (or run on)
    there: one not started fails with the reason, a running one is told to stop."""
    from ledger.listener import _advance_trades
    from market.jobs import job_event

    waiting = make_job(provider_user, gpus=1, count=4)
    running = make_job(provider_user, offer=waiting.trade.offer, gpus=1)
    job_event(user=provider_user, job_id=running.pk, event="started")
    with transaction.atomic():
        _advance_trades(Trade.objects.filter(pk__in=[waiting.trade_id, running.trade_id]), "refunded")
    waiting.refresh_from_db()
    running.refresh_from_db()
    assert waiting.state == "failed" and "refunded" in waiting.checkpoint["reason"]
    assert running.state == "running" and running.checkpoint["preempt_requested"] and running.checkpoint["stop_requested"]

"""A renter stops a job early or buys more time on the GPUs it holds.

Stop: billed for what ran (the agent's signed receipt), the rest refunded at settlement,
the GPUs back on the market when the agent reports the stop (at once if it never started),
and the job is not sent back to the market as a continuation.
Extend: priced at the offer's ask now, a trade of its own with its own order and receipt,
the booking holds the GPUs for the added time, the agent lets the job run to the new end.
The jobs run on the real agent daemon, driven in-process through the real agent API.
"""

from __future__ import annotations

import sys

import pytest

from market.models import Bid, Booking, Job, Trade
from tests.integration.helpers import drive

pytestmark = pytest.mark.django_db(transaction=True)

USDC = 10**6
WAIT_FOR_GO = "import os, time\nwhile not os.path.exists('go'): time.sleep(0.05)\nopen('outputs/done', 'w').write('1')"


def spec(code: str) -> dict:
    return {"command": [sys.executable, "-c", code], "output_dir": "outputs"}


def go(agent, trade_id: int) -> None:
    (agent.job_paths(trade_id).work / "go").write_text("")


def test_a_buyer_stops_a_running_job_and_its_gpus_come_back_without_a_continuation(provider_user, buyer, client_for, make_job, agent_for):
    job = make_job(provider_user, gpus=2, count=2, job_spec=spec(WAIT_FOR_GO))
    agent = agent_for(provider_user, job.trade.offer.machine)
    agent.connect()
    drive(agent, lambda: Job.objects.get(pk=job.pk).state == "running")
    offer = job.trade.offer
    offer.refresh_from_db()
    assert offer.gpus_free == 0

    r = client_for(buyer).post(f"/api/v1/jobs/{job.pk}/stop/")
    assert r.status_code == 200, r.content
    assert client_for(buyer).post(f"/api/v1/jobs/{job.pk}/stop/").status_code == 200  # twice: the same answer

    def stopped() -> bool:
        j = Job.objects.get(pk=job.pk)
        return j.state == "stopped" and "receipt" in j.checkpoint

    drive(agent, stopped)
    job.refresh_from_db()
    offer.refresh_from_db()
    booking = Booking.objects.get(trade=job.trade)
    assert (booking.state, booking.release_reason) == ("released", "stopped") and offer.gpus_free == 2
    used = job.checkpoint["receipt"]["body"]["gpu_seconds"]
    assert 0 < used < job.trade.gpus * job.trade.duration_s  # billed for what ran, the rest refunded at settlement
    assert not Bid.objects.filter(resume_from__trade=job.trade_id).exists(), "a stopped job is not sent back to the market"


def test_stopping_a_job_its_agent_has_not_started_frees_its_gpus_at_once_and_the_agent_never_runs_it(provider_user, buyer, client_for, make_job):
    job = make_job(provider_user, gpus=2, count=2)
    assert client_for(buyer).post(f"/api/v1/jobs/{job.pk}/stop/").status_code == 200
    job.refresh_from_db()
    offer = job.trade.offer
    offer.refresh_from_db()
    assert job.state == "stopped" and offer.gpus_free == 2
    machine = offer.machine
    assert client_for(provider_user, ["provide"]).get(f"/api/v1/agent/machines/{machine.pk}/assignments/").json()["assignments"] == []


def test_only_the_buyer_stops_its_own_active_job(provider_user, buyer, stranger, client_for, make_job):
    job = make_job(provider_user)
    assert client_for(stranger).post(f"/api/v1/jobs/{job.pk}/stop/").status_code == 404
    assert client_for(buyer, ["read"]).post(f"/api/v1/jobs/{job.pk}/stop/").status_code == 403
    Job.objects.filter(pk=job.pk).update(state="completed")
    r = client_for(buyer).post(f"/api/v1/jobs/{job.pk}/stop/")
    assert r.status_code == 409 and "completed" in r.json()["error"]["message"]


def test_a_buyer_extends_a_running_job_as_a_trade_of_its_own_and_each_trade_gets_its_signed_receipt(provider_user, buyer, client_for, make_job, agent_for, capsys):
    job = make_job(provider_user, gpus=2, count=2, duration_s=600, job_spec=spec(WAIT_FOR_GO))
    agent = agent_for(provider_user, job.trade.offer.machine)
    agent.connect()
    drive(agent, lambda: Job.objects.get(pk=job.pk).state == "running")
    booking = Booking.objects.get(trade=job.trade)
    before = booking.ends_at
    offer = job.trade.offer

    r = client_for(buyer).post(f"/api/v1/jobs/{job.pk}/extend/", {"duration_s": 1800, "max_price": offer.price}, format="json")
    assert r.status_code == 201, r.content
    ext = Trade.objects.get(pk=r.json()["id"])
    assert (ext.extends_id, ext.round, ext.price, ext.gpus, ext.duration_s) == (job.trade_id, None, offer.price, 2, 1800)
    assert ext.amount == offer.price * 2 * 1800 // 3600 and ext.state == "pending"
    assert ext.bid.state == "matched" and ext.bid.duration_s == 1800 and ext.bid.job_spec == job.trade.bid.job_spec
    booking.refresh_from_db()
    assert (booking.ends_at - before).total_seconds() == 1800
    ext_job = Job.objects.get(trade=ext)
    assert ext_job.state == "running"

    # not run before its money is on chain: the agent runs recorded trades only, extensions too
    agent.poll()
    assert agent.running[job.trade_id].limits.time_limit_s == 600
    from django.db import transaction

    from ledger.listener import _advance_trades

    with transaction.atomic():
        _advance_trades(Trade.objects.filter(pk=ext.pk), "recorded")  # the listener applying TradesRecorded
    # the agent learns it on its next poll: the job may now run 600 + 1800 s
    drive(agent, lambda: agent.running[job.trade_id].limits.time_limit_s == 2400)
    (assignment,) = client_for(provider_user, ["provide"]).get(f"/api/v1/agent/machines/{offer.machine_id}/assignments/").json()["assignments"]
    assert assignment["duration_s"] == 2400 and assignment["extensions"] == [{"trade": ext.pk, "job": ext_job.pk, "duration_s": 1800, "trade_state": "recorded"}]

    go(agent, job.trade_id)

    def both_receipted() -> bool:
        return all("receipt" in j.checkpoint for j in Job.objects.filter(pk__in=[job.pk, ext_job.pk]))

    drive(agent, both_receipted)
    job.refresh_from_db()
    ext_job.refresh_from_db()
    assert (job.state, ext_job.state) == ("completed", "completed")
    first, second = job.checkpoint["receipt"]["body"], ext_job.checkpoint["receipt"]["body"]
    assert (first["trade_id"], second["trade_id"]) == (job.trade_id, ext.pk)
    assert second["gpu_seconds"] == 0, "it ended inside the first trade's time: the extension bills nothing and is refunded"
    booking.refresh_from_db()
    assert booking.state == "released"
    # issue 32: the agent's log tells each step of one extension once, counted right
    said = [m for m in (line.split(" ", 1)[-1] for line in capsys.readouterr().out.splitlines())
            if m.startswith(f"trade {job.trade_id}: ") and "exten" in m]
    assert said == [f"trade {job.trade_id}: an extension of 1800 s was bought; it runs once its trade is recorded on chain",
                    f"trade {job.trade_id}: extended to 2400 s in all (1 extension)"], said


@pytest.mark.parametrize(("change", "body", "status", "words"), [
    ("withdrawn", {"duration_s": 600}, 409, "withdrawn"),
    ("max_duration", {"duration_s": 3600}, 400, "At most 1200 more"),
    ("dearer", {"duration_s": 600, "max_price": 1}, 409, "above your max_price"),
    (None, {"duration_s": 30}, 400, "duration_s"),
    (None, {"duration_s": "soon"}, 400, "duration_s"),
])
def test_an_extension_the_offer_cannot_sell_is_refused_with_the_reason(provider_user, buyer, client_for, make_job, change, body, status, words):
    from market.models import Offer

    job = make_job(provider_user, gpus=1, count=1, duration_s=600)
    offer = job.trade.offer
    if change == "withdrawn":
        Offer.objects.filter(pk=offer.pk).update(state="withdrawn")
    if change == "max_duration":
        Offer.objects.filter(pk=offer.pk).update(max_duration_s=1800)
    r = client_for(buyer).post(f"/api/v1/jobs/{job.pk}/extend/", body, format="json")
    assert r.status_code == status, r.content
    assert words in str(r.json()["error"])
    assert not Trade.objects.filter(extends=job.trade).exists()


def test_an_extension_needs_escrow_to_cover_it(provider_user, make_user, client_for, make_job, make_offer, make_bid):
    from django.db import transaction
    from django.utils import timezone

    from market.bookings import booking_hold, capacity_refresh
    from market.models import AuctionRound

    poor = make_user("poor")
    offer = make_offer(provider_user, count=1, price=2 * USDC)
    bid = make_bid(poor, gpus=1, duration_s=600, max_price=2 * USDC)  # funds exactly this bid
    rnd = AuctionRound.objects.create(number=90_001, scheduled_for=timezone.now())
    trade = Trade.objects.create(round=rnd, bid=bid, offer=offer, buyer=poor, provider=offer.machine.provider, gpu_model=offer.gpu_model,
                                 region=offer.machine.region, price=offer.price, gpus=1, duration_s=600, amount=offer.price * 600 // 3600)
    Bid.objects.filter(pk=bid.pk).update(state="matched")
    with transaction.atomic():
        booking_hold(trade=trade, offer=offer, now=timezone.now())
        capacity_refresh(offer_ids=[offer.pk])
    job = Job.objects.create(trade=trade)
    r = client_for(poor).post(f"/api/v1/jobs/{job.pk}/extend/", {"duration_s": 3600}, format="json")
    assert r.status_code == 402 and r.json()["error"]["details"]["cost"] == 2 * USDC
    assert "Deposit at least" in r.json()["error"]["message"]


def test_the_job_page_extends_at_the_ask_shown_and_stops_behind_a_confirmation(provider_user, buyer, stranger, client_for, make_job, make_offer):
    from django.test import Client

    offer = make_offer(provider_user, count=2, price=2 * USDC)
    job = make_job(provider_user, offer=offer, gpus=1)
    web = Client()
    web.force_login(buyer)
    page = web.get(f"/jobs/{job.pk}/").content.decode()
    assert 'id="rental"' in page and "Extend at 2.00 USDC/GPU-h" in page
    assert 'id="stop-zone"' in page and "Yes, stop job" in page, "stopping is a second step, in red"
    other = Client()
    other.force_login(stranger)
    assert other.get(f"/jobs/{job.pk}/").status_code == 404

    offer.price = 3 * USDC
    offer.save(update_fields=["price"])
    r = web.post(f"/jobs/{job.pk}/extend/", {"hours": "0.5", "ask": 2 * USDC}, follow=True)
    assert "above your max_price" in r.content.decode(), "a dearer ask than the one shown is refused, not paid"
    assert not Trade.objects.filter(extends=job.trade).exists()
    r = web.post(f"/jobs/{job.pk}/extend/", {"hours": "abc", "ask": 3 * USDC}, follow=True)
    assert r.status_code == 200 and "Extension not bought: hours" in r.content.decode()
    r = web.post(f"/jobs/{job.pk}/extend/", {"hours": "0.5", "ask": 3 * USDC}, follow=True)
    ext = Trade.objects.get(extends=job.trade)
    assert (ext.duration_s, ext.price, ext.amount) == (1800, 3 * USDC, 3 * USDC // 2)
    page = r.content.decode()
    assert "Extended by 30 min at 3.00 USDC/GPU-h (1.50 USDC" in page and f"trade #{ext.pk}" in page

    r = web.post(f"/jobs/{job.pk}/stop/", follow=True)
    assert "stopped before it started: nothing is billed" in r.content.decode()
    job.refresh_from_db()
    offer.refresh_from_db()
    assert job.state == "stopped" and offer.gpus_free == 2
    assert 'id="stop-zone"' not in r.content.decode() and 'id="extend-form"' not in r.content.decode()


def test_an_extension_bought_before_a_late_start_keeps_its_time_and_follows_the_job(provider_user, buyer, client_for, make_job):
    """Extended before its agent started it, then started late: the booking runs the whole
    bought time from the start (it ended an hour early and its GPUs were sold under the
    job); stopped before the start, the extension's job ends with it."""
    from datetime import timedelta

    from django.db import transaction
    from django.utils import timezone

    from market.bookings import booking_started, bookings_expire, grace

    job = make_job(provider_user, gpus=1, duration_s=600)
    r = client_for(buyer).post(f"/api/v1/jobs/{job.pk}/extend/", {"duration_s": 3600}, format="json")
    assert r.status_code == 201, r.content
    ext_job = Job.objects.get(trade_id=r.json()["id"])
    late = timezone.now() + timedelta(minutes=10)
    with transaction.atomic():  # as in the agent's "started" report
        booking_started(trade_id=job.trade_id, started_at=late)
    booking = Booking.objects.get(trade=job.trade)
    assert booking.ends_at == late + timedelta(seconds=600 + 3600) + grace()
    assert bookings_expire(now=late + timedelta(seconds=700) + grace()) == 0, "still inside the extension's time"

    # stopping the extension's job stops the job it extends; both end, nothing ran
    r = client_for(buyer).post(f"/api/v1/jobs/{ext_job.pk}/stop/")
    assert r.status_code == 200 and r.json()["id"] == job.pk
    assert set(Job.objects.filter(pk__in=[job.pk, ext_job.pk]).values_list("state", flat=True)) == {"stopped"}


def test_an_expiry_listed_before_an_extension_committed_does_not_release_the_extended_booking(provider_user, buyer, client_for, make_job):
    from datetime import timedelta

    from django.utils import timezone

    from market.bookings import bookings_release

    job = make_job(provider_user, gpus=1, duration_s=600)
    booking = Booking.objects.get(trade=job.trade)
    listed_at = booking.ends_at + timedelta(seconds=1)  # the expiry task saw it due ...
    assert client_for(buyer).post(f"/api/v1/jobs/{job.pk}/extend/", {"duration_s": 3600}, format="json").status_code == 201  # ... then this committed
    assert bookings_release(trade_ids=[job.trade_id], reason="expired", now=listed_at, due_only=True) == []
    booking.refresh_from_db()
    assert booking.state == "held" and booking.ends_at > timezone.now() + timedelta(seconds=3600)

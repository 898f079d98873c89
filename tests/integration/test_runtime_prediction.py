"""The runtime predictor in the market (issue 36): fitted on completed jobs, shown at quote
time and kept on the bid placed."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from django.utils import timezone

from market import predictions
from market.models import Bid, Job, RuntimeFit
from tests.conftest import bid_body

pytestmark = pytest.mark.django_db

SPEC = {"image": "ghcr.io/acme/train:1", "command": ["python", "train.py"]}


def finish(job: Job, *, seconds: int, gpus: int = 2, receipt: bool = True) -> Job:
    end = timezone.now()
    job.state, job.started_at, job.ended_at = "completed", end - timedelta(seconds=seconds), end
    job.gpu_seconds = gpus * seconds if receipt else 0
    job.save()
    return job


@pytest.fixture
def history(make_job, provider_user):
    """Six completed 2-GPU jobs of the buyer's train.py, 40-60 min each (an offer each)."""
    return [finish(make_job(provider_user, gpus=2, duration_s=4 * 3600, job_spec=SPEC), seconds=s)
            for s in (2400, 2700, 3000, 3000, 3300, 3600)]


def test_a_quote_says_how_long_jobs_like_it_ran(history, buyer, client_for, provider_user, make_offer):
    make_offer(provider_user, price=2_000_000, count=8)
    assert predictions.runtime_fit() is not None
    body = client_for(buyer).post("/api/v1/quote/", bid_body(gpus=2, duration_s=4 * 3600, job_spec=SPEC), format="json").json()
    got = body["runtime"]
    assert got is not None and got["jobs"] == 6, body
    assert 2400 <= got["p10_s"] <= got["p50_s"] <= got["p80_s"] <= got["p90_s"] <= 3600
    assert got["text"].startswith("jobs like this ran ") and "80% finished under" in got["text"]
    assert got["basis"].startswith("this buyer's jobs with this image")


def test_a_placed_bid_keeps_the_prediction_it_was_placed_with(history, buyer, client_for, make_bid):
    predictions.runtime_fit()
    bid = make_bid(buyer, gpus=2, duration_s=1800, job_spec=SPEC)
    shown = client_for(buyer).get(f"/api/v1/bids/{bid.id}/").json()["runtime_prediction"]
    assert shown is not None and shown["p90_s"] <= 1800, "a prediction never outruns the booking"
    assert Bid.objects.get(pk=bid.pk).runtime_prediction == shown


def test_before_enough_jobs_completed_there_is_no_prediction(buyer, client_for, provider_user, make_offer, make_job):
    finish(make_job(provider_user, job_spec=SPEC), seconds=600)
    predictions.runtime_fit()
    make_offer(provider_user, price=2_000_000, count=8)
    assert client_for(buyer).post("/api/v1/quote/", bid_body(gpus=2), format="json").json()["runtime"] is None


def test_a_refit_with_no_new_completed_job_is_skipped(history, make_job, provider_user):
    first = predictions.runtime_fit()
    assert first is not None and first.jobs == 6
    assert predictions.runtime_fit() is None
    finish(make_job(provider_user, job_spec=SPEC), seconds=900)
    again = predictions.runtime_fit()
    assert again is not None and again.jobs == 7
    for _ in range(predictions.KEEP_FITS + 1):
        predictions.runtime_fit(force=True)
    assert RuntimeFit.objects.count() == predictions.KEEP_FITS, "old fits are deleted with their stats"


def test_run_time_is_the_receipts_gpu_seconds_over_the_gpus(make_job, provider_user, buyer):
    finish(make_job(provider_user, gpus=4, job_spec=SPEC), seconds=1000, gpus=4)  # 4,000 GPU-seconds on 4 GPUs
    nothing = finish(make_job(provider_user, gpus=2, job_spec=SPEC), seconds=500, receipt=False)
    cont = finish(make_job(provider_user, gpus=2, job_spec=SPEC), seconds=77)
    cont.trade.bid.resume_from = {"url": "https://x/ck", "sha256": "0" * 64, "trade": 1}
    cont.trade.bid.save()
    records, last = predictions.runtime_records(limit=100)
    assert sorted(r.runtime_s for r in records) == [500.0, 1000.0], "the continuation is left out; no receipt: the wall-clock span"
    assert last >= nothing.pk
    assert {r.buyer for r in records} == {str(buyer.pk)} and {r.workload for r in records} == {"ghcr.io/acme/train:1 python train.py"}


def test_the_job_page_shows_the_prediction_and_what_the_job_ran(history, buyer, provider_user, make_job):
    from django.test import Client

    from market.jobs import job_event

    predictions.runtime_fit()
    job = make_job(provider_user, gpus=2, duration_s=4 * 3600, job_spec=SPEC)
    bid = job.trade.bid
    bid.runtime_prediction = predictions.runtime_predict(buyer_id=buyer.pk, job_spec=SPEC, gpus=2, gpu_models=["H100-SXM-80GB"], duration_s=4 * 3600)
    bid.save()
    c = Client()
    c.force_login(buyer)
    page = c.get(f"/jobs/{job.pk}/").content.decode()
    assert "Predicted when the bid was placed: jobs like this ran " in page and "This one ran" not in page
    job_event(user=provider_user, job_id=job.pk, event="started")
    job_event(user=provider_user, job_id=job.pk, event="completed", exit_code=0, gpu_seconds=2 * 2880)
    page = c.get(f"/jobs/{job.pk}/").content.decode()
    assert "This one ran <b>48 min</b>, inside the predicted 80% range" in page


def test_a_round_backfills_a_short_spot_job_before_the_window_closes_and_preempts_it_there(history, buyer, provider_user, make_offer, make_bid):
    from market import jobs
    from market.models import Offer, Trade
    from market.rounds import round_clear

    predictions.runtime_fit()
    gap = make_offer(provider_user, count=4, available_until=timezone.now() + timedelta(hours=2))  # its owner takes it back in 2 h
    Offer.objects.exclude(pk=gap.pk).update(state="withdrawn")  # the history's offers: nothing else to match
    short = make_bid(buyer, gpus=2, duration_s=6 * 3600, klass="spot", job_spec=SPEC)  # booked 6 h; jobs like it ran < 1 h
    assert short.runtime_prediction["p90_s"] < 2 * 3600
    unknown = make_bid(buyer, gpus=2, duration_s=6 * 3600, klass="spot", job_spec={"image": "ghcr.io/acme/other:2"})
    unknown.runtime_prediction = None  # nothing known of it: its booking must fit the window whole
    unknown.save()
    now = timezone.now()  # after the offer opened: the engine counts whole seconds
    round_clear(now=now)
    trade = Trade.objects.get(bid=short)
    assert trade.backfill_until == gap.available_until and "backfilled" in trade.reason
    assert not Trade.objects.filter(bid=unknown).exists()
    assert jobs.backfills_due(now=now + timedelta(hours=1)) == [], "inside the window it runs on"
    told = jobs.backfills_due(now=gap.available_until)
    job = Job.objects.get(trade=trade)
    assert told == [job.pk] and job.checkpoint["preempt_requested"] and job.checkpoint["backfill"]
    assert "before the offer's window closed" in job.checkpoint["preempt_reason"]
    assert jobs.backfills_due(now=gap.available_until + timedelta(minutes=1)) == [], "told once"


def test_a_waiting_bid_is_told_when_the_gpus_it_needs_are_likely_to_free_up(buyer, client_for, provider_user, make_offer, make_job, make_bid):
    from market.models import Offer
    from market.rounds import round_clear

    began = timezone.now() - timedelta(minutes=10)
    full = make_offer(provider_user, count=4)
    for _ in range(2):  # both halves held by jobs 10 min in, that jobs like them finish in 40 min (median)
        job = make_job(provider_user, offer=full, gpus=2, duration_s=4 * 3600)
        job.started_at = began
        job.state = "running"
        job.save()
        job.trade.bid.runtime_prediction = {"p10_s": 1200, "p50_s": 2400, "p80_s": 3000, "p90_s": 3300, "jobs": 9, "basis": "b", "text": "t"}
        job.trade.bid.save()
    Offer.objects.exclude(pk=full.pk).update(state="withdrawn")
    waiting = make_bid(buyer, gpus=4, duration_s=3600)
    cheap = make_bid(buyer, gpus=4, duration_s=3600, max_price=1_000_000)  # below the ask: no offer will take it
    now = timezone.now()  # after the offer opened: the engine counts whole seconds
    round_clear(now=now)
    waiting.refresh_from_db()
    cheap.refresh_from_db()
    said = waiting.explanation["reasons"][-1]
    assert said.startswith("likely to start in about 30 min") and "when 4 × H100-SXM-80GB in us-east free up" in said, waiting.explanation
    at = datetime.fromisoformat(waiting.explanation["estimated_start"])
    assert abs((at - (began + timedelta(minutes=40))).total_seconds()) < 1
    assert "estimated_start" not in cheap.explanation
    quoted = client_for(buyer).post("/api/v1/quote/", bid_body(gpus=4, duration_s=3600), format="json").json()
    assert not quoted["would_match"] and any(r.startswith("likely to start in about") for r in quoted["reasons"]), quoted

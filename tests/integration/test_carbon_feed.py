"""The market's carbon feed (issue 37): rounds see each region's grid at the hour they
clear, and /readyz says where each figure came from."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime
from typing import Any

import pytest
from django.test import Client

from gridbid.health import readiness_cache_clear
from market import carbon, grid_carbon, repository
from tests.unit.test_carbon import Stub

pytestmark = pytest.mark.django_db


@pytest.fixture
def feed_is(settings: Any):  # type: ignore[no-untyped-def]
    def use(value: str) -> None:
        settings.CONFIG = dataclasses.replace(settings.CONFIG, carbon_feed=value)
        readiness_cache_clear()

    yield use
    readiness_cache_clear()


def test_a_round_sees_us_east_at_its_grids_hour_and_eu_west_at_its_constant(feed_is) -> None:  # type: ignore[no-untyped-def]
    feed_is("eia-2022")
    at = datetime(2026, 4, 10, 14, 30, tzinfo=UTC)
    regions = {r.id: r.carbon_g_per_kwh for r in repository.snapshot(now=at).regions}
    pjm = carbon.EiaReplay().series["PJM"]
    assert regions["us-east"] == pjm.at(int(at.timestamp())) != 380.0
    assert regions["eu-west"] == 290.0  # no hourly series: the catalogue's figure
    later = {r.id: r.carbon_g_per_kwh for r in repository.snapshot(now=at.replace(hour=3)).regions}
    assert later["us-east"] == pjm.at(int(at.replace(hour=3).timestamp()))
    # the engine sees a forecast of the next 48 hours of us-east's grid, to price a job over the
    # hours it runs: the hour now, then the same hour of the 3 days before (the replay is history)
    ahead = {r.id: r.carbon_hourly for r in repository.snapshot(now=at).regions}
    t = int(at.timestamp())
    history = pjm.hourly(t - 3600 * carbon.history_hours(grid_carbon.FORECAST_HOURS), carbon.history_hours(grid_carbon.FORECAST_HOURS) + 1)
    assert ahead["us-east"] == carbon.seasonal(history, grid_carbon.FORECAST_HOURS) and ahead["eu-west"] == ()
    assert ahead["us-east"][0] == pjm.at(t) and ahead["us-east"][1] == sum(pjm.at(t + 3600 - 86400 * d) for d in (1, 2, 3)) / 3


def test_readyz_says_where_each_regions_figure_comes_from(feed_is) -> None:  # type: ignore[no-untyped-def]
    feed_is("eia-2022")
    body = Client().get("/readyz").json()
    assert body["checks"]["carbon"]["status"] == "ok"
    assert body["checks"]["carbon"]["detail"].startswith("us-central, us-east, us-west hourly from the eia-2022 series")


def test_a_failing_live_feed_falls_back_to_the_constants_and_readyz_says_why(feed_is) -> None:  # type: ignore[no-untyped-def]
    stub = Stub()
    try:
        stub.answer = lambda r, s, h: (503, {"error": "maintenance"})
        feed_is(stub.url)
        at = datetime.now(UTC)
        regions = {r.id: r.carbon_g_per_kwh for r in repository.snapshot(now=at).regions}
        assert regions["us-east"] == 380.0 and regions["eu-west"] == 290.0
        response = Client().get("/readyz")
        assert response.status_code == 200, "a feed on its fallback does not take the server out"
        part = response.json()["checks"]["carbon"]
        assert part["status"] == "degraded" and "fell back to their constant because the feed failed" in part["detail"]
        assert "answered HTTP 503" in part["detail"]
        stub.answer = lambda r, s, h: (200, {"region": r, "start": s - s % 3600, "g_co2_per_kwh": [123.0] * h})
        grid_carbon._readings.clear()  # the minute a failed reading is kept, passed
        assert {r.id: r.carbon_g_per_kwh for r in repository.snapshot(now=at).regions}["eu-west"] == 123.0
    finally:
        stub.server.shutdown()
        stub.server.server_close()


def test_an_ended_job_is_measured_once_over_the_hours_it_ran(feed_is, make_job, provider_user) -> None:  # type: ignore[no-untyped-def]
    from datetime import timedelta

    from market.models import Job

    feed_is("eia-2022")
    job = make_job(provider_user, gpus=2)  # 2 x H100-SXM-80GB in us-east (PJM)
    start = datetime(2022, 4, 10, 10, 30, tzinfo=UTC)
    Job.objects.filter(pk=job.pk).update(state="completed", started_at=start, ended_at=start + timedelta(hours=2), gpu_seconds=2 * 7200)
    pjm = carbon.EiaReplay().series["PJM"]
    t = int(start.timestamp())
    mean = (1800 * pjm.at(t) + 3600 * pjm.at(t + 1800) + 1800 * pjm.at(t + 5400)) / 7200  # 10:30-11, 11-12, 12-12:30
    tdp = job.trade.gpu_model.tdp_watts
    kg = grid_carbon.job_carbon(job.pk)
    assert kg == pytest.approx(2 * 2 * tdp / 1000 * mean / 1000, abs=1e-6)
    assert grid_carbon.job_carbon(job.pk) is None, "measured once"
    job.refresh_from_db()
    assert job.kg_co2 == kg and job.checkpoint["carbon"]["source"] == "eia-2022 replay"


def test_a_job_reported_ended_gets_its_carbon_on_its_page_in_the_api_and_in_the_month(feed_is, make_job, provider_user, buyer,  # type: ignore[no-untyped-def]
                                                                                      client_for, django_capture_on_commit_callbacks) -> None:
    from django.db import transaction

    from ledger.web import _carbon_of_month
    from market.jobs import job_event

    feed_is("eia-2022")
    job = make_job(provider_user, gpus=1)
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        job_event(user=provider_user, job_id=job.pk, event="started")
    with django_capture_on_commit_callbacks(execute=True), transaction.atomic():
        job_event(user=provider_user, job_id=job.pk, event="completed", exit_code=0, gpu_seconds=1)
    job.refresh_from_db()
    assert job.kg_co2 is not None and job.kg_co2 >= 0
    assert client_for(buyer).get(f"/api/v1/jobs/{job.pk}/").json()["kg_co2"] == job.kg_co2
    c = Client()
    c.force_login(buyer)
    assert "Carbon: <b>" in c.get(f"/jobs/{job.pk}/").content.decode()
    month = _carbon_of_month(buyer, None)
    assert month["jobs"] == 1 and month["kg"] == pytest.approx(job.kg_co2)


def test_a_slow_feed_costs_one_call_its_budget_not_a_timeout_per_region(feed_is, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import time

    stub = Stub()
    try:
        def slow(r: str, s: int, h: int) -> tuple[int, object]:
            time.sleep(0.2)
            return 200, {"region": r, "start": s - s % 3600, "g_co2_per_kwh": [111.0] * h}

        stub.answer = slow
        monkeypatch.setattr(grid_carbon, "FEED_TIMEOUT_S", 0.3)
        feed_is(stub.url)
        began = time.monotonic()
        got = grid_carbon.carbon_ahead(datetime.now(UTC))
        assert time.monotonic() - began < 1.5, "14 regions at 0.2 s each would be 2.8 s"
        fed = [r for r, x in got.items() if x.source == "http"]
        waiting = [r for r, x in got.items() if "asked again within a minute" in x.why]
        assert len(fed) == 2 and len(waiting) == len(got) - 2
        fine, detail = grid_carbon.carbon_summary(got)
        assert not fine and "fell back to their constant because the feed failed" in detail
    finally:
        stub.server.shutdown()
        stub.server.server_close()


def test_the_operator_page_draws_each_grid_ahead_and_says_which_regions_are_on_their_constant(feed_is, operator) -> None:  # type: ignore[no-untyped-def]
    import re

    feed_is("eia-2022")
    c = Client()
    c.force_login(operator)
    page = c.get("/operator/").content.decode()
    ahead = grid_carbon.carbon_ahead(datetime.now(UTC))
    east = re.search(r'<tr data-grid="us-east" data-source="eia-2022 replay">.*?</tr>', page, re.S)
    assert east is not None, "us-east is drawn from the replay"
    row = east.group(0)
    cells = re.findall(r'<td class="num">([0-9]+)(?: in ([0-9]+) h)?</td>', row)
    (now, _), (low, low_in) = cells
    assert abs(int(now) - ahead["us-east"].g_per_kwh[0]) <= 0.5  # the page rounds the figure the rounds price
    assert row.count(",") == grid_carbon.FORECAST_HOURS, "one point per hour ahead"
    least = min(ahead["us-east"].g_per_kwh)
    assert abs(int(low) - least) <= 0.5 and int(low_in) == ahead["us-east"].g_per_kwh.index(least)
    assert re.search(r'<tr data-grid="eu-west" data-source="constant">.*?flat: its constant.*?has no series for eu-west', page, re.S)


def test_measuring_a_jobs_carbon_never_loses_a_receipt_that_lands_meanwhile(feed_is, make_job, provider_user, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """The clean-clone run lost a receipt: the carbon task read the job, the agent's receipt
    was stored in its checkpoint, and the task wrote its stale copy back ("Job 5 has no
    receipt yet" to every output upload after). The receipt lands here while the task
    computes the hours' mean, between its read and its write."""
    from datetime import timedelta

    from market.models import Job

    feed_is("eia-2022")
    job = make_job(provider_user, gpus=1)
    start = datetime(2022, 4, 10, 10, 30, tzinfo=UTC)
    Job.objects.filter(pk=job.pk).update(state="completed", started_at=start, ended_at=start + timedelta(hours=1), gpu_seconds=3600)
    real = carbon.mean_over

    def receipt_lands(values, t, seconds):  # type: ignore[no-untyped-def]
        Job.objects.filter(pk=job.pk).update(checkpoint={"receipt": {"digest": "ab"}})
        return real(values, t, seconds)

    monkeypatch.setattr(carbon, "mean_over", receipt_lands)
    assert grid_carbon.job_carbon(job.pk) is not None
    job.refresh_from_db()
    assert job.checkpoint["receipt"] == {"digest": "ab"}, "the receipt stays"
    assert job.checkpoint["carbon"]["source"] == "eia-2022 replay" and job.kg_co2 is not None

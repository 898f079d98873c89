"""Deferrable bids (issue 37): a bid that may start later waits for a cleaner hour of the
grid, says which, and bids once that hour comes or its latest start does; on PostgreSQL,
through real rounds, against a live carbon feed served on 127.0.0.1."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from django.utils import timezone

from market import grid_carbon
from market.models import AuctionRound, Bid, Trade
from tests.conftest import bid_body
from tests.unit.test_carbon import Stub

pytestmark = pytest.mark.django_db

DIRTY, CLEAN = 500.0, 100.0


@pytest.fixture
def feed(settings: Any) -> Iterator[Stub]:
    """A live feed where us-east is DIRTY until ``stub.clean_from`` (unix s) and CLEAN from then."""
    stub = Stub()
    stub.clean_from = 2**40  # type: ignore[attr-defined]

    def answer(region: str, start: int, hours: int) -> tuple[int, Any]:
        if region != "us-east":
            return 404, {"error": "no series"}
        first = start - start % 3600
        values = [CLEAN if first + 3600 * k >= stub.clean_from else DIRTY for k in range(hours)]  # type: ignore[attr-defined]
        return 200, {"region": region, "start": first, "g_co2_per_kwh": values}

    stub.answer = answer
    settings.CONFIG = dataclasses.replace(settings.CONFIG, carbon_feed=stub.url)
    grid_carbon._readings.clear()
    try:
        yield stub
    finally:
        grid_carbon._readings.clear()
        stub.server.shutdown()
        stub.server.server_close()


def test_a_deferrable_bid_waits_for_the_cleaner_hour_and_matches_in_it(feed, buyer, client_for, provider_user, make_offer) -> None:  # type: ignore[no-untyped-def]
    from market.rounds import round_clear

    make_offer(provider_user, count=8)  # H100-SXM-80GB in us-east
    now = timezone.now()
    hour = now.replace(minute=0, second=0, microsecond=0)
    feed.clean_from = int((hour + timedelta(hours=2)).timestamp())
    api = client_for(buyer)
    quoted = api.post("/api/v1/quote/", bid_body(gpus=2, duration_s=3600, deferrable_until=(now + timedelta(hours=6)).isoformat()), format="json").json()
    assert quoted["waits"].startswith("waiting for a cleaner hour: 100 g/kWh expected at"), quoted
    assert quoted["trades"], "what it would get now, were it to bid now"
    assert api.post("/api/v1/quote/", bid_body(gpus=2, duration_s=3600), format="json").json()["waits"] is None
    later = api.post("/api/v1/bids/", bid_body(gpus=2, duration_s=3600, deferrable_until=(now + timedelta(hours=6)).isoformat()), format="json")
    assert later.status_code == 201, later.json()
    at_once = api.post("/api/v1/bids/", bid_body(gpus=2, duration_s=3600), format="json").json()
    rnd = round_clear(now=timezone.now())
    assert rnd is not None and rnd.stats["set_aside"]["deferred_bids"] == [later.json()["id"]]
    assert Trade.objects.filter(bid_id=at_once["id"]).exists(), "a bid that does not defer trades at once"
    assert not Trade.objects.filter(bid_id=later.json()["id"]).exists()
    why = api.get(f"/api/v1/bids/{later.json()['id']}/").json()["explanation"]
    at = hour + timedelta(hours=2)
    assert why["deferred"] and why["cleaner_at"] == at.astimezone(UTC).isoformat()
    assert why["reasons"] == [f"waiting for a cleaner hour: 100 g/kWh expected at {at:%H:%M} UTC in us-east vs "
                              f"{why['carbon']['now_g_per_kwh']:.0f} now; {why['carbon']['saving_kg']:.2f} kg CO2 less"]
    # a 1-hour run from now is all in the dirty hours; on 2 H100s (0.7 kW each) it draws 1.4 kWh
    assert why["carbon"]["now_g_per_kwh"] == DIRTY and why["carbon"]["expected_g_per_kwh"] == CLEAN
    assert why["carbon"]["saving_kg"] == pytest.approx((DIRTY - CLEAN) * 1.4 / 1000)  # 0.56 kg
    # the hour before the clean one it still waits; in the clean hour it bids and matches
    round_clear(now=at - timedelta(minutes=30))
    assert not Trade.objects.filter(bid_id=later.json()["id"]).exists()
    rnd = round_clear(now=at + timedelta(minutes=1))
    trade = Trade.objects.get(bid_id=later.json()["id"])
    assert trade.round_id == rnd.pk and rnd.stats["set_aside"]["deferred_bids"] == []
    us_east = next(r for r in AuctionRound.objects.get(pk=rnd.pk).inputs["regions"] if r["id"] == "us-east")
    assert us_east["carbon_g_per_kwh"] == CLEAN, "it ran in the cleaner hour, as the round's stored inputs show"


def test_past_its_latest_start_a_deferrable_bid_bids_whatever_the_hour(feed, buyer, client_for, provider_user, make_offer) -> None:  # type: ignore[no-untyped-def]
    from market.rounds import round_clear

    make_offer(provider_user, count=8)
    now = timezone.now()
    feed.clean_from = int((now + timedelta(hours=3)).timestamp()) // 3600 * 3600
    bid = client_for(buyer).post("/api/v1/bids/", bid_body(gpus=2, deferrable_until=(now + timedelta(minutes=30)).isoformat()), format="json").json()
    round_clear(now=timezone.now())  # the clean hour is past its latest start: nothing to wait for
    assert Trade.objects.filter(bid_id=bid["id"]).exists()
    assert not Bid.objects.get(pk=bid["id"]).explanation.get("deferred")


def test_a_bid_with_nothing_to_gain_bids_at_once(feed, buyer, client_for, provider_user, make_offer) -> None:  # type: ignore[no-untyped-def]
    from market.rounds import round_clear

    make_offer(provider_user, count=8)
    bid = client_for(buyer).post("/api/v1/bids/", bid_body(gpus=2, deferrable_until=(timezone.now() + timedelta(hours=6)).isoformat()), format="json").json()
    round_clear(now=timezone.now())  # dirty all day: no cleaner hour ahead
    assert Trade.objects.filter(bid_id=bid["id"]).exists()


@pytest.mark.parametrize(("change", "field", "says"), [
    (lambda now: {"deferrable_until": (now - timedelta(minutes=1)).isoformat()}, "deferrable_until", "after now"),
    (lambda now: {"deferrable_until": (now + timedelta(hours=49)).isoformat()}, "deferrable_until", "At most 48 hours"),
    (lambda now: {"deferrable_until": (now + timedelta(hours=5)).isoformat(), "expires_at": (now + timedelta(hours=4)).isoformat()},
     "deferrable_until", "before the bid's expiry"),
    (lambda now: {"deferrable_until": (now + timedelta(hours=5)).isoformat(), "deadline": (now + timedelta(hours=5, minutes=30)).isoformat()},
     "deferrable_until", "finish by the deadline"),
    (lambda now: {"deferrable_until": (now + timedelta(hours=5)).isoformat(), "weights": {"carbon_per_kg": 0}}, "deferrable_until", "would never wait"),
    (lambda now: {"deferrable_until": "tomorrow"}, "deferrable_until", "format"),
])
def test_a_bad_deferrable_until_is_refused_with_what_to_do(buyer, client_for, change, field, says) -> None:  # type: ignore[no-untyped-def]
    now = datetime.now(UTC)
    response = client_for(buyer).post("/api/v1/bids/", bid_body(**change(now)), format="json")
    assert response.status_code == 400, response.json()
    assert says in str(response.json()), response.json()
    assert not Bid.objects.exists()

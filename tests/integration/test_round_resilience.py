"""One order cannot halt the market, and a round whose worker died does not stay `clearing`.

The outside review placed a bid with max_price 10**15 (the API's old limit) into a book the
engine caps at 10**12: every round failed, and every user's quote answered 400, until the
bid was removed by hand. These tests put such orders straight into the database (as rows
written under the old limits, or by any path that skips the API) and check that the round
goes on around them and their owners are told why.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from market import engine, rounds
from market.api import serializers as s
from market.engine import limits
from market.models import AuctionRound, Bid, Offer, Trade
from market.rounds import round_clear
from market.states import RoundState
from tests.conftest import bid_body

pytestmark = pytest.mark.django_db


def test_a_bid_over_the_engines_price_limit_is_set_aside_and_the_round_goes_on(buyer, stranger, provider_user, make_offer, make_bid):
    make_offer(provider_user, price=2_000_000, count=8)
    bad = make_bid(stranger, gpus=1)
    Bid.objects.filter(pk=bad.pk).update(max_price=10**15)  # a row written before the limits were one
    good = make_bid(buyer, gpus=4, max_price=3_000_000)
    rnd = round_clear()
    assert rnd.state == RoundState.CLEARED, rnd.error
    assert Trade.objects.get().bid_id == good.pk
    bad.refresh_from_db()
    assert bad.state == "open" and bad.explanation["matched"] is False and bad.explanation["set_aside"] is True
    reason = " ".join(bad.explanation["reasons"])
    assert "max_price" in reason and "1,000,000,000,000" in reason, reason
    assert rnd.stats["set_aside"] == {"bids": [bad.pk], "offers": [], "unfunded_bids": [], "deferred_bids": []}
    assert all(b["id"] != bad.pk for b in rnd.inputs["bids"]), "stored inputs hold only what the engine cleared"


def test_a_bid_with_weights_over_the_limit_is_set_aside(buyer, stranger, provider_user, make_offer, make_bid):
    make_offer(provider_user, count=8)
    bad = make_bid(stranger, gpus=1)
    Bid.objects.filter(pk=bad.pk).update(weights={"reliability": 1e15})
    make_bid(buyer, gpus=1)
    rnd = round_clear()
    assert rnd.state == RoundState.CLEARED, rnd.error
    assert Trade.objects.filter(bid__buyer=buyer).count() == 1
    bad.refresh_from_db()
    assert "weights.reliability" in " ".join(bad.explanation["reasons"])


def test_an_offer_over_the_price_limit_is_paused_with_the_reason_and_the_round_goes_on(buyer, provider_user, other_provider_user, make_offer, make_bid, client_for):
    bad = make_offer(other_provider_user, price=2_000_000, count=8)
    Offer.objects.filter(pk=bad.pk).update(price=10**15)
    good = make_offer(provider_user, price=2_500_000, count=8)
    make_bid(buyer, gpus=4, max_price=3_000_000)
    rnd = round_clear()
    assert rnd.state == RoundState.CLEARED, rnd.error
    assert Trade.objects.get().offer_id == good.pk
    bad.refresh_from_db()
    assert (bad.state, bad.paused_by) == ("paused", "limits")
    assert rnd.stats["set_aside"]["offers"] == [bad.pk]
    shown = client_for(other_provider_user).get(f"/api/v1/offers/{bad.pk}/").json()
    assert (shown["state"], shown["paused_by"]) == ("paused", "limits")


def test_a_quote_ignores_someone_elses_bad_order(buyer, stranger, provider_user, make_offer, make_bid, client_for):
    make_offer(provider_user, price=2_000_000, count=8)
    bad = make_bid(stranger, gpus=1)
    Bid.objects.filter(pk=bad.pk).update(max_price=10**15)
    resp = client_for(buyer).post("/api/v1/quote/", bid_body(gpus=2), format="json")
    assert resp.status_code == 200, resp.json()
    assert resp.json()["would_match"] is True


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_price", limits.MAX_PRICE + 1), ("weights", {"reliability": limits.MAX_WEIGHT * 10}),
     ("weights", {"non_preferred_region": limits.MAX_WEIGHT * 10})],
)
def test_the_api_refuses_a_bid_the_engine_could_not_take(buyer, client_for, field, value):
    resp = client_for(buyer).post("/api/v1/bids/", bid_body(**{field: value}), format="json")
    assert resp.status_code == 400, resp.json()
    assert resp.json()["error"]["code"] == "invalid"
    assert Bid.objects.count() == 0


def test_the_api_refuses_an_offer_price_the_engine_could_not_take(provider_user, make_machine, client_for):
    machine = make_machine(provider_user, count=8)
    resp = client_for(provider_user).post(
        "/api/v1/offers/", {"machine": machine.pk, "gpu_model": "H100-SXM-80GB", "gpus": 8, "price": limits.MAX_PRICE + 1}, format="json")
    assert resp.status_code == 400, resp.json()
    assert "price" in resp.json()["error"]["fields"]


def test_every_api_maximum_is_inside_the_engines_limits(buyer, provider_user, make_offer, make_bid):
    """A bid and an offer at every API maximum at once still validate in the engine."""
    fields = s.BidCreateSerializer().fields
    weights = {name: f.max_value for name, f in s.WeightsSerializer().fields.items()}
    bid = make_bid(buyer, gpus=fields["gpus"].max_value, max_price=fields["max_price"].max_value,
                   duration_s=fields["duration_s"].max_value, min_memory_gib=fields["min_memory_gib"].max_value,
                   min_compute_units=fields["min_compute_units"].max_value, weights=weights,
                   location_region="us-east", max_latency_ms=fields["max_latency_ms"].max_value)
    offer_fields = s.OfferCreateSerializer().fields
    offer = make_offer(provider_user, price=offer_fields["price"].max_value,
                       max_duration_s=offer_fields["max_duration_s"].max_value)
    from market import repository

    inp = repository.snapshot(now=timezone.now())
    screened, rejected = engine.screen(inp)
    assert rejected == ()
    assert {b.id for b in screened.bids} == {bid.pk} and {o.id for o in screened.offers} == {offer.pk}


def test_a_round_left_clearing_by_a_dead_worker_is_failed_when_its_lease_expires(buyer, provider_user, make_offer, make_bid):
    make_offer(provider_user, count=8)
    make_bid(buyer, gpus=1)
    long_ago = timezone.now() - timedelta(hours=2)
    dead = AuctionRound.objects.create(number=1, slot=1, scheduled_for=long_ago, lease_expires_at=long_ago + timedelta(minutes=15))
    alive = AuctionRound.objects.create(number=2, slot=2, scheduled_for=timezone.now(), lease_expires_at=timezone.now() + timedelta(minutes=15))
    assert rounds.rounds_recover() == 1
    dead.refresh_from_db()
    alive.refresh_from_db()
    assert dead.state == RoundState.FAILED and "lease" in dead.error
    assert alive.state == RoundState.CLEARING
    rnd = round_clear()
    assert rnd.state == RoundState.CLEARED and rnd.number == 3


def test_the_next_round_recovers_a_dead_round(buyer, provider_user, make_offer, make_bid):
    make_offer(provider_user, count=8)
    make_bid(buyer, gpus=1)
    long_ago = timezone.now() - timedelta(hours=2)
    dead = AuctionRound.objects.create(number=1, slot=1, scheduled_for=long_ago, lease_expires_at=long_ago)
    round_clear()
    dead.refresh_from_db()
    assert dead.state == RoundState.FAILED


def test_a_claimed_round_carries_a_lease(buyer, provider_user, make_offer, make_bid):
    make_offer(provider_user, count=8)
    make_bid(buyer, gpus=1)
    before = timezone.now()
    rnd = round_clear()
    assert rnd.lease_expires_at is not None and rnd.lease_expires_at > before

"""Bids need money behind them: a bid whose worst case (max price x GPUs x hours) the buyer's
free escrow does not cover is refused with 402 naming the shortfall, the quote says so, and
a round leaves out a bid that lost its cover (the buyer withdrew) without holding any GPU.

Escrow here is the journal's free balance, as the listener writes it from confirmed
`Deposited` events (`escrow_credit`); tests/e2e deposit on a real chain."""

from __future__ import annotations

import pytest

from market.models import Bid, Booking, Trade
from market.rounds import round_clear
from tests.conftest import bid_body, escrow_credit

pytestmark = pytest.mark.django_db

USDC = 10**6


@pytest.fixture
def poor(make_user):
    return make_user("poor")  # signed up, never deposited


def test_an_unfunded_bid_is_refused_with_402_naming_the_shortfall_and_places_nothing(poor, client_for, make_offer, provider_user):
    make_offer(provider_user)
    r = client_for(poor).post("/api/v1/bids/", bid_body(gpus=2, max_price=3 * USDC, duration_s=3600), format="json")
    assert r.status_code == 402, r.content
    err = r.json()["error"]
    assert err["code"] == "insufficient_escrow"
    assert "6.00 USDC" in err["message"] and "Deposit at least 6.00 USDC more" in err["message"]
    assert err["details"] == {"cost": 6 * USDC, "free": 0, "committed": 0, "available": 0, "shortfall": 6 * USDC}
    assert not Bid.objects.filter(buyer=poor).exists()


def test_a_bid_covered_by_free_escrow_is_placed_and_open_bids_use_up_the_cover(poor, client_for):
    escrow_credit(poor, 10 * USDC)
    api = client_for(poor)
    assert api.post("/api/v1/bids/", bid_body(gpus=2, max_price=3 * USDC, duration_s=3600), format="json").status_code == 201  # 6 of 10
    second = api.post("/api/v1/bids/", bid_body(gpus=2, max_price=3 * USDC, duration_s=3600), format="json")
    assert second.status_code == 402
    assert second.json()["error"]["details"] == {"cost": 6 * USDC, "free": 10 * USDC, "committed": 6 * USDC, "available": 4 * USDC, "shortfall": 2 * USDC}
    assert api.post("/api/v1/bids/", bid_body(gpus=1, max_price=4 * USDC, duration_s=3600), format="json").status_code == 201  # exactly the 4 left


def test_the_quote_says_an_unfunded_bid_would_not_match_and_how_much_to_deposit(poor, client_for, make_offer, provider_user):
    make_offer(provider_user, price=2 * USDC)
    body = client_for(poor).post("/api/v1/quote/", bid_body(gpus=1, max_price=3 * USDC, duration_s=7200), format="json").json()
    assert body["would_match"] is False and body["funded"] is False
    assert (body["max_cost"], body["escrow_available"]) == (6 * USDC, 0)
    assert "deposit at least 6.00 USDC more" in body["reasons"][0]
    assert body["trades"], "it says which offer would take it once funded"
    escrow_credit(poor, 6 * USDC)
    body = client_for(poor).post("/api/v1/quote/", bid_body(gpus=1, max_price=3 * USDC, duration_s=7200), format="json").json()
    assert (body["would_match"], body["funded"], body["reasons"]) == (True, True, [])


def test_a_bid_that_lost_its_cover_is_left_out_of_the_round_and_holds_no_gpu(poor, make_bid, make_offer, provider_user):
    from ledger.custody import custodial_key_get_or_create
    from ledger.journal import Leg, journal_append

    offer = make_offer(provider_user, count=2, price=2 * USDC)
    bid = make_bid(poor, gpus=1, max_price=3 * USDC, duration_s=3600)  # make_bid deposits exactly its 3 USDC
    address = custodial_key_get_or_create(user=poor).address
    journal_append(legs=[Leg("withdraw", f"wallet:{address}", f"free:{address}", 2 * USDC)], tx_hash="0x" + "77" * 32, log_index=0,
                   block_number=2, block_hash="0x" + "cd" * 32)  # the buyer withdrew 2 of it on chain
    rnd = round_clear(slot=30_000_001)
    bid.refresh_from_db()
    offer.refresh_from_db()
    assert bid.state == "open" and bid.explanation["unfunded"] is True
    assert "Deposit at least 2.00 USDC more" in bid.explanation["reasons"][0]
    assert not Trade.objects.filter(bid=bid).exists() and not Booking.objects.exists() and offer.gpus_free == 2
    assert rnd is not None and rnd.stats["set_aside"]["unfunded_bids"] == [bid.pk]
    escrow_credit(poor, 2 * USDC)  # deposits again: the next round matches it
    round_clear(slot=30_000_002)
    bid.refresh_from_db()
    assert bid.state == "matched"


def test_two_bids_of_one_buyer_share_its_cover_oldest_first(poor, make_bid, make_offer, provider_user):
    from ledger.custody import custodial_key_get_or_create
    from ledger.journal import Leg, journal_append

    make_offer(provider_user, count=8, price=2 * USDC)
    older = make_bid(poor, gpus=1, max_price=3 * USDC, duration_s=3600)
    newer = make_bid(poor, gpus=1, max_price=3 * USDC, duration_s=3600)
    address = custodial_key_get_or_create(user=poor).address
    journal_append(legs=[Leg("withdraw", f"wallet:{address}", f"free:{address}", 3 * USDC)], tx_hash="0x" + "78" * 32, log_index=0,
                   block_number=2, block_hash="0x" + "cd" * 32)
    round_clear(slot=30_000_003)
    older.refresh_from_db()
    newer.refresh_from_db()
    assert (older.state, newer.state) == ("matched", "open") and newer.explanation["unfunded"]

"""Backfilling the public channels over REST by range (issue 34): the trade tape by id, with
the `trades` channel's own objects, and the rounds by number."""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.django_db


@pytest.fixture
def three_trades(buyer: Any, provider_user: Any, make_offer: Any, make_bid: Any) -> list[int]:
    from market.models import Trade
    from market.rounds import round_clear

    for _ in range(3):
        make_offer(provider_user, price=2_000_000, count=2)
        make_bid(buyer, gpus=2)
    round_clear()
    return list(Trade.objects.order_by("id").values_list("id", flat=True))


def test_the_trade_tape_backfills_a_range_with_the_channels_own_objects(three_trades: list[int], anon: Any) -> None:
    from market.models import Trade
    from market.streams.snapshots import trade_public

    first, second, third = three_trades
    page = anon.get(f"/api/v1/markets/trades/?from_id={second}").json()
    assert page == {"trades": [trade_public(Trade.objects.select_related("round").get(pk=i)) for i in (second, third)], "next_from_id": None}
    page = anon.get(f"/api/v1/markets/trades/?from_id={first}&to_id={third}&limit=2").json()
    assert [t["id"] for t in page["trades"]] == [first, second] and page["next_from_id"] == third
    assert anon.get(f"/api/v1/markets/trades/?from_id={third + 1}").json() == {"trades": [], "next_from_id": None}


@pytest.mark.parametrize(("query", "field"), [("", "from_id"), ("?from_id=0", "from_id"), ("?from_id=x", "from_id"),
                                              ("?from_id=5&to_id=4", "to_id"), ("?from_id=1&limit=501", "limit")])
def test_a_bad_tape_range_is_a_400_naming_the_field(query: str, field: str, anon: Any) -> None:
    r = anon.get(f"/api/v1/markets/trades/{query}")
    assert r.status_code == 400 and field in r.json()["error"]["fields"], r.json()


def test_rounds_backfill_by_number_range(anon: Any) -> None:
    from datetime import timedelta

    from django.utils import timezone

    from market.models import AuctionRound

    now = timezone.now()
    for n in range(1, 6):
        AuctionRound.objects.create(number=n, slot=n, state="cleared", scheduled_for=now, cleared_at=now + timedelta(seconds=n),
                                    prices=[], stats={"trades": n, "matched_gpus": 0, "bids": 0})
    got = anon.get("/api/v1/rounds/?number_from=2&number_to=4&ordering=number").json()
    rows = got["results"] if isinstance(got, dict) else got
    assert [(r["number"], r["stats"]["trades"]) for r in rows] == [(2, 2), (3, 3), (4, 4)]
    r = anon.get("/api/v1/rounds/?number_from=-1")
    assert r.status_code == 400 and "number_from" in r.json()["error"]["fields"]

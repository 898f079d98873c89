"""A market's future window by window (issue 40, part 2: `market.forward`, GET
/api/v1/markets/<key>/forward/ and the market page's calendar), against a hand computation
over offers with selling windows, a lent offer's reclaim hours and held bookings."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone

from contracts import hours
from market.forward import forward_windows, window_start
from market.models import Booking, Offer

pytestmark = pytest.mark.django_db

H = timedelta(hours=1)


@pytest.fixture
def book(provider_user: Any, make_offer: Any, make_job: Any) -> dict[str, Any]:
    """At 10 past the hour `t0`, in H100 us-east:
    - A: 8 GPUs at 2.00, selling from long ago for ever; a booking holds 2 of them until t0+3h
      and another 1 from t0+5h to t0+7h (a forward booking);
    - B: 4 GPUs at 1.50, selling from t0+2h until t0+6h;
    - C: 2 GPUs at 1.00, lent, taken back by its owner at the UTC hour of t0+4h each day;
    - D: 6 GPUs at 0.50, paused by its provider (no known return): in no window;
    and an A100 offer in the same region, another market."""
    t0 = window_start(timezone.now(), "hour")
    now = t0 + timedelta(minutes=10)
    a = make_offer(provider_user, price=2_000_000, count=8)
    b = make_offer(provider_user, price=1_500_000, count=4)
    c = make_offer(provider_user, price=1_000_000, count=2)
    d = make_offer(provider_user, price=500_000, count=6)
    make_offer(provider_user, model="A100-SXM-80GB", price=900_000, count=8)
    Offer.objects.filter(pk=a.pk).update(available_from=t0 - 30 * H, available_until=None)
    Offer.objects.filter(pk=b.pk).update(available_from=t0 + 2 * H, available_until=t0 + 6 * H)
    Offer.objects.filter(pk=c.pk).update(available_from=t0 - H, reclaimable=True, spot_allowed=True,
                                         reclaim_hours=1 << (t0 + 4 * H).hour)
    Offer.objects.filter(pk=d.pk).update(state="paused", paused_by="provider")
    first = make_job(provider_user, offer=a, gpus=2)
    Booking.objects.filter(trade=first.trade).update(starts_at=t0 - H, ends_at=t0 + 3 * H)
    later = make_job(provider_user, offer=a, gpus=1)
    Booking.objects.filter(trade=later.trade).update(starts_at=t0 + 5 * H, ends_at=t0 + 7 * H)
    return {"t0": t0, "now": now}


# (GPUs free, offers, best ask) in each hour from t0, worked by hand from the fixture's book
BY_HAND = [
    (6 + 2, 2, 1_000_000),  # t0: A 8-2, C 2
    (6 + 2, 2, 1_000_000),
    (6 + 4 + 2, 3, 1_000_000),  # t0+2h: B opens
    (8 + 4 + 2, 3, 1_000_000),  # t0+3h: A's first booking has ended
    (8 + 4, 2, 1_500_000),  # t0+4h: C's owner takes it back
    (7 + 4 + 2, 3, 1_000_000),  # t0+5h: A's forward booking holds 1
    (7 + 2, 2, 1_000_000),  # t0+6h: B's window has closed
    (8 + 2, 2, 1_000_000),  # t0+7h
]


def test_each_hour_ahead_shows_the_gpus_free_all_of_it_and_their_best_ask(book: dict[str, Any]) -> None:
    got = forward_windows("H100-SXM-80GB", "us-east", now=book["now"], step="hour", count=len(BY_HAND))
    assert [(w.gpus_free, w.offers, w.best_ask) for w in got] == BY_HAND
    assert [w.starts_at for w in got] == [book["t0"] + k * H for k in range(len(BY_HAND))]
    assert all(w.ends_at - w.starts_at == H for w in got)


def test_a_day_counts_what_is_free_for_the_whole_of_it(book: dict[str, Any]) -> None:
    t0 = book["t0"]
    [today, tomorrow] = forward_windows("H100-SXM-80GB", "us-east", now=book["now"], step="day", count=2)
    assert today.starts_at == t0.replace(hour=0) and tomorrow.starts_at == today.ends_at
    # only A sells all day: B sells four hours of it, C's owner takes it back one hour of each
    # day. A loses the GPUs its bookings hold at some moment of the day, each GPU once
    first, later = (set(b.gpu_indexes) for b in Booking.objects.order_by("id"))
    assert len(first) == 2 and len(later) == 1

    def a_free(day_start: Any) -> int:
        day_end = day_start + 24 * H
        held = (first if t0 - H < day_end and t0 + 3 * H > day_start else set()) | (later if t0 + 5 * H < day_end and t0 + 7 * H > day_start else set())
        return 8 - len(held)

    assert (today.gpus_free, today.offers, today.best_ask) == (a_free(today.starts_at), 1, 2_000_000)
    assert (tomorrow.gpus_free, tomorrow.offers, tomorrow.best_ask) == (a_free(tomorrow.starts_at), 1, 2_000_000)


def test_an_offer_paused_by_its_reclaim_schedule_counts_once_its_hours_end(book: dict[str, Any], provider_user: Any) -> None:
    lent = Offer.objects.get(reclaimable=True)
    Offer.objects.filter(pk=lent.pk).update(state="paused", paused_by="schedule")
    got = forward_windows("H100-SXM-80GB", "us-east", now=book["now"], count=6)
    assert [w.gpus_free for w in got] == [h[0] for h in BY_HAND[:6]]  # as open: it comes back when its hours end
    assert hours.covers(lent.reclaim_hours, book["t0"] + 4 * H)


def test_the_api_gives_the_calendar_and_refuses_what_it_cannot_answer(book: dict[str, Any], anon: Any) -> None:
    r = anon.get("/api/v1/markets/H100-SXM-80GB.us-east/forward/", {"count": 8})
    assert r.status_code == 200, r.content
    body = r.json()
    start = window_start(timezone.now(), "hour")
    if start != book["t0"]:
        pytest.skip("the hour turned during the test: the figures are for another hour than the fixture's")
    assert (body["key"], body["step"], body["last_price"]) == ("H100-SXM-80GB.us-east", "hour", None)
    assert [(w["gpus_free"], w["offers"], w["best_ask"]) for w in body["windows"]] == BY_HAND
    assert body["windows"][0]["starts_at"] == book["t0"].isoformat()
    assert len(anon.get("/api/v1/markets/H100-SXM-80GB.us-east/forward/").json()["windows"]) == 48
    assert len(anon.get("/api/v1/markets/H100-SXM-80GB.us-east/forward/", {"step": "day"}).json()["windows"]) == 14

    def refused(url: str, params: dict[str, Any], status: int, says: str) -> None:
        got = anon.get(url, params)
        assert got.status_code == status, (params, got.content)
        assert says in got.content.decode(), (params, got.content)

    url = "/api/v1/markets/H100-SXM-80GB.us-east/forward/"
    refused(url, {"step": "week"}, 400, "not a valid choice")
    refused(url, {"count": "0"}, 400, "greater than or equal to 1")
    refused(url, {"count": "169"}, 400, "At most 168 windows of a hour")
    refused(url, {"step": "day", "count": "61"}, 400, "At most 60 windows of a day")
    refused(url, {"count": "lots"}, 400, "valid integer")
    refused("/api/v1/markets/H100-SXM-80GB.mars/forward/", {}, 404, "regions: ")
    refused("/api/v1/markets/H100/forward/", {}, 404, "a market is <gpu_model>.<region>")


def test_the_market_page_draws_the_calendar_with_the_apis_figures(book: dict[str, Any], anon: Any) -> None:
    from django.test import Client

    page = Client().get("/markets/H100-SXM-80GB/us-east/").content.decode()
    api = anon.get("/api/v1/markets/H100-SXM-80GB.us-east/forward/").json()["windows"]
    if window_start(timezone.now(), "hour") != book["t0"]:
        pytest.skip("the hour turned during the test")
    assert 'id="forward-calendar"' in page
    bars = [int(x.split('"')[0]) for x in page.split('data-gpus-free="')[1:]]
    assert bars == [w["gpus_free"] for w in api]


def test_an_agents_rule_publishes_its_window_and_moves_it_through_the_api(provider_user: Any, make_machine: Any, agent_for: Any) -> None:
    """The agent's pricing rule says when its GPUs sell (`price set --from --until`): its sync
    publishes the offer with that window, a second sync finds nothing to change (the market
    writes the times its own way), a moved rule moves it, and the calendar follows."""
    from providers.agent.config import PricingRule
    from providers.agent.offers import offers_sync
    from providers.agent.pricing import validate_rule

    machine = make_machine(provider_user, model="L4-24GB", count=2, region="us-east")
    t0 = window_start(timezone.now(), "hour")
    rule = validate_rule(PricingRule("L4-24GB", price=300_000, available_from=(t0 + 2 * H).isoformat(), available_until=(t0 + 5 * H).isoformat()))
    agent = agent_for(provider_user, machine, pricing=[rule])
    assert [a.kind for a in offers_sync(agent.client, agent.config, agent.inventory)] == ["publish"]
    offer = Offer.objects.get(machine=machine)
    assert (offer.available_from, offer.available_until) == (t0 + 2 * H, t0 + 5 * H)
    assert offers_sync(agent.client, agent.config, agent.inventory) == []
    agent.config.pricing = [validate_rule(PricingRule("L4-24GB", price=300_000, available_from=(t0 + H).isoformat(), available_until=(t0 + 3 * H).isoformat()))]
    [moved] = offers_sync(agent.client, agent.config, agent.inventory)
    assert moved.kind == "update" and set(moved.changes or {}) == {"available_from", "available_until"}
    got = forward_windows("L4-24GB", "us-east", now=t0 + timedelta(minutes=1), count=5)
    assert [w.gpus_free for w in got] == [0, 2, 2, 0, 0]


def test_a_buyer_sees_when_an_offer_sells_on_the_offers_and_market_pages(book: dict[str, Any]) -> None:
    from django.test import Client

    b = Offer.objects.get(price=1_500_000)  # B: from t0+2h until t0+6h
    fmt = "%d %b %H:%M"
    says = f"sells from {(book['t0'] + 2 * H).strftime(fmt)} until {(book['t0'] + 6 * H).strftime(fmt)} UTC"
    for url in ("/offers/?gpu_model=H100-SXM-80GB", "/markets/H100-SXM-80GB/us-east/"):
        page = Client().get(url).content.decode()
        assert page.count('data-field="window"') == 1 and says in page, (url, b.pk)

"""Issue 32, defect 8: My orders pages, filters by state and day placed, and searches, on the
page and in the API (which already paged), with bad filters answered in words, not a 500."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from market.models import Bid

pytestmark = pytest.mark.django_db

USDC = 10**6


@pytest.fixture
def orders(buyer, stranger, make_bid):
    """60 bids of the buyer's, newest last: 10 cancelled, 5 placed three days ago, one per
    image; and a stranger's, which the buyer never sees."""
    bids = [make_bid(buyer, client_order_id=f"run-{i:02d}", job_spec={"image": f"ghcr.io/acme/img{i}:1"}, max_price=USDC)
            for i in range(60)]
    Bid.objects.filter(pk__in=[b.pk for b in bids[:10]]).update(state="cancelled")
    Bid.objects.filter(pk__in=[b.pk for b in bids[10:15]]).update(created_at=timezone.now() - timedelta(days=3))
    make_bid(stranger, client_order_id="run-99")
    return bids


def _page(client: Client, query: str = "") -> str:
    r = client.get("/orders/" + query)
    assert r.status_code == 200
    return r.content.decode()


def _shown(html: str) -> list[int]:
    return [int(x) for x in re.findall(r'data-order="(\d+)"', html)]


def test_my_orders_pages_newest_first_and_keeps_the_filters_on_every_page(buyer, orders):
    c = Client()
    c.force_login(buyer)
    ids = sorted((b.pk for b in orders), reverse=True)
    newest = sorted(orders[:10] + orders[15:], key=lambda b: -b.pk) + sorted(orders[10:15], key=lambda b: -b.pk)  # those 3 days old last
    first = _page(c)
    assert len(_shown(first)) == 25 and "Orders 1–25 of 60" in first and "page 1 of 3" in first
    assert _shown(first) == [b.pk for b in newest[:25]]
    third = _page(c, "?page=3")
    assert _shown(third) == [b.pk for b in newest[50:]] and "Orders 51–60 of 60" in third
    assert set(_shown(first) + _shown(_page(c, "?page=2")) + _shown(third)) == set(ids), "every order on exactly one page"
    assert _shown(_page(c, "?page=99")) == _shown(third) and _shown(_page(c, "?page=x")) == _shown(first)

    cancelled = _page(c, "?state=cancelled")
    assert sorted(_shown(cancelled)) == sorted(b.pk for b in orders[:10]) and "Orders 1–10 of 10 matching" in cancelled
    two = _page(c, "?state=open&page=2")
    assert 'href="?state=open&amp;page=1"' in two, "the pager keeps the filter"

    today = timezone.now().date()
    old = _page(c, f"?until={today - timedelta(days=1)}")
    assert sorted(_shown(old)) == sorted(b.pk for b in orders[10:15])
    assert len(_shown(_page(c, f"?since={today}&state=open"))) == 25

    assert _shown(_page(c, "?q=run-42")) == [orders[42].pk]
    assert _shown(_page(c, "?q=IMG7:")) == [orders[7].pk], "the image, in any case"
    assert _shown(_page(c, f"?q=%23{orders[3].pk}")) == [orders[3].pk]
    none = _page(c, "?q=run-99")
    assert _shown(none) == [] and "No orders match" in none, "a stranger's order is never found"


def test_bad_filters_say_what_to_fix(buyer, orders):
    c = Client()
    c.force_login(buyer)
    html = _page(c, "?since=yesterday")
    assert "give a date like 2026-12-31" in html and len(_shown(html)) == 25, "the bad filter is named and left out"
    html = _page(c, "?since=2026-12-10&until=2026-12-01")
    assert "swap them" in html
    assert len(_shown(_page(c, "?state=cancelled&since=bad"))) == 10, "the filters that are fine still apply"
    assert "Select a valid choice" in _page(c, "?state=sold")


def test_the_api_filters_bids_by_day_placed_and_search(buyer, orders, client_for):
    api = client_for(buyer)
    got = api.get("/api/v1/bids/", {"q": "img4", "page_size": 100}).json()["results"]
    assert sorted(b["id"] for b in got) == sorted(b.pk for b in orders if "img4" in b.job_spec["image"])
    cutoff = (timezone.now() - timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    got = api.get("/api/v1/bids/", {"until": cutoff}).json()["results"]
    assert sorted(b["id"] for b in got) == sorted(b.pk for b in orders[10:15])
    r = api.get("/api/v1/bids/", {"since": "soon"})
    assert r.status_code == 400 and "since" in r.json()["error"]["fields"]


@pytest.mark.parametrize("path", ["/orders/?q=²", "/orders/?q=%23٣", "/bids/new/?offer=²", "/markets/H100-SXM-80GB/us-east/?min_gpus=²",
                                  "/offers/?min_gpus=²"])
def test_digits_that_are_not_ascii_are_not_ids(buyer, orders, path):
    # "²".isdigit() is true but int("²") raises: these were 500s
    c = Client()
    c.force_login(buyer)
    assert c.get(path).status_code in (200, 400), "a page, or a page saying what is wrong: never a 500"


def test_the_api_takes_a_search_of_unicode_digits_as_text(buyer, orders, client_for):
    r = client_for(buyer).get("/api/v1/bids/", {"q": "²"})
    assert r.status_code == 200 and r.json()["results"] == []

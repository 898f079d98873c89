"""market.bulk.rows_update: each row's columns set to its own values, as Django's bulk_update
sets them, in one UPDATE ... FROM (VALUES ...) per 2,000 rows on PostgreSQL (issue 39: a
round's bid updates spent most of their time building bulk_update's CASE in Python)."""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext

from market import bulk
from market.models import Bid, Offer
from market.states import BidState


def test_each_row_gets_its_own_values_and_no_other_row_changes(buyer, provider_user, make_bid, make_offer) -> None:
    bids = [make_bid(buyer, client_order_id=f"b{i}") for i in range(5)]
    untouched = make_bid(buyer, client_order_id="left-alone")
    before = Bid.objects.get(pk=untouched.pk).explanation
    odd = {"round": 7, "matched": False, "reasons": ['it\'s "quoted"', "naïve ünïcode; -- not SQL", "back\\slash"], "nearest": None}
    for i, b in enumerate(bids):
        b.state = BidState.MATCHED if i % 2 else BidState.OPEN
        b.explanation = {**odd, "i": i, "nested": {"list": [i, None, 1.5]}}
    offers = [make_offer(provider_user, count=8) for _ in range(2)]
    offers[0].gpus_free, offers[1].gpus_free = 3, 0
    with CaptureQueriesContext(connection) as queries:
        assert bulk.rows_update(bids, ["state", "explanation"]) == 5
        assert bulk.rows_update(offers, ["gpus_free"]) == 2
    updates = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    assert len(updates) == 2
    if connection.vendor == "postgresql":
        assert all("FROM (VALUES" in sql and "CASE" not in sql for sql in updates)
    for i, b in enumerate(bids):
        row = Bid.objects.get(pk=b.pk)
        assert row.state == (BidState.MATCHED if i % 2 else BidState.OPEN)
        assert row.explanation == {**odd, "i": i, "nested": {"list": [i, None, 1.5]}}
    assert Bid.objects.get(pk=untouched.pk).explanation == before
    assert sorted(Offer.objects.filter(pk__in=[o.pk for o in offers]).values_list("gpus_free", flat=True)) == [0, 3]


def test_nothing_to_write_sends_nothing_and_a_large_batch_is_split(buyer, make_bid, monkeypatch) -> None:
    with CaptureQueriesContext(connection) as queries:
        assert bulk.rows_update([], ["explanation"]) == 0
    assert not queries.captured_queries
    bids = [make_bid(buyer, client_order_id=f"s{i}") for i in range(5)]
    monkeypatch.setattr(bulk, "VALUES_BATCH", 2)
    monkeypatch.setattr(bulk, "BATCH", 2)
    for i, b in enumerate(bids):
        b.explanation = {"round": i}
    with CaptureQueriesContext(connection) as queries:
        assert bulk.rows_update(bids, ["explanation"]) == 5
    assert len([q for q in queries.captured_queries if q["sql"].startswith("UPDATE")]) == 3
    assert [Bid.objects.get(pk=b.pk).explanation for b in bids] == [{"round": i} for i in range(5)]

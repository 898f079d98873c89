"""The `rounds` snapshot every new subscriber gets first: built once per round and shared,
never from the rounds' stored books (megabytes each at 10k bids), never older than the
newest cleared round."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from market.models import AuctionRound
from market.states import RoundState
from market.streams import snapshots

pytestmark = pytest.mark.django_db

A_BIG_BOOK = {"bids": [{"id": i, "gpu_models": ["H100-SXM-80GB"], "max_price": 1_000_000 + i} for i in range(2000)]}


def clear_round(number: int, price: int, *, state: str = RoundState.CLEARED) -> AuctionRound:
    """A round row as round_clear leaves it: its whole book in inputs and result."""
    now = timezone.now()
    return AuctionRound.objects.create(
        number=number, slot=number, state=state, scheduled_for=now, cleared_at=now + timedelta(milliseconds=number),
        prices=[{"gpu_model": "H100-SXM-80GB", "region": "us-east", "price": price, "gpus": 4}],
        stats={"trades": number, "matched_gpus": 4 * number, "bids": 2000}, inputs=A_BIG_BOOK, result=A_BIG_BOOK,
    )


def test_rounds_snapshot_shows_the_last_ten_cleared_rounds_newest_first() -> None:
    for n in range(1, 13):
        clear_round(n, 2_000_000 + n)
    clear_round(13, 9, state=RoundState.FAILED)
    rounds = snapshots.rounds()["rounds"]
    assert [r["number"] for r in rounds] == list(range(12, 2, -1))
    assert rounds[0]["prices"][0]["price"] == 2_000_012 and (rounds[0]["trades"], rounds[0]["matched_gpus"], rounds[0]["bids"]) == (12, 48, 2000)


def test_rounds_snapshot_never_reads_the_rounds_stored_books() -> None:
    for n in range(1, 4):
        clear_round(n, 2_000_000)
    with CaptureQueriesContext(connection) as queries:
        snapshots.rounds()
    sql = " ".join(q["sql"] for q in queries.captured_queries)
    assert '"inputs"' not in sql and '"result"' not in sql, sql


def test_rounds_snapshot_is_built_once_then_shared_until_a_round_clears() -> None:
    for n in range(1, 4):
        clear_round(n, 2_000_000 + n)
    first = snapshots.rounds()
    with CaptureQueriesContext(connection) as queries:
        again = snapshots.rounds()
    assert again == first
    assert len(queries.captured_queries) == 1, "a later subscriber asks only which rounds are newest"
    assert '"prices"' not in queries.captured_queries[0]["sql"], "...and does not read them again"
    clear_round(4, 2_500_000)
    after: dict[str, Any] = snapshots.rounds()
    assert [r["number"] for r in after["rounds"]] == [4, 3, 2, 1]
    assert after["rounds"][0]["prices"][0]["price"] == 2_500_000


def test_best_ask_is_the_same_on_the_socket_and_in_rest_an_offer_with_no_free_gpus_is_not_an_ask(provider_user, make_offer, anon, settings) -> None:
    """The markets list took the cheapest open offer, booked full or not; the book the
    cheapest with a GPU free. docs/stream.md: an ask is an offer with a GPU free now."""
    from market.models import Offer
    from market.streams.snapshots import book

    settings.GRIDBID = {**settings.GRIDBID, "MARKETS_CACHE_SECONDS": 0}
    full = make_offer(provider_user, price=1_000_000, count=2)
    make_offer(provider_user, price=2_000_000, count=4)
    Offer.objects.filter(pk=full.pk).update(gpus_free=0)  # booked whole: still open, nothing to sell
    rows = anon.get("/api/v1/markets/").json()
    row = next(r for r in (rows["results"] if isinstance(rows, dict) else rows) if r["gpu_model"] == "H100-SXM-80GB" and r["region"] == "us-east")
    assert book("H100-SXM-80GB", "us-east")["best_ask"] == 2_000_000
    assert row["best_ask"] == 2_000_000 and row["gpus_free"] == 4


def test_the_orders_snapshot_holds_every_open_bid_and_the_last_days_others_bounded(buyer, make_bid, monkeypatch) -> None:
    """The newest 100 bids of any state left out an open bid once 100 newer ones existed."""
    from market.models import Bid

    oldest_open = make_bid(buyer)
    closed = [make_bid(buyer) for _ in range(6)]
    Bid.objects.filter(pk__in=[b.pk for b in closed]).update(state="cancelled", updated_at=timezone.now())
    Bid.objects.filter(pk=closed[0].pk).update(updated_at=timezone.now() - timedelta(days=2))  # older than a day: left out
    monkeypatch.setattr(snapshots, "RECENT_ORDERS_SHOWN", 3)
    got = snapshots.orders(buyer)
    assert got["open_truncated"] is False
    assert [o["id"] for o in got["orders"]][0] == oldest_open.pk
    assert [o["state"] for o in got["orders"]] == ["open", "cancelled", "cancelled", "cancelled"]
    assert closed[0].pk not in [o["id"] for o in got["orders"]]
    more_open = [make_bid(buyer) for _ in range(3)]
    monkeypatch.setattr(snapshots, "OPEN_ORDERS_SHOWN", 3)
    got = snapshots.orders(buyer)
    assert got["open_truncated"] is True
    assert [o["id"] for o in got["orders"] if o["state"] == "open"] == [b.pk for b in reversed(more_open)]


def test_an_order_and_a_job_link_the_bid_the_trade_and_the_job_and_the_public_tape_names_no_order(buyer, provider_user, make_offer, make_bid) -> None:
    from market.models import Job, Trade
    from market.rounds import round_clear

    make_offer(provider_user, price=2_000_000)
    bid = make_bid(buyer, gpus=2)
    round_clear()
    trade = Trade.objects.select_related("round", "job").get(bid=bid)
    job = Job.objects.get(trade=trade)
    public = snapshots.trade_public(trade)
    assert public["id"] == trade.pk and not {"bid", "job", "buyer"} & set(public)  # the public tape names no order
    assert {k: snapshots.job_private(job)[k] for k in ("id", "trade", "bid")} == {"id": job.pk, "trade": trade.pk, "bid": bid.pk}
    bid.refresh_from_db()
    order = snapshots.bid_private(bid)
    assert order["state"] == "matched" and order["trades"] == [{"trade": trade.pk, "job": job.pk}]
    assert snapshots.orders(buyer)["orders"][0]["trades"] == [{"trade": trade.pk, "job": job.pk}]


def test_many_books_are_read_in_the_same_few_queries_as_one_and_each_is_its_bucket_alone(provider_user, buyer, make_offer, make_bid, settings) -> None:
    """A round publishes the book of every bucket it traded in or priced; it read them
    bucket by bucket, and for a bucket without an open offer read the last 50 rounds' prices
    each time (issue 39). `books` reads any number in a fixed number of queries."""
    from market.streams.snapshots import books

    settings.GRIDBID = {**settings.GRIDBID, "MARKETS_CACHE_SECONDS": 0}
    make_offer(provider_user, price=2_000_000, count=4)
    make_offer(provider_user, price=2_000_000, count=2)
    make_offer(provider_user, price=2_100_000, count=8)
    make_offer(provider_user, model="A100-SXM-80GB", region="eu-west", price=1_500_000, count=1)
    make_bid(buyer, gpus=1, gpu_models=["L4-24GB"], max_price=900_000)  # a bucket bid for, with nothing on offer
    keys = [("H100-SXM-80GB", "us-east"), ("A100-SXM-80GB", "eu-west"), ("L4-24GB", "us-east")]
    with CaptureQueriesContext(connection) as two:
        books([keys[0], keys[2]])  # one bucket the markets list has, one it has not
    with CaptureQueriesContext(connection) as four:
        got = books([*keys, ("RTX-4090-24GB", "us-west")])
    assert len(four.captured_queries) == len(two.captured_queries), [q["sql"][:120] for q in four.captured_queries]
    h100, a100, l4 = (got[k] for k in keys)
    assert h100["asks"] == [[2_000_000, 6], [2_100_000, 8]] and h100["best_ask"] == 2_000_000 and h100["gpus_free"] == 14
    assert a100["asks"] == [[1_500_000, 1]] and a100["gpus_free"] == 1
    assert l4["asks"] == [] and l4["best_ask"] is None and l4["best_bid"] == 900_000
    assert got == {k: books([k])[k] for k in got}


def test_the_sales_totals_of_many_providers_are_each_ones_own_in_a_fixed_number_of_queries(provider_user, other_provider_user, buyer, make_offer, make_bid) -> None:
    """A round sends each winning provider its sales with its totals; they were read provider
    by provider (issue 39)."""
    from market.models import Trade
    from market.rounds import round_clear
    from market.selectors import providers_totals

    make_offer(provider_user, price=2_000_000, count=2)
    make_offer(other_provider_user, model="A100-SXM-80GB", price=1_000_000, count=4)
    make_bid(buyer, gpus=2, gpu_models=["H100-SXM-80GB"], duration_s=3600)
    make_bid(buyer, gpus=4, gpu_models=["A100-SXM-80GB"], duration_s=7200)
    make_bid(buyer, gpus=1, gpu_models=["A100-SXM-80GB"], duration_s=3600, max_price=500_000)  # below every ask: no trade
    round_clear()
    ids = [provider_user.provider.pk, other_provider_user.provider.pk]
    with CaptureQueriesContext(connection) as one:
        providers_totals(ids[:1])
    with CaptureQueriesContext(connection) as both:
        got = providers_totals(ids)
    assert len(both.captured_queries) == len(one.captured_queries)
    for pid in ids:
        trades = Trade.objects.filter(provider_id=pid)
        assert got[pid]["trades"] == trades.count() == 1
        assert got[pid]["sold"] == sum(t.amount for t in trades) > 0
        assert got[pid] == snapshots.provider_totals(pid)
    with pytest.raises(Exception, match="no provider"):
        providers_totals([*ids, 10**9])

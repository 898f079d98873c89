"""Whatever shows a trade's round shows its number, and never reads the round's stored book
(issue 39). A round row keeps the engine's whole input and result for replay: megabytes at
10k orders a side. Joined to each of a round's trades, the stream handler that publishes
the round read it once per trade: 1,492 trades of a 2,000-order round took 359 s to
publish in tests/bench/bench_round.py."""

from __future__ import annotations

from django.db import connection
from django.test.utils import CaptureQueriesContext

from market.events import RoundCleared
from market.models import AuctionRound, Trade
from market.rounds import round_clear
from market.streams import handlers, snapshots

BOOK_COLUMNS = ('"inputs"', '"result"')


def book_reads(queries: CaptureQueriesContext) -> list[str]:
    return [q["sql"] for q in queries.captured_queries if any(c in q["sql"] for c in BOOK_COLUMNS)]


def test_a_rounds_trades_are_shown_without_its_stored_book(anon, buyer, client_for, provider_user, make_offer, make_bid) -> None:
    make_offer(provider_user, count=8)
    for _ in range(3):
        make_bid(buyer, gpus=2)
    rnd = round_clear()
    assert rnd is not None and Trade.objects.filter(round=rnd).count() == 3
    AuctionRound.objects.filter(pk=rnd.pk).update(inputs={"bids": [{"id": i} for i in range(5000)]})  # as big as a real one's
    trade = Trade.objects.filter(round=rnd).first()
    assert trade is not None
    AuctionRound.objects.filter(pk=rnd.pk).update(result={**rnd.result, "padding": [{"id": i} for i in range(5000)]})
    with CaptureQueriesContext(connection) as queries:
        handlers.round_cleared(RoundCleared(round_id=rnd.pk, unmatched_bid_ids=()))
    # what the round left unmatched comes with the event: reading it back from the round's
    # result (megabytes: every unmatched bid's reasons) took 7 s of a 10k round's publish
    assert not book_reads(queries), book_reads(queries)
    make_bid(buyer, gpus=1)
    with CaptureQueriesContext(connection) as queries:
        again = round_clear(slot=rnd.number + 1)  # the next slot: this one is taken
    assert again is not None and again.state == "cleared"
    # the round writes its book, and never reads it back (it returned the row reloaded whole)
    assert not [q for q in book_reads(queries) if q.lstrip().upper().startswith("SELECT")], book_reads(queries)
    me = client_for(buyer, scopes=["read"])
    readers = {
        "trades snapshot": lambda: snapshots.trades(),
        "trade tape": lambda: anon.get(f"/api/v1/markets/trades/?from_id={trade.pk}"),
        "buyer's trades": lambda: me.get("/api/v1/trades/"),
        "market page": lambda: anon.get(f"/markets/{trade.gpu_model_id}/{trade.region_id}/"),
        "provider's sales": lambda: snapshots.sales_rows(trade.provider_id),
    }
    for name, read in readers.items():
        with CaptureQueriesContext(connection) as queries:
            got = read()
        assert getattr(got, "status_code", 200) == 200, (name, got)
        assert not book_reads(queries), (name, book_reads(queries))

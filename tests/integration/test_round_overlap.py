"""One round at a time per market, and a round that falls behind its clock says how far.

Issue 27 (item 8): with ~10.8k open bids a round took 10-45 s against ROUND_SECONDS=5, and
under `gridbid worker -c 2` the next beat tick, on the other process, claimed the next slot
and cleared beside it: two rounds `clearing` at once over one book.
"""

from __future__ import annotations

import re
import threading
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from market import engine, rounds
from market.models import AuctionRound, Trade
from market.rounds import round_clear
from market.states import RoundState

pytestmark = pytest.mark.django_db

DEADLINE_S = 60


@pytest.mark.django_db(transaction=True)
def test_a_second_worker_skips_its_slot_while_a_round_is_clearing(buyer, provider_user, make_offer, make_bid, monkeypatch):
    make_offer(provider_user, count=8)
    for _ in range(3):
        make_bid(buyer, gpus=2)
    in_engine, release = threading.Event(), threading.Event()
    clear = engine.clear_round
    first = threading.Lock()

    def held_clear(*args: Any, **kwargs: Any) -> engine.RoundResult:
        if first.acquire(blocking=False):  # the first worker stays in the engine until the test lets it go
            in_engine.set()
            assert release.wait(DEADLINE_S), "the test never released the first round"
        return clear(*args, **kwargs)

    monkeypatch.setattr(engine, "clear_round", held_clear)
    now = timezone.now()
    results: dict[str, Any] = {}

    def worker_a() -> None:
        try:
            results["a"] = round_clear(now=now, slot=5_001)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            results["a"] = exc
        finally:
            connection.close()

    a = threading.Thread(target=worker_a)
    a.start()
    try:
        assert in_engine.wait(DEADLINE_S), f"worker A never reached the engine; it returned {results.get('a')!r}"
        # the next beat tick, on the other worker, for the next slot
        results["b"] = round_clear(now=now + timedelta(seconds=5), slot=5_002)
        clearing = list(AuctionRound.objects.values_list("slot", "state"))
    finally:
        release.set()
        a.join(DEADLINE_S)
    assert not a.is_alive(), "worker A did not finish"
    assert results["b"] is None, f"a second round ran while round A was clearing: {results['b']!r}"
    assert clearing == [(5_001, RoundState.CLEARING)], clearing
    rnd = results["a"]
    assert isinstance(rnd, AuctionRound) and rnd.state == RoundState.CLEARED, rnd
    assert Trade.objects.count() == 3 and AuctionRound.objects.count() == 1


@pytest.mark.postgres
def test_the_round_lock_of_a_worker_that_died_is_gone_with_its_connection(buyer, provider_user, make_offer, make_bid):
    make_offer(provider_user, count=8)
    make_bid(buyer, gpus=2)
    worker = psycopg.connect(**connection.get_connection_params(), autocommit=True)  # a worker mid-round, in another process
    try:
        assert worker.execute("SELECT pg_try_advisory_lock(%s)", [rounds.ROUND_LOCK_KEY]).fetchone() == (True,)
        assert round_clear() is None
        assert not AuctionRound.objects.exists()
    finally:
        worker.close()  # as a killed worker's connection closes
    rnd = round_clear()
    assert rnd is not None and rnd.state == RoundState.CLEARED, rnd


def test_a_round_on_time_skips_no_slot(buyer, provider_user, make_offer, make_bid, settings):
    settings.GRIDBID = {**settings.GRIDBID, "ROUND_SECONDS": 60}
    make_offer(provider_user, count=8)
    make_bid(buyer, gpus=2)
    rnd = round_clear()
    assert rnd.stats["skipped_slots"] == 0


def test_a_round_behind_its_clock_records_the_slots_it_skipped_and_the_operator_page_shows_them(
    buyer, provider_user, operator, make_offer, make_bid, settings, client
):
    settings.GRIDBID = {**settings.GRIDBID, "ROUND_SECONDS": 60}
    make_offer(provider_user, count=8)
    make_bid(buyer, gpus=2)
    # its clock says 9 slots and a second ago: it finishes 9 whole slots behind (the round itself takes under a minute)
    late = round_clear(now=timezone.now() - timedelta(seconds=9 * 60 + 1))
    assert late.state == RoundState.CLEARED, late.error
    assert late.stats["skipped_slots"] == 9
    make_bid(buyer, gpus=2)
    on_time = round_clear()
    assert on_time.stats["skipped_slots"] == 0
    client.force_login(operator)
    page = client.get("/operator/").content.decode()
    rows = dict(re.findall(r'<tr data-round="(\d+)">(.*?)</tr>', page))
    assert re.search(r'data-field="skipped_slots"[^>]*>9<', rows[str(late.number)]), rows[str(late.number)]
    assert re.search(r'data-field="skipped_slots"[^>]*>0<', rows[str(on_time.number)]), rows[str(on_time.number)]

"""`/metrics`: Prometheus text for operators and a scraper holding METRICS_TOKEN, refused to
anyone else; its gauges are the database's counts; the operator page shows readiness."""

from __future__ import annotations

import dataclasses
from datetime import timedelta
from typing import Any

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

pytestmark = pytest.mark.django_db

SCRAPE_TOKEN = "scrape-" + "x" * 24


@pytest.fixture(autouse=True)
def fresh_readiness() -> None:
    from gridbid.health import readiness_cache_clear

    readiness_cache_clear()


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a Prometheus text page, keyed by (name, sorted labels)."""
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def scrape(client: Any, **headers: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from gridbid.health import readiness_cache_clear

    readiness_cache_clear()
    response = client.get("/metrics", **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return samples(response.content.decode())


def test_metrics_are_refused_to_anonymous_callers_with_a_401_that_says_how() -> None:
    response = Client().get("/metrics")
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="gridbid-metrics"'
    error = response.json()["error"]
    assert error["code"] == "not_authenticated"
    assert "METRICS_TOKEN" in error["message"] and "operator" in error["message"]


def test_metrics_are_refused_to_a_buyer_by_session_and_by_token(buyer: Any, client_for: Any) -> None:
    session = Client()
    session.force_login(buyer)
    assert session.get("/metrics").status_code == 403
    token = client_for(buyer).raw_token
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {token}")
    assert response.status_code == 403
    assert response.json()["error"] == {"code": "permission_denied", "message": "The metrics are for operators only; this account is not one.", "fields": {}}


def test_a_wrong_bearer_token_is_a_401_not_a_500(settings: Any) -> None:
    settings.CONFIG = dataclasses.replace(settings.CONFIG, metrics_token=SCRAPE_TOKEN)
    for wrong in ("scrape-" + "y" * 24, "gb_nothing_here", "x" * 500):
        response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {wrong}")
        assert response.status_code == 401, wrong
        assert response.json()["error"]["code"] == "not_authenticated"


def test_metrics_are_served_to_an_operator_and_to_the_scrape_token(operator: Any, client_for: Any, settings: Any) -> None:
    session = Client()
    session.force_login(operator)
    assert ("gridbid_ready", (("check", "database"),)) in scrape(session)
    assert scrape(Client(), HTTP_AUTHORIZATION=f"Bearer {client_for(operator).raw_token}")
    settings.CONFIG = dataclasses.replace(settings.CONFIG, metrics_token=SCRAPE_TOKEN)
    page = scrape(Client(), HTTP_AUTHORIZATION=f"Bearer {SCRAPE_TOKEN}")
    assert page[("gridbid_ready", (("check", "database"),))] == 1.0
    # what Prometheus itself asks for: OpenMetrics first, the text format as a fallback
    accept = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    response = Client().get("/metrics", HTTP_AUTHORIZATION=f"Bearer {SCRAPE_TOKEN}", HTTP_ACCEPT=accept)
    assert response["Content-Type"].startswith("application/openmetrics-text")
    names = {f.name for f in openmetrics_families(response.content.decode())}
    assert {"gridbid_ready", "gridbid_orders_open", "gridbid_http_request_duration_seconds"} <= names


def test_order_gauges_equal_the_books_counts(operator: Any, buyer: Any, provider_user: Any, make_bid: Any, make_offer: Any) -> None:
    from market import services
    from market.models import Bid, Offer

    session = Client()
    session.force_login(operator)
    bids = [make_bid(buyer) for _ in range(3)]
    make_offer(provider_user)
    make_offer(provider_user, count=4)
    page = scrape(session)
    assert page[("gridbid_orders_open", (("side", "bid"),))] == Bid.objects.filter(state="open").count() == 3
    assert page[("gridbid_orders_open", (("side", "offer"),))] == Offer.objects.filter(state="open").count() == 2
    services.bid_cancel(user=buyer, bid=bids[0])
    page = scrape(session)
    assert page[("gridbid_orders_open", (("side", "bid"),))] == 2


def test_outbox_and_round_gauges_come_from_the_database(operator: Any) -> None:
    from ledger.models import ChainTx
    from market.models import AuctionRound

    session = Client()
    session.force_login(operator)
    for n, state in enumerate(("sent", "signed", "confirmed")):
        ChainTx.objects.create(purpose="record", key=f"record:{n}", chain_id=31337, sender="0x" + "ab" * 20, nonce=n,
                               tx_hash=f"0x{n:064x}", raw="0x00", state=state, signed_at=timezone.now() - timedelta(seconds=120 * (n + 1)),
                               error="nonce too low" if n == 0 else "")
    AuctionRound.objects.create(number=7, scheduled_for=timezone.now(), state="cleared",
                                stats={"clear_ms": 1500.0, "stage_ms": {"validate": 250.0, "market": 1250.0}})
    page = scrape(session)
    assert page[("gridbid_outbox_depth", ())] == 2
    assert 239 <= page[("gridbid_outbox_oldest_age_seconds", ())] <= 260
    assert page[("gridbid_chain_tx_errors", (("kind", "refused_open"),))] == 1
    assert page[("gridbid_round_stage_seconds", (("stage", "validate"),))] == 0.25
    assert page[("gridbid_round_stage_seconds", (("stage", "market"),))] == 1.25
    assert page[("gridbid_round_clear_seconds", ())] == 1.5
    assert page[("gridbid_round_last_number", ())] == 7
    assert page[("gridbid_round_last_age_seconds", ())] < 60
    # the embedded worker's queues (kombu's in-memory transport) are counted too
    from gridbid.celery import Queue

    assert {labels for name, labels in page if name == "gridbid_celery_queue_length"} == {(("queue", q.value),) for q in Queue}


def test_request_latency_is_labelled_by_url_pattern_not_by_path(operator: Any, buyer: Any, client_for: Any, make_bid: Any) -> None:
    bid = make_bid(buyer)
    assert client_for(buyer).get(f"/api/v1/bids/{bid.pk}/").status_code == 200
    session = Client()
    session.force_login(operator)
    page = scrape(session)
    routes = {dict(labels).get("route") for name, labels in page if name == "gridbid_http_request_duration_seconds_count"}
    assert any(r and "bids" in r and "<pk>" in r for r in routes), routes
    assert not any(r and f"/{bid.pk}/" in r for r in routes), routes


def test_the_operator_page_shows_readiness_and_the_key_figures(operator: Any, buyer: Any, make_bid: Any) -> None:
    from market.models import AuctionRound

    session = Client()
    session.force_login(operator)
    html = session.get("/operator/").content.decode()
    assert 'data-ready="true"' in html
    assert 'data-check="database" data-status="ok"' in html
    assert 'data-field="outbox_depth">0<' in html
    make_bid(buyer)
    rnd = AuctionRound.objects.create(number=1, scheduled_for=timezone.now(), state="cleared")
    AuctionRound.objects.filter(pk=rnd.pk).update(started_at=timezone.now() - timedelta(minutes=10))
    from gridbid.health import readiness_cache_clear

    readiness_cache_clear()
    html = session.get("/operator/").content.decode()
    assert 'data-ready="false"' in html
    assert 'data-check="rounds" data-status="failing"' in html
    assert "started 600 s ago" in html
    assert 'data-field="last_round_age_s">600 s ago<' in html


@pytest.mark.django_db(transaction=True)
@pytest.mark.asyncio
async def test_websocket_connections_and_their_queue_are_counted() -> None:
    from channels.testing import WebsocketCommunicator

    from gridbid.asgi import application
    from gridbid.metrics import MarketCollector

    def stream_figures() -> dict[str, float]:
        return {f.name: f.samples[0].value for f in MarketCollector()._streams()}

    before = stream_figures()["gridbid_websocket_connections"]
    comm = WebsocketCommunicator(application, "/ws/v1/stream")
    connected, _ = await comm.connect(timeout=5)
    assert connected
    assert stream_figures()["gridbid_websocket_connections"] == before + 1
    assert stream_figures()["gridbid_websocket_send_queue_depth"] >= 0
    await comm.disconnect()
    assert stream_figures()["gridbid_websocket_connections"] == before


def test_celery_queue_lengths_are_read_from_redis(operator: Any, settings: Any, tmp_path: Any) -> None:
    """Tasks sent through a real Redis broker (one of this test's own) and never consumed."""
    from celery import Celery

    from tests.integration.helpers import own_redis

    with own_redis(tmp_path) as (_, url):
        settings.CONFIG = dataclasses.replace(settings.CONFIG, redis_url=url)
        # not the current app: a shared task sent by a later test on this worker would go to
        # this broker, gone by then (seen as connection refused in webhook tests after it)
        sender = Celery("gridbid-metrics-test", broker=url, set_as_current=False)
        for _ in range(3):
            sender.send_task("ledger.tasks.chain_txs_track", queue="chain")
        sender.send_task("ledger.tasks.chain_txs_track", queue="chain", priority=6)  # kept in another list
        sender.send_task("market.tasks.bids_expire", queue="default")
        session = Client()
        session.force_login(operator)
        page = scrape(session)
        assert page[("gridbid_celery_queue_length", (("queue", "chain"),))] == 4
        assert page[("gridbid_celery_queue_length", (("queue", "default"),))] == 1
        assert page[("gridbid_celery_queue_length", (("queue", "rounds"),))] == 0
        assert page[("gridbid_ready", (("check", "redis"),))] == 1.0

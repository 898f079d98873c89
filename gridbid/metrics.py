"""Prometheus metrics for `/metrics`.

Two kinds, so that several ASGI servers and Celery workers never disagree:

* Shared state (orders in the book, rounds, the outbox, the listener, the chain, the
  Celery queues) is read from the database, Redis and the node at scrape time by
  `MarketCollector`, through the same `readiness()` the `/readyz` check uses. Every
  server answers the same figures; scrape any one of them.
* Per-process figures (request latency by route, WebSocket connections and their send
  queues) live in this process's memory. Each ASGI server is its own scrape target;
  sum over the `instance` label in PromQL to see the whole fleet.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gridbid.celery import Queue
from gridbid.health import readiness
from ledger.models import ChainTx, ChainTxState
from market.models import AuctionRound
from market.states import RoundState
from market.streams.consumers import open_streams

REGISTRY = CollectorRegistry()

REQUEST_SECONDS = Histogram(
    "gridbid_http_request_duration_seconds",
    "Time to answer an HTTP request, by URL pattern (this process).",
    ["method", "route", "status"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
    registry=REGISTRY,
)

def _route(request: HttpRequest) -> str:
    """The URL pattern that answered (`api/v1/bids/<int:pk>/`), never the raw path: ids
    in paths would make a time series per object."""
    match = getattr(request, "resolver_match", None)
    if match is None:
        return "(unmatched)"
    # the API router's patterns are regular expressions: drop their anchors
    return "/" + (match.route or "").replace("^", "").replace("$", "")


class RequestMetricsMiddleware:
    """Times every request by route. First in the chain, so it sees the whole answer time."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        start = time.perf_counter()
        response = self.get_response(request)
        REQUEST_SECONDS.labels(request.method or "", _route(request), str(response.status_code)).observe(time.perf_counter() - start)
        return response


def _gauge(name: str, doc: str, value: float | None, labels: dict[str, str] | None = None) -> GaugeMetricFamily | None:
    if value is None:
        return None
    family = GaugeMetricFamily(name, doc, labels=list(labels) if labels else None)
    if labels:
        family.add_metric(list(labels.values()), value)
    else:
        family.add_metric([], value)
    return family


# kombu's Redis transport keeps a queue's messages in a list named after it, one list per
# priority step above 0 ("<queue>\x06\x16<step>")
_KOMBU_PRIORITY_STEPS = (0, 3, 6, 9)


def _redis_keys(queue: str) -> list[str]:
    return [queue if step == 0 else f"{queue}\x06\x16{step}" for step in _KOMBU_PRIORITY_STEPS]


def celery_queue_lengths() -> dict[str, int]:
    """Messages waiting in each Celery queue: Redis LLEN with REDIS_URL, else the
    in-process (kombu memory) queues of the embedded worker."""
    names = [q.value for q in Queue]
    if settings.CONFIG.redis_url:
        import redis

        client = redis.Redis.from_url(settings.CONFIG.redis_url, socket_connect_timeout=2, socket_timeout=2)
        try:
            pipe = client.pipeline()
            for name in names:
                for key in _redis_keys(name):
                    pipe.llen(key)
            counts = iter(int(n) for n in pipe.execute())
            return {name: sum(next(counts) for _ in _redis_keys(name)) for name in names}
        finally:
            client.close()
    from kombu.transport.memory import Channel

    return {name: (Channel.queues[name].qsize() if name in Channel.queues else 0) for name in names}


class MarketCollector(Collector):
    """The shared gauges, read at scrape time (see the module docstring)."""

    def collect(self) -> Iterator[Metric]:
        report = readiness()
        ready = GaugeMetricFamily("gridbid_ready", "1 when a part passes its readiness check, 0 when it fails (skipped parts are absent).", labels=["check"])
        for name, part in report.parts.items():
            if part.status != "skipped":
                ready.add_metric([name], 1.0 if part.status == "ok" else 0.0)
        yield ready
        if report.open_bids is not None and report.open_offers is not None:
            book = GaugeMetricFamily("gridbid_orders_open", "Orders open in the book.", labels=["side"])
            book.add_metric(["bid"], report.open_bids)
            book.add_metric(["offer"], report.open_offers)
            yield book
        figures = (
            _gauge("gridbid_round_last_age_seconds", "Seconds since the last auction round started.", report.last_round_age_s),
            _gauge("gridbid_outbox_depth", "Transactions signed but not final (signed, sent, mined).", report.outbox_depth),
            _gauge("gridbid_outbox_oldest_age_seconds", "Age of the oldest open transaction (0 when none).",
                   report.outbox_oldest_age_s if report.outbox_oldest_age_s is not None else (0.0 if report.outbox_depth is not None else None)),
            _gauge("gridbid_listener_lag_blocks", "Blocks between the chain's head and what the event listener has read.", report.listener_lag_blocks),
            _gauge("gridbid_chain_head_block", "The chain's head block.", report.chain_head),
        )
        yield from (f for f in figures if f is not None)
        if "chain" in report.parts and report.parts["chain"].status != "skipped":
            up = _gauge("gridbid_chain_up", "1 when the chain node answers.", 1.0 if report.parts["chain"].status == "ok" else 0.0)
            if up is not None:
                yield up
        if report.parts.get("database") is not None and report.parts["database"].status == "ok":
            yield from self._from_database()
        yield from self._celery()
        yield from self._streams()

    def _from_database(self) -> Iterator[Metric]:
        last = AuctionRound.objects.filter(state=RoundState.CLEARED).order_by("-number").values("number", "stats").first()
        if last is not None:
            stages = GaugeMetricFamily("gridbid_round_stage_seconds", "Seconds each engine stage took in the last cleared round.", labels=["stage"])
            for stage, ms in (last["stats"] or {}).get("stage_ms", {}).items():
                if isinstance(ms, int | float) and not isinstance(ms, bool) and 0 <= ms < float("inf"):
                    stages.add_metric([str(stage)], ms / 1000)
            yield stages
            clear_ms = (last["stats"] or {}).get("clear_ms")
            if isinstance(clear_ms, int | float) and not isinstance(clear_ms, bool):
                yield GaugeMetricFamily("gridbid_round_clear_seconds", "Seconds the last cleared round took to clear.", value=clear_ms / 1000)
            yield GaugeMetricFamily("gridbid_round_last_number", "Number of the last cleared round (rate() of it: rounds per second).", value=last["number"])
        # chain errors: what the node refused. A broadcast refused leaves its message on the open
        # transaction; a reverted or replaced-nonce one ends failed. Read from the outbox, so
        # every worker's errors count, not only this process's.
        errors = GaugeMetricFamily("gridbid_chain_tx_errors", "Transactions with a chain error: open ones the node refused, and failed ones.", labels=["kind"])
        errors.add_metric(["refused_open"], ChainTx.objects.filter(state__in=(ChainTxState.SIGNED, ChainTxState.SENT)).exclude(error="").count())
        errors.add_metric(["failed"], ChainTx.objects.filter(state=ChainTxState.FAILED).count())
        yield errors

    def _celery(self) -> Iterator[Metric]:
        try:
            lengths = celery_queue_lengths()
        except Exception:  # noqa: BLE001 - Redis down: /readyz and gridbid_ready{check="redis"} say so
            return
        family = GaugeMetricFamily("gridbid_celery_queue_length", "Tasks waiting in each Celery queue.", labels=["queue"])
        for name, n in lengths.items():
            family.add_metric([name], n)
        yield family

    def _streams(self) -> Iterator[Metric]:
        consumers = list(open_streams)
        yield GaugeMetricFamily("gridbid_websocket_connections", "Open WebSocket stream connections (this process).", value=len(consumers))
        depth = sum(len(c.outbox) for c in consumers if getattr(c, "outbox", None) is not None)
        yield GaugeMetricFamily("gridbid_websocket_send_queue_depth", "Updates queued for WebSocket clients, not yet sent (this process).", value=depth)


REGISTRY.register(MarketCollector())

"""What an operator (or a load balancer) needs to know: is each part of GridBid working?

`readiness()` checks the database, Redis, the chain, the auction rounds, the event
listener and the outbox, and says of each "ok", "failing" (with why) or "skipped" (not
configured, or it depends on a part that is failing). It reads the figures `/metrics`
and the operator page show too, so all three agree.

Every check is bounded in time: the network probes (Redis, the chain) run on threads
with short socket timeouts and are waited for at most `deadline_s`; the database
queries are a handful of indexed counts under the connection's `connect_timeout`.
No probe retries: a readiness check answers now, it does not wait for a part to recover.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from django.conf import settings
from django.db import connection
from django.utils import timezone

from ledger.chain import ChainClient
from ledger.context import deployment_current
from ledger.models import ChainTx, ListenerCursor
from ledger.outbox import OPEN_STATES, nonce_gaps, outbox_senders
from market import grid_carbon
from market.models import AuctionRound, Bid, Offer
from market.states import BidState, OfferState

# "degraded": working on a fallback (the carbon feed's constants): said, not a reason to take the server out
Status = Literal["ok", "degraded", "failing", "skipped"]

PROBE_TIMEOUT_S = 2.0  # socket timeout of one Redis or chain probe
DEADLINE_S = 4.0  # the whole readiness answer, network probes included
PART_ORDER = ("database", "redis", "chain", "rounds", "listener", "outbox", "carbon")
ROUND_STALE_MIN_S = 60.0  # a round older than max(this, ROUND_STALE_ROUNDS x ROUND_SECONDS) is stale...
ROUND_STALE_ROUNDS = 3  # ...when there are open bids to clear
LISTENER_LAG_MAX_BLOCKS = 200  # the listener reads every 3 s; this far behind the head it has stopped
OUTBOX_STUCK_S = 900.0  # an open transaction signed this long ago is stuck (fees are raised after 90 s, 8 times)
CACHE_S = 1.0  # answers are reused this long, so a busy prober cannot turn into a load on the node

_URL_CREDENTIALS = re.compile(r"(\w+://)[^/@\s]*@")


def redact(text: str) -> str:
    """An error message without the user:password of any URL in it."""
    return _URL_CREDENTIALS.sub(r"\1***@", text)


def reason(exc: BaseException) -> str:
    """One short line for an exception: what an operator reads next to a failing part."""
    text = redact(str(exc).strip().splitlines()[0] if str(exc).strip() else "")
    name = type(exc).__name__
    return f"{name}: {text[:200]}" if text else name


@dataclass(frozen=True)
class Part:
    status: Status
    detail: str
    ms: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"status": self.status, "detail": self.detail, "ms": round(self.ms, 1)}


@dataclass
class Readiness:
    """The answer of `readiness()`: each part's status, and the figures behind them."""

    parts: dict[str, Part] = field(default_factory=dict)
    chain_head: int | None = None
    listener_lag_blocks: int | None = None
    open_bids: int | None = None
    open_offers: int | None = None
    last_round_age_s: float | None = None
    outbox_depth: int | None = None
    outbox_oldest_age_s: float | None = None

    @property
    def ready(self) -> bool:
        return all(p.status != "failing" for p in self.parts.values())

    @property
    def failing(self) -> dict[str, str]:
        return {name: p.detail for name, p in self.parts.items() if p.status == "failing"}

    def as_dict(self) -> dict[str, Any]:
        return {
            "status": "ready" if self.ready else "not_ready",
            "checks": {name: p.as_dict() for name, p in self.parts.items()},
        }


# --- probes: one service each, no retries, short timeouts (also used by the CLI at start-up) ---
def probe_database(*, timeout_s: float = PROBE_TIMEOUT_S, pooled: bool = True) -> None:
    """Raises when the database does not answer a query within about `timeout_s`.

    On PostgreSQL a request waits up to DATABASE_POOL_TIMEOUT (30 s) for a pooled
    connection while the pool retries a database that is gone, so the probe asks the pool
    with its own short deadline; `pooled=False` (start-up, before any pool exists) opens
    one plain connection instead, so a refused start says one line, not the pool's retries."""
    if connection.vendor == "postgresql":
        if not pooled:
            import psycopg

            params = connection.get_connection_params()
            params["connect_timeout"] = max(1, round(timeout_s))
            psycopg.connect(**params).close()
            return
        pool = getattr(connection, "pool", None)
        # a thread that already holds its connection (the operator page, /metrics) asks on it:
        # a second one from the pool could wait out the probe on a pool of one
        if pool is not None and connection.connection is None:
            conn = pool.getconn(timeout=timeout_s)
            try:
                conn.execute("SELECT 1").fetchone()
            finally:
                pool.putconn(conn)
            return
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        cursor.fetchone()


def probe_redis(url: str, *, timeout_s: float = PROBE_TIMEOUT_S) -> None:
    """Raises when Redis at `url` does not answer PING."""
    import redis

    client = redis.Redis.from_url(url, socket_connect_timeout=timeout_s, socket_timeout=timeout_s)
    try:
        client.ping()
    finally:
        client.close()


@dataclass(frozen=True)
class ChainProbe:
    head: int
    mined_nonces: dict[str, int]  # sender -> transactions of it mined (its next nonce on chain)


def probe_chain(url: str, *, senders: tuple[str, ...] = (), timeout_s: float = PROBE_TIMEOUT_S) -> ChainProbe:
    """The chain's head block (and the mined nonce of each sender): raises when the node does not answer."""
    client = ChainClient(url, retries=0, request_timeout_s=timeout_s)
    # web3's HTTP provider retries a timed-out call 5 times with backoff by itself: a hung
    # node would hold this probe (and a thread) for 13 s instead of timeout_s
    client.w3.provider.exception_retry_configuration = None  # type: ignore[attr-defined]
    head = client.block_number()
    nonces = {s: int(client.rpc("eth_getTransactionCount", [s, "latest"]), 16) for s in senders}
    return ChainProbe(head=head, mined_nonces=nonces)


def chain_url() -> str | None:
    """CHAIN_RPC_URL, else the dev chain's URL recorded with the current deployment."""
    if settings.CONFIG.chain_rpc_url:
        return settings.CONFIG.chain_rpc_url

    deployment = deployment_current()
    return deployment.rpc_url if deployment is not None and deployment.rpc_url else None


# --- readiness -------------------------------------------------------------------------
def _timed(fn: Callable[[], Any]) -> tuple[Any, BaseException | None, float]:
    start = time.perf_counter()
    try:
        return fn(), None, (time.perf_counter() - start) * 1000
    except Exception as exc:  # noqa: BLE001 - any failure of a part is that part's answer
        return None, exc, (time.perf_counter() - start) * 1000


def _age_s(when: datetime | None, now: datetime) -> float | None:
    return None if when is None else max((now - when).total_seconds(), 0.0)


# one daemon pool per process: a probe stuck past its socket timeout cannot pile up threads
_pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="gridbid-health")
_cache: tuple[float, Readiness] | None = None
_cache_lock = threading.Lock()
_run_lock = threading.Lock()
MAX_SENDERS = 10  # nonce gaps are looked for among this many senders (ledger.outbox.outbox_senders)


def _cached() -> Readiness | None:
    with _cache_lock:
        if _cache is not None and time.monotonic() - _cache[0] < CACHE_S:
            return _cache[1]
    return None


def readiness() -> Readiness:
    """Check every part; at most about DEADLINE_S seconds."""
    global _cache
    deadline_s = DEADLINE_S
    if (hit := _cached()) is not None:
        return hit
    # one check at a time per process: callers arriving meanwhile wait for it and share
    # its answer, so a burst of probes against a hung node cannot pile up threads
    if not _run_lock.acquire(timeout=deadline_s):
        with _cache_lock:
            if _cache is not None:
                return _cache[1]
        _run_lock.acquire()
    try:
        if (hit := _cached()) is not None:
            return hit
        result = _readiness(deadline_s)
        # one order of parts in every answer, whatever path the checks took
        result.parts = {name: result.parts[name] for name in PART_ORDER if name in result.parts}
        with _cache_lock:
            _cache = (time.monotonic(), result)
        return result
    finally:
        _run_lock.release()


def readiness_cache_clear() -> None:
    global _cache
    with _cache_lock:
        _cache = None


def _readiness(deadline_s: float) -> Readiness:
    start = time.monotonic()
    out = Readiness()
    cfg = settings.CONFIG

    redis_future: Future[Any] | None = None
    if cfg.redis_url:
        # bound now: the closure runs on another thread, and `url` below becomes the chain's
        redis_url = cfg.redis_url
        redis_future = _pool.submit(_timed, lambda: probe_redis(redis_url))

    _, db_error, ms = _timed(probe_database)
    if db_error is not None:
        out.parts["database"] = Part("failing", f"the database does not answer: {reason(db_error)}", ms)
        for name in ("rounds", "listener", "outbox", "chain", "carbon"):
            out.parts[name] = Part("skipped", "needs the database")
        _redis_part(out, redis_future, start, deadline_s)
        return out
    out.parts["database"] = Part("ok", "answers queries", ms)

    # what the chain probe must look up: the senders of open transactions, and of the latest
    # confirmed ones (a block the chain lost takes those with it: a nonce gap)
    open_txs = list(ChainTx.objects.filter(state__in=OPEN_STATES).values("sender", "nonce", "state", "signed_at", "created_at"))
    deployment = deployment_current()
    chain_id = deployment.chain_id if deployment is not None else None
    url = chain_url()
    chain_future: Future[Any] | None = None
    if url:
        senders = tuple(outbox_senders(chain_id=chain_id, limit=MAX_SENDERS))
        chain_future = _pool.submit(_timed, lambda: probe_chain(url, senders=senders))

    _rounds_part(out)
    _carbon_part(out)
    probe = _chain_part(out, chain_future, start, deadline_s)
    _listener_part(out, probe)
    _outbox_part(out, open_txs, probe, chain_id)
    _redis_part(out, redis_future, start, deadline_s)
    return out


def _wait(future: Future[Any], start: float, deadline_s: float) -> tuple[Any, BaseException | None, float]:
    try:
        return future.result(timeout=max(deadline_s - (time.monotonic() - start), 0.05))
    except FutureTimeout:
        return None, TimeoutError(f"no answer within {deadline_s:g} s"), deadline_s * 1000


def _redis_part(out: Readiness, future: Future[Any] | None, start: float, deadline_s: float) -> None:
    if future is None:
        out.parts["redis"] = Part("skipped", "REDIS_URL is unset: embedded mode, Celery and the channel layer run in-process")
        return
    _, error, ms = _wait(future, start, deadline_s)
    if error is not None:
        out.parts["redis"] = Part("failing", f"REDIS_URL does not answer PING: {reason(error)}", ms)
    else:
        out.parts["redis"] = Part("ok", "answers PING", ms)


def _chain_part(out: Readiness, future: Future[Any] | None, start: float, deadline_s: float) -> ChainProbe | None:
    if future is None:
        out.parts["chain"] = Part("skipped", "no chain: CHAIN_RPC_URL is unset and no dev chain is deployed (settlement is off)")
        return None
    probe, error, ms = _wait(future, start, deadline_s)
    if error is not None:
        source = "CHAIN_RPC_URL" if settings.CONFIG.chain_rpc_url else "the dev chain"
        out.parts["chain"] = Part("failing", f"{source} does not answer eth_blockNumber: {reason(error)}", ms)
        return None
    out.chain_head = probe.head
    out.parts["chain"] = Part("ok", f"head block {probe.head}", ms)
    return probe


def _carbon_part(out: Readiness) -> None:
    """Where each region's carbon intensity comes from this hour (market.grid_carbon)."""
    readings, error, ms = _timed(lambda: grid_carbon.carbon_ahead(timezone.now()))
    if error is not None:
        out.parts["carbon"] = Part("degraded", f"the carbon feed could not be read ({reason(error)}); rounds use each region's constant", ms)
        return
    fine, detail = grid_carbon.carbon_summary(readings)
    out.parts["carbon"] = Part("ok" if fine else "degraded", detail, ms)


def _rounds_part(out: Readiness) -> None:
    now = timezone.now()
    out.open_bids = Bid.objects.filter(state=BidState.OPEN).count()
    out.open_offers = Offer.objects.filter(state=OfferState.OPEN).count()
    last = AuctionRound.objects.order_by("-started_at").values("number", "started_at").first()
    out.last_round_age_s = _age_s(last["started_at"], now) if last else None
    round_s = float(settings.GRIDBID["ROUND_SECONDS"])
    stale_s = max(ROUND_STALE_MIN_S, ROUND_STALE_ROUNDS * round_s)
    if out.open_bids == 0:
        out.parts["rounds"] = Part("ok", "no open bids to clear")
    elif last is None:
        # a fresh market: the first round comes within ROUND_SECONDS of the first bid, unless nothing runs rounds
        oldest = Bid.objects.filter(state=BidState.OPEN).order_by("created_at").values_list("created_at", flat=True).first()
        waited = _age_s(oldest, now) or 0.0
        if waited > stale_s:
            out.parts["rounds"] = Part("failing", f"{out.open_bids} open bids and no round has ever run ({waited:.0f} s since the oldest); is the worker and beat running?")
        else:
            out.parts["rounds"] = Part("ok", "waiting for the first round")
    elif out.last_round_age_s is not None and out.last_round_age_s > stale_s:
        out.parts["rounds"] = Part("failing", f"the last round (#{last['number']}) started {out.last_round_age_s:.0f} s ago, over {stale_s:g} s "
                                              f"(ROUND_SECONDS={round_s:g}), with {out.open_bids} open bids; is the worker and beat running?")
    else:
        out.parts["rounds"] = Part("ok", f"last round #{last['number']} started {out.last_round_age_s:.0f} s ago")


def _listener_part(out: Readiness, probe: ChainProbe | None) -> None:
    if probe is None:
        out.parts["listener"] = Part("skipped", "needs the chain")
        return
    deployment = deployment_current()
    if deployment is None:
        out.parts["listener"] = Part("skipped", "no deployment to listen to")
        return
    cursor = ListenerCursor.objects.filter(deployment=deployment).values("scanned_to").first()
    # before its first read the listener starts at the deployment's block
    scanned = cursor["scanned_to"] if cursor else int(deployment.deployed_block) - 1
    out.listener_lag_blocks = max(probe.head - scanned, 0)
    if out.listener_lag_blocks > LISTENER_LAG_MAX_BLOCKS:
        out.parts["listener"] = Part("failing", f"{out.listener_lag_blocks} blocks behind the head (over {LISTENER_LAG_MAX_BLOCKS}); "
                                                "is the worker running chain_events_sync?")
    else:
        out.parts["listener"] = Part("ok", f"{out.listener_lag_blocks} blocks behind the head")


def _outbox_part(out: Readiness, open_txs: list[dict[str, Any]], probe: ChainProbe | None, chain_id: int | None) -> None:
    now = timezone.now()
    out.outbox_depth = len(open_txs)
    ages = [_age_s(row["signed_at"] or row["created_at"], now) or 0.0 for row in open_txs]
    out.outbox_oldest_age_s = max(ages) if ages else None
    problems = []
    if out.outbox_oldest_age_s is not None and out.outbox_oldest_age_s > OUTBOX_STUCK_S:
        stuck = sum(1 for a in ages if a > OUTBOX_STUCK_S)
        problems.append(f"{stuck} transaction(s) unconfirmed for over {OUTBOX_STUCK_S:g} s (oldest {out.outbox_oldest_age_s:.0f} s)")
    if probe is not None:
        problems.extend(nonce_gaps(mined=probe.mined_nonces, chain_id=chain_id))
    if problems:
        out.parts["outbox"] = Part("failing", "; ".join(problems))
    elif not open_txs:
        out.parts["outbox"] = Part("ok", "empty")
    else:
        out.parts["outbox"] = Part("ok", f"{len(open_txs)} open, oldest {out.outbox_oldest_age_s:.0f} s")


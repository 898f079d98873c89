"""Reads for the market: what each user may see, and the market buckets."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.db.models import Count, Min, Q, QuerySet, Sum

from ledger.balances import earnings_of
from ledger.journal import reconciliation_status
from ledger.models import JournalEntry, RecordBatch, SettleBatch
from ledger.selectors import trades_money
from market.models import AuctionRound, AuditEvent, Bid, Booking, Job, Offer, Trade, User
from market.states import BidState, BookingState, OfferState, RoundState, TradeState
from providers.models import Machine, MachineState, Provider
from providers.selectors import machine_telemetry_history, machines_telemetry


def offers_open() -> QuerySet[Offer]:
    return Offer.objects.filter(state=OfferState.OPEN).select_related("machine", "machine__region", "machine__provider", "gpu_model")


# `operator`: the caller sees every user's rows. It is the credential's reach, not the account's
# role: an operator's browser session or a token with `operate` (market.api.permissions.is_operator);
# an operator's `read` token sees its own account's rows like anyone's.
def offers_visible(user: User, *, operator: bool = False) -> QuerySet[Offer]:
    """Open offers are public market data; a provider also sees its own paused and withdrawn ones."""
    qs = Offer.objects.select_related("machine", "machine__region", "gpu_model")
    if operator:
        return qs
    visible = Q(state=OfferState.OPEN)
    if user.is_authenticated and hasattr(user, "provider"):
        visible |= Q(machine__provider=user.provider)
    return qs.filter(visible)


def offers_owned(user: User, *, operator: bool = False) -> QuerySet[Offer]:
    qs = Offer.objects.select_related("machine", "machine__region", "gpu_model")
    return qs if operator else qs.filter(machine__provider__user=user)


def machines_visible(user: User, *, operator: bool = False) -> QuerySet[Machine]:
    qs = Machine.objects.select_related("region", "provider").prefetch_related("gpus")
    return qs if operator else qs.filter(provider__user=user)


def bids_visible(user: User, *, operator: bool = False) -> QuerySet[Bid]:
    qs = Bid.objects.select_related("buyer", "location_region")
    return qs if operator else qs.filter(buyer=user)


def bids_search(qs: QuerySet[Bid], text: str) -> QuerySet[Bid]:
    """Bids a buyer's search finds: by id ("123" or "#123"), or a part of the client order id,
    a GPU model or the job's image, in any case."""
    text = text.strip()
    if not text:
        return qs
    found = Q(client_order_id__icontains=text) | Q(gpu_models__icontains=text) | Q(job_spec__image__icontains=text)
    number = text.removeprefix("#")
    if re.fullmatch(r"[0-9]{1,18}", number):
        found |= Q(pk=int(number))
    return qs.filter(found)


def trades_visible(user: User, *, operator: bool = False) -> QuerySet[Trade]:
    qs = Trade.objects.with_round().select_related("bid", "offer", "provider")
    return qs if operator else qs.filter(Q(buyer=user) | Q(provider__user=user))


def jobs_visible(user: User, *, operator: bool = False) -> QuerySet[Job]:
    qs = Job.objects.select_related("trade", "trade__offer__machine", "trade__bid")
    return qs if operator else qs.filter(Q(trade__buyer=user) | Q(trade__provider__user=user))


@dataclass(frozen=True)
class Bucket:
    gpu_model: str
    region: str
    offers: int
    gpus_free: int
    best_ask: int | None
    best_bid: int | None
    open_bids: int
    last_price: int | None
    previous_price: int | None

    @property
    def key(self) -> str:
        return f"{self.gpu_model}.{self.region}"

    @property
    def change_pct(self) -> float | None:
        if self.last_price is None or not self.previous_price:
            return None
        return round(100 * (self.last_price - self.previous_price) / self.previous_price, 2)


def _last_prices(limit_rounds: int = 50) -> dict[tuple[str, str], list[int]]:
    """Recent clearing prices per bucket, newest first, from the last rounds that cleared."""
    out: dict[tuple[str, str], list[int]] = {}
    rounds = AuctionRound.objects.filter(state=RoundState.CLEARED).exclude(prices=[]).order_by("-number").values_list("prices", flat=True)[:limit_rounds]
    for prices in rounds:
        for p in prices:
            if p.get("price") is not None:
                out.setdefault((p["gpu_model"], p["region"]), []).append(p["price"])
    return out


MARKETS_CACHE_KEY = "market:buckets"
MARKETS_LOCK_KEY = "market:buckets:computing"
MARKETS_KEEP_S = 60  # how long a computed list may stand in while its successor is computed
# past MARKETS_CACHE_SECONDS, how much older a list may be before a request computes it: the
# beat's task (every MARKETS_CACHE_SECONDS) takes this long to compute and store the next one,
# and beat ticks are not exact; without it, one request in each interval still computed
MARKETS_SLACK_S = 0.5


def markets_refresh() -> list[Bucket]:
    """Compute the markets list and store it for every reader: the beat's task every
    MARKETS_CACHE_SECONDS and each round once it commits (it moved the book) call this, in
    a worker, so that a request finds the list fresh and never walks the book itself. At
    10k bids the walk takes 0.3-1 s, and the request that did it each second, and the
    others its thread slowed, were the markets list's p99 (issue 39)."""
    began = time.time()
    buckets = _market_buckets_compute()
    markets_store(began, buckets)
    return buckets


def markets_store(computed_at: float, buckets: list[Bucket]) -> None:
    """Keep this list unless one computed later is already kept: the beat's computation and
    a round's may overlap, and the one that began later saw the later book."""
    cached: tuple[float, list[Bucket]] | None = cache.get(MARKETS_CACHE_KEY)
    if cached is None or cached[0] <= computed_at:
        cache.set(MARKETS_CACHE_KEY, (computed_at, buckets), MARKETS_KEEP_S)


def market_buckets(*, gpu_model: str | None = None, region: str | None = None) -> list[Bucket]:
    """Every GPU model x region with open offers, with its open bids: at most
    GRIDBID["MARKETS_CACHE_SECONDS"] + MARKETS_SLACK_S old. Every page view, API call and
    book snapshot asks for it, so it is computed once per that interval and shared through
    the cache (Redis in production: shared by all servers), by the beat's task and after
    each round (``markets_refresh``). When it is due all the same (no beat running), one
    request recomputes it and the others answer from the list it replaces: under ASGI each
    request has its own thread, and 16 requests recomputing at once made every second's
    first requests slow. A filter picks from the whole list, so each bucket's figures do
    not depend on the filter and odd filter values never fill the cache."""
    ttl = settings.GRIDBID.get("MARKETS_CACHE_SECONDS", 0)
    if not ttl:
        buckets = _market_buckets_compute()
    else:
        cached: tuple[float, list[Bucket]] | None = cache.get(MARKETS_CACHE_KEY)
        fresh = cached is not None and time.time() - cached[0] < ttl + MARKETS_SLACK_S
        # due: the first request to take the lock recomputes; the others answer from the old list
        locked = not fresh and cached is not None and cache.add(MARKETS_LOCK_KEY, 1, timeout=MARKETS_KEEP_S)
        if cached is not None and not locked:
            buckets = cached[1]
        else:  # none yet (every request computes), or due and this request holds the lock
            computed_at = time.time()
            try:
                buckets = _market_buckets_compute()
                markets_store(computed_at, buckets)
            finally:
                if locked:
                    cache.delete(MARKETS_LOCK_KEY)
    return [b for b in buckets if (not gpu_model or b.gpu_model == gpu_model) and (not region or b.region == region)]


def market_bucket(gpu_model: str, region: str) -> Bucket:
    """One market's figures, whether or not it has an open offer now: a market whose offers
    are all sold or paused still has its best bid and its last clearing price (the markets
    list, which lists markets with open offers, may have shown that price a moment before)."""
    return market_buckets_of([(gpu_model, region)])[(gpu_model, region)]


def market_buckets_of(keys: list[tuple[str, str]]) -> dict[tuple[str, str], Bucket]:
    """``market_bucket`` for many markets at once: the markets list once, and for those it
    does not list (no open offer), their open bids in one query and the last prices once
    (a round publishing its books read them market by market: issue 39)."""
    listed = {(b.gpu_model, b.region): b for b in market_buckets()}
    out = {k: listed[k] for k in keys if k in listed}
    missing = sorted({k for k in keys if k not in listed})
    if missing:
        bids = _open_bids_per_bucket(missing)
        history = _last_prices()
        for key in missing:
            n, best = bids.get(key, (0, None))
            out[key] = _bucket(key, offers=0, free=0, ask=None, bid=best, bids=n, history=history)
    return out


def _market_buckets_compute() -> list[Bucket]:
    ask_rows = offers_open().order_by().values("gpu_model_id", "machine__region_id").annotate(
        # an ask is an offer with a GPU free now, as on the book channel (docs/stream.md)
        n=Count("id"), free=Sum("gpus_free"), best=Min("price", filter=Q(gpus_free__gt=0))
    )
    buckets: dict[tuple[str, str], dict[str, int | None]] = {}
    for row in ask_rows:
        buckets[(row["gpu_model_id"], row["machine__region_id"])] = {"offers": row["n"], "free": row["free"] or 0, "ask": row["best"], "bid": None, "bids": 0}
    for key, (n, best) in _open_bids_per_bucket(list(buckets)).items():
        buckets[key]["bids"], buckets[key]["bid"] = n, best
    history = _last_prices()
    out = []
    for key, b in sorted(buckets.items()):
        out.append(_bucket(key, offers=int(b["offers"] or 0), free=int(b["free"] or 0), ask=b["ask"], bid=b["bid"], bids=int(b["bids"] or 0), history=history))
    return out


def _bucket(key: tuple[str, str], *, offers: int, free: int, ask: int | None, bid: int | None, bids: int,
            history: dict[tuple[str, str], list[int]]) -> Bucket:
    """One market's figures, with its last two clearing prices from ``_last_prices``."""
    prices = history.get(key, [])
    return Bucket(key[0], key[1], offers, free, ask, bid, bids, prices[0] if prices else None, prices[1] if len(prices) > 1 else None)


# A bid names GPU models and regions by list (an empty list: any); it counts once in each
# bucket it could trade in, and once more for each repeat of a model in its list. The
# database explodes the lists (jsonb_array_elements_text on PostgreSQL, json_each on
# SQLite) and aggregates in four parts, so that "any" never multiplies rows: bids with
# both lists, with models only, with regions only, with neither. Python adds the parts
# up per bucket. Decoding the lists in Python instead took 0.2-0.5 s for 10k bids.
_EXPLODE = {
    "postgresql": "CROSS JOIN LATERAL jsonb_array_elements_text(b.{col}) WITH ORDINALITY AS {alias}(value, key)",
    "sqlite": "CROSS JOIN json_each(b.{col}) AS {alias}",
}
_EMPTY = {"postgresql": "jsonb_array_length(b.{col}) = 0", "sqlite": "json_array_length(b.{col}) = 0"}
_MODEL_MENTION = "CAST(b.id AS text) || '/' || CAST(m.key AS text)"  # one per bid and place in its model list


_MENTIONS = {
    "postgresql": "EXISTS (SELECT 1 FROM jsonb_array_elements_text(b.{col}) AS x(value) WHERE x.value = %s)",
    "sqlite": "EXISTS (SELECT 1 FROM json_each(b.{col}) AS x WHERE x.value = %s)",
}


BID_DEPTH_BAND = 100_000  # 0.10 USDC/GPU-h


def bucket_bid_depth(gpu_model: str, region: str) -> list[dict[str, int]]:
    """Bid depth for one market: the GPUs open bids that could trade here (naming this
    model and region, or any) ask for, by max price in bands of 0.10 USDC/GPU-h (each band
    by its floor), highest first, with the cumulative GPUs wanted at or above it. Bids are
    sealed: no identities, and no bid's exact limit (the public best bid aside)."""
    vendor = connection.vendor
    if vendor not in _MENTIONS:
        raise NotImplementedError(f"bid depth needs PostgreSQL or SQLite, not {vendor}")
    mention = _MENTIONS[vendor]
    no_models, no_regions = _EMPTY[vendor].format(col="gpu_models"), _EMPTY[vendor].format(col="allowed_regions")
    band = f"(b.max_price / {BID_DEPTH_BAND}) * {BID_DEPTH_BAND}"  # integer division in both databases
    sql = (f"SELECT {band} AS level, SUM(b.gpus) FROM {Bid._meta.db_table} b WHERE b.state = %s "
           f"AND ({no_models} OR {mention.format(col='gpu_models')}) AND ({no_regions} OR {mention.format(col='allowed_regions')}) "
           "GROUP BY level ORDER BY level DESC")
    with connection.cursor() as cur:
        cur.execute(sql, [BidState.OPEN.value, gpu_model, region])
        return depth_rows([(int(price), int(gpus)) for price, gpus in cur.fetchall()])


def depth_rows(levels: list[tuple[int, int]]) -> list[dict[str, int]]:
    """Depth rows from (price, GPUs) levels in the order shown: each with the GPUs at or
    before it (cumulative) and its bar's width against the largest level (pct)."""
    peak = max((g for _, g in levels), default=0)
    out, total = [], 0
    for price, gpus in levels:
        total += gpus
        out.append({"price": price, "gpus": gpus, "cumulative": total, "pct": int(100 * gpus / peak) if peak else 0})
    return out


def _open_bids_per_bucket(keys: list[tuple[str, str]]) -> dict[tuple[str, str], tuple[int, int | None]]:
    """(open bids, best bid price) for each (gpu_model, region) in `keys`."""
    vendor = connection.vendor
    if vendor not in _EXPLODE:
        raise NotImplementedError(f"market buckets need PostgreSQL or SQLite, not {vendor}")
    models, regions = _EXPLODE[vendor].format(col="gpu_models", alias="m"), _EXPLODE[vendor].format(col="allowed_regions", alias="r")
    no_models, no_regions = _EMPTY[vendor].format(col="gpu_models"), _EMPTY[vendor].format(col="allowed_regions")
    table = Bid._meta.db_table

    def rows(select: str, join: str, where: str = "", group: str = "") -> list[tuple[Any, ...]]:
        sql = f"SELECT {select} FROM {table} b {join} WHERE b.state = %s" + (f" AND {where}" if where else "") + (f" GROUP BY {group}" if group else "")
        with connection.cursor() as cur:
            cur.execute(sql, [BidState.OPEN.value])
            return cur.fetchall()

    both = {(m, r): (n, best) for m, r, n, best in rows(f"m.value, r.value, COUNT(DISTINCT {_MODEL_MENTION}), MAX(b.max_price)", f"{models} {regions}", group="m.value, r.value")}
    per_model = {m: (n, best) for m, n, best in rows("m.value, COUNT(*), MAX(b.max_price)", models, no_regions, group="m.value")}
    per_region = {r: (n, best) for r, n, best in rows("r.value, COUNT(DISTINCT b.id), MAX(b.max_price)", regions, no_models, group="r.value")}
    anything = rows("COUNT(*), MAX(b.max_price)", "", f"{no_models} AND {no_regions}")[0]
    out = {}
    for model, region in keys:
        parts = [p for p in (both.get((model, region)), per_model.get(model), per_region.get(region), anything) if p and p[0]]
        out[(model, region)] = (sum(int(n) for n, _ in parts), max((int(best) for _, best in parts), default=None))
    return out


def bucket_price_history(gpu_model: str, region: str, limit: int = 100) -> list[tuple[float, int]]:
    """(unix time the round cleared, clearing price) for one bucket, oldest first: over the
    last ``limit`` rounds with any price."""
    return bucket_price_histories(limit).get((gpu_model, region), [])


def latest_priced_round() -> int | None:
    """The number of the newest cleared round that set any price: what the markets list's
    price trends (``bucket_price_histories``) last changed with."""
    return (AuctionRound.objects.filter(state=RoundState.CLEARED, cleared_at__isnull=False).exclude(prices=[])
            .order_by("-number").values_list("number", flat=True).first())


def bucket_price_histories(limit: int = 100) -> dict[tuple[str, str], list[tuple[float, int]]]:
    """Per (model, region), (unix time cleared, clearing price) over the last ``limit``
    rounds with any price, oldest first: one read for the markets list's sparklines."""
    out: dict[tuple[str, str], list[tuple[float, int]]] = {}
    rows = (AuctionRound.objects.filter(state=RoundState.CLEARED, cleared_at__isnull=False).exclude(prices=[])
            .order_by("-number").values_list("cleared_at", "prices")[:limit])
    for cleared_at, prices in reversed(list(rows)):
        for p in prices:
            if p.get("price") is not None:
                out.setdefault((p["gpu_model"], p["region"]), []).append((round(cleared_at.timestamp(), 3), p["price"]))
    return out


def offer_stats() -> dict[str, int]:
    agg = offers_open().aggregate(n=Count("id"), gpus=Sum("gpus_free"), providers=Count("machine__provider", distinct=True))
    return {"offers": agg["n"] or 0, "gpus_free": agg["gpus"] or 0, "providers": agg["providers"] or 0}


# --- dashboards: the provider's own machines and sales, the operator's overview --------------
# Plain dicts, so the page and the stream (market/streams/snapshots.py) show the same figures.

def provider_machines(provider_id: int, *, machine_ids: list[int] | None = None, history: bool = True) -> list[dict[str, Any]]:
    """Each machine with its booked GPUs (from its offers) and its latest telemetry."""
    return machines_rows(Machine.objects.filter(provider_id=provider_id), machine_ids=machine_ids, history=history).get(provider_id, [])


def machines_rows(machines_qs: QuerySet[Machine], *, machine_ids: list[int] | None = None, history: bool = True) -> dict[int, list[dict[str, Any]]]:
    """``provider_machines`` for every provider of ``machines_qs`` at once, by provider id: a
    round's write shows the machines of every provider it sold for in three queries and one
    cache read, not three and two per provider (issue 39). ``history``: the utilisation
    history too (a live update leaves it out)."""
    qs = machines_qs.select_related("region").annotate(gpu_count=Count("gpus")).order_by("name", "id")
    if machine_ids is not None:
        qs = qs.filter(pk__in=machine_ids)
    machines = list(qs)
    if not machines:
        return {}
    offered_by = dict(Offer.objects.filter(machine__in=machines).exclude(state=OfferState.WITHDRAWN).values_list("machine_id").annotate(n=Sum("gpus")))
    # booked: what held bookings take, on any offer of the machine (a withdrawn offer's jobs still run)
    busy_by = dict(Booking.objects.filter(offer__machine__in=machines, state=BookingState.HELD).values_list("offer__machine_id").annotate(n=Sum("gpus")))
    telemetry_of = machines_telemetry([m.pk for m in machines])
    rows: dict[int, list[dict[str, Any]]] = {}
    for m in machines:
        offered, busy = offered_by.get(m.pk, 0), busy_by.get(m.pk, 0)
        gpus = (telemetry_of.get(m.pk) or {}).get("gpus") or []
        row = {
            "id": m.pk, "name": m.name, "region": m.region_id, "region_name": m.region.name, "state": m.state,
            "last_heartbeat": m.last_heartbeat, "reliability": m.reliability, "gpus": m.gpu_count,
            "offered": offered, "busy": busy, "booked_pct": int(100 * busy / m.gpu_count) if m.gpu_count else 0,
            "gpu_util": round(sum(g["utilisation"] for g in gpus) / len(gpus), 1) if gpus else None,
            "telemetry": gpus,
        }
        if history:
            row["history"] = machine_telemetry_history(m.pk)
        rows.setdefault(m.provider_id, []).append(row)
    return rows


def provider_sales(provider_id: int, *, trade_ids: list[int] | None = None, limit: int = 50) -> list[dict[str, Any]]:
    qs = Trade.objects.with_round().filter(provider_id=provider_id).select_related("job").defer("job__checkpoint").order_by("-id")
    if trade_ids is not None:
        qs = qs.filter(pk__in=trade_ids)
    return _sales(list(qs[:limit]))


def sales_by_provider(trade_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """``provider_sales`` of these trades, by provider id, in two queries (issue 39)."""
    return sales_of_trades(list(Trade.objects.with_round().filter(pk__in=trade_ids).select_related("job").defer("job__checkpoint")))


def sales_of_trades(trades: list[Trade]) -> dict[int, list[dict[str, Any]]]:
    """``sales_by_provider`` of trades already loaded with their round (``with_round``) and
    job: a round's publish has them at hand, and loading its 7,855 trades again took 3 s of
    a 10k round's publish (issue 39). Newest first, as the sales list shows them."""
    out: dict[int, list[dict[str, Any]]] = {}
    rows = sorted(trades, key=lambda t: -t.pk)
    for t, row in zip(rows, _sales(rows), strict=True):
        out.setdefault(t.provider_id, []).append(row)
    return out


def _sales(rows: list[Trade]) -> list[dict[str, Any]]:
    # what the chain paid for each (confirmed settlement legs), beside the lock it sold
    paid = dict(JournalEntry.objects.filter(kind="pay", trade_id__in=[t.pk for t in rows]).values_list("trade_id").annotate(n=Sum("amount")))
    out = []
    for t in rows:
        job = getattr(t, "job", None)
        out.append({
            "id": t.pk, "round": t.round.number if t.round else None, "gpu_model": t.gpu_model_id, "region": t.region_id, "price": t.price,
            "gpus": t.gpus, "amount": t.amount, "paid": paid.get(t.pk), "state": t.state, "created_at": t.created_at,
            "job": {"id": job.pk, "state": job.state, "progress": job.progress} if job else None,
        })
    return out


def provider_totals(provider_id: int) -> dict[str, int]:
    """What the provider sold (trades, their full locks) beside its money, which comes only
    from confirmed chain events (`ledger.balances.earnings_of`): paid, held in disputes,
    free to withdraw, stake."""
    return providers_totals([provider_id])[provider_id]


def providers_totals(provider_ids: list[int]) -> dict[int, dict[str, int]]:
    """``provider_totals`` of many providers: their trades summed in one grouped query and
    their rows read at once (a round's sales went provider by provider: issue 39); the money
    is each one's ``earnings_of``, which reads nothing for a provider with no chain address."""
    sums = {row["provider_id"]: row for row in Trade.objects.filter(provider_id__in=provider_ids).order_by().values("provider_id").annotate(
        sold=Sum("amount"),
        pending=Sum("amount", filter=Q(state__in=[TradeState.PENDING, TradeState.RECORDED])),
        trades=Count("id"),
    )}
    out: dict[int, dict[str, int]] = {}
    for provider in Provider.objects.filter(pk__in=provider_ids):
        row = sums.get(provider.pk, {})
        money = earnings_of(provider=provider, series_limit=0)
        out[provider.pk] = {**{k: row.get(k) or 0 for k in ("sold", "pending", "trades")},
                            **{k: money[k] for k in ("settled", "paid", "held", "free", "withdrawn", "stake")}}
    missing = set(provider_ids) - set(out)
    if missing:
        raise Provider.DoesNotExist(f"no provider {sorted(missing)[0]}")
    return out


def provider_lent(provider_id: int) -> dict[str, Any]:
    """What the provider's lent (reclaimable) GPUs did while it did not need them: its lent
    offers, the spot trades they sold, the GPU-hours its agents' receipts count, and what the
    chain paid for them (the journal: ``ledger.selectors.trades_money``)."""
    trades = list(Trade.objects.filter(provider_id=provider_id, offer__reclaimable=True).values_list("id", flat=True))
    gpu_s = Job.objects.filter(trade_id__in=trades).aggregate(n=Sum("gpu_seconds"))["n"] or 0
    money = trades_money(trades)
    return {
        "offers": Offer.objects.filter(machine__provider_id=provider_id, reclaimable=True).exclude(state=OfferState.WITHDRAWN).count(),
        "trades": len(trades), "gpu_hours": round(gpu_s / 3600, 3), "paid": sum(m.paid for m in money.values()),
        "reclaims": Job.objects.filter(trade_id__in=trades, checkpoint__reclaimed=True).count(),
    }


def provider_earnings_series(provider_id: int, limit: int = 500) -> list[tuple[float, int]]:
    """(unix time, cumulative paid less held) after each confirmed chain event that moved the
    provider's earnings, oldest first (`ledger.balances.earnings_of`)."""
    return list(earnings_of(provider=Provider.objects.get(pk=provider_id), series_limit=limit)["series"])


def operator_overview() -> dict[str, Any]:
    """Rounds, the settlement queue (trades and chain batches by state), jobs, machines offline."""
    def by_state(qs: QuerySet[Any]) -> dict[str, int]:
        return dict(qs.order_by().values_list("state").annotate(n=Count("id")).values_list("state", "n"))

    rounds = [
        {"number": r.number, "state": r.state, "error": r.error, "cleared_at": r.cleared_at, "bids": r.stats.get("bids"),
         "trades": r.stats.get("trades"), "clear_ms": r.stats.get("clear_ms"), "skipped_slots": r.stats.get("skipped_slots"),
         "gap": r.stats.get("gap"), "method": r.stats.get("method", "")}
        for r in AuctionRound.objects.order_by("-number").only("number", "state", "error", "cleared_at", "stats")[:20]
    ]
    offline = [
        {"id": m.pk, "provider": m.provider.display_name, "name": m.name, "region": m.region_id, "last_heartbeat": m.last_heartbeat, "reliability": m.reliability}
        for m in Machine.objects.filter(state=MachineState.OFFLINE).select_related("provider").order_by("last_heartbeat", "id")[:50]
    ]

    disputes = [
        {"trade": t.pk, "buyer": t.buyer.username, "provider": t.provider.display_name, "gpus": t.gpus,
         "model": t.gpu_model_id, "amount": t.amount}
        for t in Trade.objects.filter(state=TradeState.DISPUTED).select_related("buyer", "provider").order_by("id")[:50]
    ]
    return {
        "disputes": disputes,
        "reconciliation": reconciliation_status(),
        "rounds": rounds,
        "trade_states": by_state(Trade.objects.all()),
        "job_states": by_state(Job.objects.all()),
        "record_batches": by_state(RecordBatch.objects.all()),
        "settle_batches": by_state(SettleBatch.objects.all()),
        "offline": offline,
        "offline_count": Machine.objects.filter(state=MachineState.OFFLINE).count(),
    }


def audit_events_own(user: User) -> QuerySet[AuditEvent]:
    """What a user did, and the failed sign-ins tried on their account."""
    return AuditEvent.objects.filter(Q(actor_id=user.pk) | Q(object_type="user", object_id=str(user.pk), action="auth.login_failed"))


def audit_events_visible(user: User, *, operator: bool = False) -> QuerySet[AuditEvent]:
    """Operators read every record; everyone else their own."""
    return AuditEvent.objects.all() if operator else audit_events_own(user)

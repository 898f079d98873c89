"""The snapshot a subscriber receives first, and the update payloads, per channel."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta
from typing import Any

from django.core.cache import cache
from django.db.models import Q, Sum
from django.utils import timezone

from ledger.balances import escrow_of
from ledger.journal import account_balances
from market import selectors
from market.jobs import job_log_tail
from market.models import AuctionRound, Bid, Job, Trade, User
from market.states import BidState, RoundState
from providers.models import Machine, Provider

DEPTH_LEVELS = 20


def book(gpu_model: str, region: str) -> dict[str, Any]:
    """Best ask and bid, and ask depth by price level, for one bucket."""
    return books([(gpu_model, region)])[(gpu_model, region)]


def books(keys: list[tuple[str, str]]) -> dict[tuple[str, str], dict[str, Any]]:
    """``book`` for many buckets in two reads whatever their number: the ask depth of all of
    them in one grouped query, and their figures (``selectors.market_buckets_of``). A round
    publishes the book of every bucket it traded in or priced, and read them bucket by bucket
    (issue 39)."""
    wanted = sorted(set(keys))
    if not wanted:
        return {}
    where = Q()
    for model, region in wanted:
        where |= Q(gpu_model_id=model, machine__region_id=region)
    rows = (selectors.offers_open().filter(where, gpus_free__gt=0).order_by().values("gpu_model_id", "machine__region_id", "price")
            .annotate(gpus=Sum("gpus_free")).order_by("gpu_model_id", "machine__region_id", "price"))
    levels: dict[tuple[str, str], list[tuple[int, int]]] = {k: [] for k in wanted}
    for row in rows:
        shown = levels[(row["gpu_model_id"], row["machine__region_id"])]
        if len(shown) < DEPTH_LEVELS:
            shown.append((row["price"], row["gpus"]))
    figures = selectors.market_buckets_of(wanted)
    return {
        (model, region): {
            "gpu_model": model,
            "region": region,
            "best_ask": levels[(model, region)][0][0] if levels[(model, region)] else None,
            "best_bid": figures[(model, region)].best_bid,
            "last_price": figures[(model, region)].last_price,
            "gpus_free": sum(g for _, g in levels[(model, region)]),
            "asks": [[price, g] for price, g in levels[(model, region)]],
        }
        for model, region in wanted
    }


def round_summary(rnd: AuctionRound) -> dict[str, Any]:
    return {
        "number": rnd.number,
        "cleared_at": rnd.cleared_at.isoformat() if rnd.cleared_at else None,
        "prices": rnd.prices,
        "trades": rnd.stats.get("trades", 0),
        "matched_gpus": rnd.stats.get("matched_gpus", 0),
        "bids": rnd.stats.get("bids", 0),
    }


ROUNDS_SHOWN = 10
SUMMARY_FIELDS = ("number", "cleared_at", "prices", "stats")


def rounds() -> dict[str, Any]:
    """The last ten cleared rounds, newest first. Every subscriber gets the same one, so it
    is built once and shared through the cache until another round clears: its key names
    the rounds it shows (number and clearing time, so a reused number is a new key), and a
    later subscriber costs one indexed query. It reads only the columns it shows: a round's
    inputs and result hold its whole book, megabytes at 10k bids, and decoding ten of them
    took ~1 s per subscriber."""
    cleared = AuctionRound.objects.filter(state=RoundState.CLEARED).order_by("-number")
    shown = list(cleared.values_list("number", "cleared_at")[:ROUNDS_SHOWN])
    key = "stream:rounds:" + hashlib.sha256(repr(shown).encode()).hexdigest()[:32]
    data: dict[str, Any] | None = cache.get(key)
    if data is None:
        # the rounds named in the key, not "the newest ten" again: one that clears meanwhile
        # belongs to the next key
        recent = cleared.filter(number__in=[number for number, _ in shown]).only(*SUMMARY_FIELDS)
        data = {"rounds": [round_summary(r) for r in recent]}
        cache.set(key, data, timeout=3600)
    return data


def trade_public(t: Trade) -> dict[str, Any]:
    """A trade as public market data (the ``trades`` channel, GET /api/v1/markets/trades/):
    no buyer, no bid, no job. Bid ids are sequential: on a public tape they would tell
    everyone how many orders the market takes. The buyer's own ``orders`` channel links
    each bid to its trades and their jobs, and ``jobs`` each job to its trade and bid."""
    return {"id": t.pk, "round": t.round.number if t.round else None, "gpu_model": t.gpu_model_id, "region": t.region_id, "price": t.price,
            "gpus": t.gpus, "duration_s": t.duration_s}


def trades() -> dict[str, Any]:
    return {"trades": [trade_public(t) for t in Trade.objects.with_round().order_by("-id")[:50]]}


def trade_links(bid_ids: list[int]) -> dict[int, list[dict[str, int | None]]]:
    """Each bid's trades and their jobs, oldest first, in one query: {bid: [{trade, job}]}."""
    out: dict[int, list[dict[str, int | None]]] = {}
    rows = Trade.objects.filter(bid_id__in=bid_ids).order_by("id").values_list("bid_id", "id", "job__id")
    for bid_id, trade_id, job_id in rows:
        out.setdefault(bid_id, []).append({"trade": trade_id, "job": job_id})
    return out


def bid_private(b: Bid, links: dict[int, list[dict[str, int | None]]] | None = None) -> dict[str, Any]:
    """A bid for its buyer's ``orders`` channel, with the trades it made and their jobs
    (``links``: trade_links of a batch of bids; read for this one alone when not given)."""
    if links is None:
        links = trade_links([b.pk])
    return {"id": b.pk, "client_order_id": b.client_order_id, "state": b.state, "gpus": b.gpus, "gpu_models": b.gpu_models, "max_price": b.max_price, "explanation": b.explanation,
            "expires_at": _iso(b.expires_at), "trades": links.get(b.pk, [])}


OPEN_ORDERS_SHOWN = 1000  # the orders snapshot's bound on open bids (newest first)
RECENT_ORDERS_SHOWN = 50  # ... and on the others (matched, cancelled, expired) ...
RECENT_ORDERS_S = 24 * 3600  # ... changed within this long


def orders(user: User) -> dict[str, Any]:
    """Every open bid of the account (the newest OPEN_ORDERS_SHOWN; ``open_truncated`` says
    whether there are more: GET /api/v1/bids/?state=open pages through them), then its
    RECENT_ORDERS_SHOWN most recently changed others of the last day. The newest 100 of
    any state, as before, left out an open bid once 100 newer ones existed."""
    open_rows = list(Bid.objects.filter(buyer=user, state=BidState.OPEN).order_by("-id")[:OPEN_ORDERS_SHOWN + 1])
    since = timezone.now() - timedelta(seconds=RECENT_ORDERS_S)
    recent = list(Bid.objects.filter(buyer=user, updated_at__gte=since).exclude(state=BidState.OPEN).order_by("-updated_at", "-id")[:RECENT_ORDERS_SHOWN])
    shown = open_rows[:OPEN_ORDERS_SHOWN] + recent
    links = trade_links([b.pk for b in shown])
    return {"orders": [bid_private(b, links) for b in shown], "open_truncated": len(open_rows) > OPEN_ORDERS_SHOWN}


def job_private(j: Job, *, log: bool = False) -> dict[str, Any]:
    """A job for its buyer's ``jobs`` channel; an update (``log``) carries the end of its
    output too (at most 8 KiB: what its agent last reported, kept after it ends)."""
    out = {"id": j.pk, "trade": j.trade_id, "bid": j.trade.bid_id, "state": j.state, "progress": j.progress, "gpu_seconds": j.gpu_seconds,
           "trade_state": j.trade.state}
    if log:
        out["log_tail"] = job_log_tail(j)
    return out


def jobs(user: User) -> dict[str, Any]:
    return {"jobs": [job_private(j) for j in selectors.jobs_visible(user).filter(trade__buyer=user)[:100]]}


def _iso(when: datetime | None) -> str | None:
    return when.isoformat() if when else None


def machine_rows(provider_id: int, *, machine_ids: list[int] | None = None, history: bool = True) -> list[dict[str, Any]]:
    """Machines as the dashboard shows them; updates leave out the utilisation history
    (a client appends each update's `gpu_util` to the history it got in the snapshot)."""
    return [{**m, "last_heartbeat": _iso(m["last_heartbeat"])} for m in selectors.provider_machines(provider_id, machine_ids=machine_ids, history=history)]


def machine_rows_by_provider(machine_ids: list[int]) -> dict[int, list[dict[str, Any]]]:
    """``machine_rows`` (without history) of these machines, by provider id, at once."""
    got = selectors.machines_rows(Machine.objects.all(), machine_ids=machine_ids, history=False)
    return {p: [{**m, "last_heartbeat": _iso(m["last_heartbeat"])} for m in rows] for p, rows in got.items()}


def sales_rows(provider_id: int, *, trade_ids: list[int] | None = None) -> list[dict[str, Any]]:
    return [{**t, "created_at": _iso(t["created_at"])} for t in selectors.provider_sales(provider_id, trade_ids=trade_ids)]


def sales_rows_by_provider(trade_ids: list[int], *, loaded: list[Trade] | None = None) -> dict[int, list[dict[str, Any]]]:
    """``sales_rows`` of these trades, by provider id, at once; ``loaded``: the trades
    themselves, with their round and job, when the caller has them."""
    by_provider = selectors.sales_of_trades(loaded) if loaded is not None else selectors.sales_by_provider(trade_ids)
    return {p: [{**t, "created_at": _iso(t["created_at"])} for t in rows] for p, rows in by_provider.items()}


def provider_totals(provider_id: int) -> dict[str, int]:
    return selectors.provider_totals(provider_id)


def providers_totals(provider_ids: list[int]) -> dict[int, dict[str, int]]:
    return selectors.providers_totals(provider_ids)


def _provider_id(user: User) -> int | None:
    return Provider.objects.filter(user=user).values_list("pk", flat=True).first()


def machines(user: User) -> dict[str, Any]:
    provider_id = _provider_id(user)
    return {"machines": machine_rows(provider_id) if provider_id else []}


def sales(user: User) -> dict[str, Any]:
    provider_id = _provider_id(user)
    if provider_id is None:
        return {"totals": {"sold": 0, "pending": 0, "trades": 0, "settled": 0, "paid": 0, "held": 0, "free": 0, "withdrawn": 0, "stake": 0}, "sales": []}
    return {"totals": provider_totals(provider_id), "sales": sales_rows(provider_id)}


def operator() -> dict[str, Any]:
    o = selectors.operator_overview()
    return {
        **o,
        "rounds": [{**r, "cleared_at": _iso(r["cleared_at"])} for r in o["rounds"]],
        "offline": [{**m, "last_heartbeat": _iso(m["last_heartbeat"])} for m in o["offline"]],
    }


def snapshot(channel: str, user: User | None) -> dict[str, Any]:
    if channel.startswith("book."):
        _, rest = channel.split(".", 1)
        gpu_model, _, region = rest.rpartition(".")
        return book(gpu_model, region)
    if channel == "rounds":
        return rounds()
    if channel == "trades":
        return trades()
    assert user is not None
    if channel == "orders":
        return orders(user)
    if channel == "jobs":
        return jobs(user)
    if channel == "machines":
        return machines(user)
    if channel == "sales":
        return sales(user)
    if channel == "operator":
        return operator()
    return balances(user)


def balances(user: User) -> dict[str, Any]:
    """The user's escrow as the journal has it (confirmed chain events only): address, free,
    locked and, for providers, stake; the same figures as the wallet page."""
    escrow = escrow_of(user=user)
    address = escrow["address"]
    provider = getattr(user, "provider", None)
    stake_address = provider.chain_address if provider is not None and provider.chain_address else None
    mine = account_balances(prefix_filter=stake_address) if stake_address else {}
    stake, earned = mine.get(f"stake:{stake_address}", 0), mine.get(f"free:{stake_address}", 0)
    return {"balances": {"address": address, "custodial": escrow["custodial"], "free": escrow["free"], "locked": escrow["locked"],
                         "locks": len(escrow["locks"]), "provider_address": stake_address, "earnings_free": earned, "stake": stake}}


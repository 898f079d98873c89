"""The snapshot a subscriber receives first, and the update payloads, per channel."""

from __future__ import annotations

from typing import Any

from django.db.models import Sum

from market import selectors
from market.models import AuctionRound, Bid, Job, Trade, User
from market.states import RoundState

DEPTH_LEVELS = 20


def book(gpu_model: str, region: str) -> dict[str, Any]:
    """Best ask and bid, and ask depth by price level, for one bucket."""
    offers = selectors.offers_open().filter(gpu_model_id=gpu_model, machine__region_id=region, gpus_free__gt=0)
    levels = list(offers.values("price").annotate(gpus=Sum("gpus_free")).order_by("price")[:DEPTH_LEVELS])
    buckets = selectors.market_buckets(gpu_model=gpu_model, region=region)
    b = buckets[0] if buckets else None
    return {
        "gpu_model": gpu_model,
        "region": region,
        "best_ask": levels[0]["price"] if levels else None,
        "best_bid": b.best_bid if b else None,
        "last_price": b.last_price if b else None,
        "gpus_free": sum(lv["gpus"] for lv in levels),
        "asks": [[lv["price"], lv["gpus"]] for lv in levels],
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


def rounds() -> dict[str, Any]:
    recent = AuctionRound.objects.filter(state=RoundState.CLEARED).order_by("-number")[:10]
    return {"rounds": [round_summary(r) for r in recent]}


def trade_public(t: Trade) -> dict[str, Any]:
    return {"id": t.pk, "round": t.round.number, "gpu_model": t.gpu_model_id, "region": t.region_id, "price": t.price, "gpus": t.gpus, "duration_s": t.duration_s}


def trades() -> dict[str, Any]:
    return {"trades": [trade_public(t) for t in Trade.objects.select_related("round").order_by("-id")[:50]]}


def bid_private(b: Bid) -> dict[str, Any]:
    return {"id": b.pk, "client_order_id": b.client_order_id, "state": b.state, "gpus": b.gpus, "gpu_models": b.gpu_models, "max_price": b.max_price, "explanation": b.explanation}


def orders(user: User) -> dict[str, Any]:
    return {"orders": [bid_private(b) for b in Bid.objects.filter(buyer=user).order_by("-id")[:100]]}


def job_private(j: Job) -> dict[str, Any]:
    return {"id": j.pk, "trade": j.trade_id, "state": j.state, "progress": j.progress, "gpu_seconds": j.gpu_seconds,
            "trade_state": j.trade.state}


def jobs(user: User) -> dict[str, Any]:
    return {"jobs": [job_private(j) for j in selectors.jobs_visible(user).filter(trade__buyer=user)[:100]]}


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
    return {"balances": None, "note": "escrow balances appear here once settlement is enabled"}


"""Reads for the market: what each user may see, and the market buckets."""

from __future__ import annotations

from dataclasses import dataclass

from django.db.models import Count, Min, Q, QuerySet, Sum

from market.models import AuctionRound, Bid, Job, Offer, Trade, User
from market.states import BidState, OfferState, RoundState
from providers.models import Machine


def _operator(user: User) -> bool:
    return user.is_authenticated and (user.is_superuser or user.role == "operator")


def offers_open() -> QuerySet[Offer]:
    return Offer.objects.filter(state=OfferState.OPEN).select_related("machine", "machine__region", "machine__provider", "gpu_model")


def offers_visible(user: User) -> QuerySet[Offer]:
    """Open offers are public market data; a provider also sees its own paused and withdrawn ones."""
    qs = Offer.objects.select_related("machine", "machine__region", "gpu_model")
    if _operator(user):
        return qs
    visible = Q(state=OfferState.OPEN)
    if user.is_authenticated and hasattr(user, "provider"):
        visible |= Q(machine__provider=user.provider)
    return qs.filter(visible)


def offers_owned(user: User) -> QuerySet[Offer]:
    qs = Offer.objects.select_related("machine", "machine__region", "gpu_model")
    return qs if _operator(user) else qs.filter(machine__provider__user=user)


def machines_visible(user: User) -> QuerySet[Machine]:
    qs = Machine.objects.select_related("region", "provider").prefetch_related("gpus")
    return qs if _operator(user) else qs.filter(provider__user=user)


def bids_visible(user: User) -> QuerySet[Bid]:
    qs = Bid.objects.select_related("buyer", "location_region")
    return qs if _operator(user) else qs.filter(buyer=user)


def trades_visible(user: User) -> QuerySet[Trade]:
    qs = Trade.objects.select_related("bid", "offer", "provider", "round")
    return qs if _operator(user) else qs.filter(Q(buyer=user) | Q(provider__user=user))


def jobs_visible(user: User) -> QuerySet[Job]:
    qs = Job.objects.select_related("trade", "trade__offer__machine")
    return qs if _operator(user) else qs.filter(Q(trade__buyer=user) | Q(trade__provider__user=user))


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


def market_buckets(*, gpu_model: str | None = None, region: str | None = None) -> list[Bucket]:
    """Every GPU model x region with open offers or open bids."""
    offers = offers_open()
    if gpu_model:
        offers = offers.filter(gpu_model_id=gpu_model)
    if region:
        offers = offers.filter(machine__region_id=region)
    ask_rows = offers.values("gpu_model_id", "machine__region_id").annotate(
        n=Count("id"), free=Sum("gpus_free"), best=Min("price")
    )
    buckets: dict[tuple[str, str], dict[str, int | None]] = {}
    for row in ask_rows:
        buckets[(row["gpu_model_id"], row["machine__region_id"])] = {"offers": row["n"], "free": row["free"] or 0, "ask": row["best"], "bid": None, "bids": 0}
    # a bid names models and regions by list; count it in each bucket it could trade in,
    # looking only at the buckets of its models (most bids name one or two)
    by_model: dict[str, list[tuple[str, str]]] = {}
    for key in buckets:
        by_model.setdefault(key[0], []).append(key)
    for bid in Bid.objects.filter(state=BidState.OPEN).values("gpu_models", "allowed_regions", "max_price"):
        keys = [k for m in bid["gpu_models"] for k in by_model.get(m, [])] if bid["gpu_models"] else list(buckets)
        regions = set(bid["allowed_regions"])
        for key in keys:
            if not regions or key[1] in regions:
                b = buckets[key]
                b["bids"] = (b["bids"] or 0) + 1
                b["bid"] = max(b["bid"] or 0, bid["max_price"])
    history = _last_prices()
    out = []
    for (model, reg), b in sorted(buckets.items()):
        prices = history.get((model, reg), [])
        out.append(Bucket(model, reg, int(b["offers"] or 0), int(b["free"] or 0), b["ask"], b["bid"], int(b["bids"] or 0), prices[0] if prices else None, prices[1] if len(prices) > 1 else None))
    return out


def bucket_price_history(gpu_model: str, region: str, limit: int = 100) -> list[tuple[int, int]]:
    """(round number, clearing price) for one bucket, oldest first."""
    out = []
    rows = AuctionRound.objects.filter(state=RoundState.CLEARED).exclude(prices=[]).order_by("-number").values_list("number", "prices")[:limit]
    for number, prices in rows:
        for p in prices:
            if p["gpu_model"] == gpu_model and p["region"] == region and p.get("price") is not None:
                out.append((number, p["price"]))
    return out[::-1]


def offer_stats() -> dict[str, int]:
    agg = offers_open().aggregate(n=Count("id"), gpus=Sum("gpus_free"), providers=Count("machine__provider", distinct=True))
    return {"offers": agg["n"] or 0, "gpus_free": agg["gpus"] or 0, "providers": agg["providers"] or 0}

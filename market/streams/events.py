"""What services announce after they commit. Payloads are built at commit time,
so a subscriber never sees a state the database rolled back."""

from __future__ import annotations

from django.db import transaction

from market.models import AuctionRound, Bid, Job, Trade
from market.streams import snapshots
from market.streams.publish import publish


def bid_changed(bid: Bid) -> None:
    bid_id, user_id = bid.pk, bid.buyer_id

    def send() -> None:
        row = Bid.objects.filter(pk=bid_id).first()
        if row is not None:
            publish("orders", {"order": snapshots.bid_private(row)}, user_id=user_id)

    transaction.on_commit(send)


def book_changed(gpu_model: str, region: str) -> None:
    transaction.on_commit(lambda: publish(f"book.{gpu_model}.{region}", snapshots.book(gpu_model, region)))


def round_cleared(round_id: int) -> None:
    def send() -> None:
        rnd = AuctionRound.objects.get(pk=round_id)
        publish("rounds", {"round": snapshots.round_summary(rnd)})
        trades = list(Trade.objects.filter(round=rnd).select_related("round", "bid", "job"))
        for t in trades:
            publish("trades", {"trade": snapshots.trade_public(t)})
            publish("orders", {"order": snapshots.bid_private(t.bid)}, user_id=t.buyer_id)
            publish("jobs", {"job": snapshots.job_private(t.job)}, user_id=t.buyer_id)
        for model, region in sorted({(t.gpu_model_id, t.region_id) for t in trades} | {(p["gpu_model"], p["region"]) for p in rnd.prices}):
            publish(f"book.{model}.{region}", snapshots.book(model, region))
        for bid in Bid.objects.filter(pk__in=[u["bid_id"] for u in rnd.result.get("unmatched", [])]).only("id", "buyer_id", "client_order_id", "state", "gpus", "gpu_models", "max_price", "explanation"):
            publish("orders", {"order": snapshots.bid_private(bid)}, user_id=bid.buyer_id)

    transaction.on_commit(send)


def jobs_changed(*, job_ids: list[int] | None = None, trade_ids: list[int] | None = None) -> None:
    """A job moved (state, progress) or its trade's money did (recorded, settled,
    refunded): its buyer's ``jobs`` channel gets the job as it is after the commit."""
    if not job_ids and not trade_ids:
        return
    ids = list(job_ids or [])
    if trade_ids:
        ids += list(Job.objects.filter(trade_id__in=trade_ids).values_list("pk", flat=True))

    def send() -> None:
        for job in Job.objects.filter(pk__in=ids).select_related("trade").order_by("id"):
            publish("jobs", {"job": snapshots.job_private(job)}, user_id=job.trade.buyer_id)

    transaction.on_commit(send)

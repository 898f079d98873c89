"""What services announce after they commit. Payloads are built at commit time,
so a subscriber never sees a state the database rolled back."""

from __future__ import annotations

from django.db import transaction

from market.models import AuctionRound, Bid, Job, Trade
from market.streams import snapshots
from market.streams.publish import account_group, credentials_revoked, publish, token_group


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
        trades = list(Trade.objects.filter(round=rnd).select_related("round", "bid", "job", "offer", "provider"))
        for t in trades:
            publish("trades", {"trade": snapshots.trade_public(t)})
            publish("orders", {"order": snapshots.bid_private(t.bid)}, user_id=t.buyer_id)
            publish("jobs", {"job": snapshots.job_private(t.job)}, user_id=t.buyer_id)
        for model, region in sorted({(t.gpu_model_id, t.region_id) for t in trades} | {(p["gpu_model"], p["region"]) for p in rnd.prices}):
            publish(f"book.{model}.{region}", snapshots.book(model, region))
        for bid in Bid.objects.filter(pk__in=[u["bid_id"] for u in rnd.result.get("unmatched", [])]).only("id", "buyer_id", "client_order_id", "state", "gpus", "gpu_models", "max_price", "explanation"):
            publish("orders", {"order": snapshots.bid_private(bid)}, user_id=bid.buyer_id)
        sold: dict[int, list[int]] = {}
        for t in trades:
            sold.setdefault(t.provider.user_id, []).append(t.pk)
        _send_sales(sold)  # the winning providers see the sale, and their machines' booked GPUs
        _send_machines(sorted({t.offer.machine_id for t in trades}))
        publish("operator", snapshots.operator())

    transaction.on_commit(send)


def jobs_changed(*, job_ids: list[int] | None = None, trade_ids: list[int] | None = None) -> None:
    """A job moved (state, progress) or its trade's money did (recorded, settled,
    refunded): its buyer's ``jobs`` channel gets the job as it is after the commit,
    and its provider's ``sales`` channel the sale with the provider's new totals."""
    if not job_ids and not trade_ids:
        return
    ids = list(job_ids or [])
    if trade_ids:
        ids += list(Job.objects.filter(trade_id__in=trade_ids).values_list("pk", flat=True))

    def send() -> None:
        sold: dict[int, list[int]] = {}
        for job in Job.objects.filter(pk__in=ids).select_related("trade", "trade__provider").order_by("id"):
            publish("jobs", {"job": snapshots.job_private(job)}, user_id=job.trade.buyer_id)
            sold.setdefault(job.trade.provider.user_id, []).append(job.trade_id)
        _send_sales(sold)

    transaction.on_commit(send)


def _send_sales(trades_by_user: dict[int, list[int]]) -> None:
    from providers.models import Provider

    providers = dict(Provider.objects.filter(user_id__in=list(trades_by_user)).values_list("user_id", "pk"))
    for user_id, trade_ids in sorted(trades_by_user.items()):
        provider_id = providers[user_id]
        totals = snapshots.provider_totals(provider_id)
        for sale in snapshots.sales_rows(provider_id, trade_ids=trade_ids):
            publish("sales", {"sale": sale, "totals": totals}, user_id=user_id)


def machines_changed(*, machine_ids: list[int], states_changed: bool = False) -> None:
    """A heartbeat arrived or machines went quiet: each owner's ``machines`` channel gets
    the machine with its telemetry; the operator's overview follows a change of state."""
    if not machine_ids:
        return
    ids = list(machine_ids)

    def send() -> None:
        _send_machines(ids)
        if states_changed:
            publish("operator", snapshots.operator())

    transaction.on_commit(send)


def _send_machines(machine_ids: list[int]) -> None:
    from providers.models import Machine

    owners = dict(Machine.objects.filter(pk__in=machine_ids).values_list("provider_id", "provider__user_id"))
    for provider_id, user_id in sorted(owners.items()):
        for machine in snapshots.machine_rows(provider_id, machine_ids=machine_ids, history=False):
            publish("machines", {"machine": machine}, user_id=user_id)


def operator_changed() -> None:
    """Rounds, the settlement queue or job states moved: operators get the overview, whole."""
    transaction.on_commit(lambda: publish("operator", snapshots.operator()))


def balances_changed(*, addresses: list[str]) -> None:
    """Confirmed chain events moved money of these addresses: each owner (a buyer's custodial
    key or wallet, a provider's address) gets its escrow on the ``balances`` channel."""
    from ledger.models import CustodialKey
    from market.models import User
    from providers.models import Provider

    if not addresses:
        return
    owners: set[int] = set()
    for address in addresses:
        owners |= set(CustodialKey.objects.filter(address__iexact=address).values_list("user_id", flat=True))
        owners |= set(User.objects.filter(chain_address__iexact=address).values_list("pk", flat=True))
        owners |= set(Provider.objects.filter(chain_address__iexact=address).values_list("user_id", flat=True))

    def send() -> None:
        for user in User.objects.filter(pk__in=sorted(owners)):
            publish("balances", snapshots.balances(user), user_id=user.pk)

    transaction.on_commit(send)


def token_revoked(token_id: int) -> None:
    """Open sockets the token authenticated close at once, not at their next action."""
    transaction.on_commit(lambda: credentials_revoked(token_group(token_id), "This token was revoked. Create a new one on your account page."))


def user_deactivated(user_id: int) -> None:
    """Every open socket of the account closes, whether a token or a session opened it."""
    transaction.on_commit(lambda: credentials_revoked(account_group(user_id), "This account is disabled."))

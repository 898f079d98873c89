"""The live streams' handlers of the domain events (market.events): each runs after the
announcing transaction commits and publishes what changed, read then, so a subscriber
never sees a state the database rolled back. MarketConfig.ready() subscribes them."""

from __future__ import annotations

from ledger.models import CustodialKey
from market.events import (
    BalancesChanged,
    BidChanged,
    BookChanged,
    JobsChanged,
    MachinesChanged,
    OperatorChanged,
    RoundCleared,
    TokenRevoked,
    UserDeactivated,
)
from market.models import AuctionRound, Bid, Job, Trade, User
from market.streams import snapshots
from market.streams.publish import account_group, batched, credentials_revoked, publish, token_group
from providers.models import Machine, Provider


def bid_changed(event: BidChanged) -> None:
    row = Bid.objects.filter(pk=event.bid_id).first()
    if row is not None:
        publish("orders", {"order": snapshots.bid_private(row)}, user_id=event.user_id, unchanged_key=f"bid:{row.pk}")


def book_changed(event: BookChanged) -> None:
    publish(f"book.{event.gpu_model}.{event.region}", snapshots.book(event.gpu_model, event.region), unchanged_key="book")


def round_cleared(event: RoundCleared) -> None:
    with batched():  # thousands of updates in a large round: one pipeline, not a round trip each
        _round_cleared(event)


def _round_cleared(event: RoundCleared) -> None:
    rnd = AuctionRound.objects.only(*snapshots.SUMMARY_FIELDS).get(pk=event.round_id)
    publish("rounds", {"round": snapshots.round_summary(rnd)})
    trades = list(Trade.objects.with_round().filter(round=rnd).select_related("bid", "job", "offer", "provider"))
    unmatched = list(event.unmatched_bid_ids)
    links = snapshots.trade_links([t.bid_id for t in trades] + unmatched)  # one query for every bid below
    for t in trades:
        publish("trades", {"trade": snapshots.trade_public(t)})
        publish("orders", {"order": snapshots.bid_private(t.bid, links)}, user_id=t.buyer_id, unchanged_key=f"bid:{t.bid_id}")
        publish("jobs", {"job": snapshots.job_private(t.job)}, user_id=t.buyer_id)
    moved = snapshots.books(sorted({(t.gpu_model_id, t.region_id) for t in trades} | {(p["gpu_model"], p["region"]) for p in rnd.prices}))
    for (model, region), book in sorted(moved.items()):
        publish(f"book.{model}.{region}", book, unchanged_key="book")  # a book no round moved: not again
    # a bid still waiting is sent when what the round says of it changed (its explanation)
    for bid in Bid.objects.filter(pk__in=unmatched).only("id", "buyer_id", "client_order_id", "state", "gpus", "gpu_models", "max_price", "explanation", "expires_at"):
        publish("orders", {"order": snapshots.bid_private(bid, links)}, user_id=bid.buyer_id, unchanged_key=f"bid:{bid.pk}")
    sold: dict[int, list[int]] = {}
    for t in trades:
        sold.setdefault(t.provider.user_id, []).append(t.pk)
    _send_sales(sold, loaded=trades)  # the winning providers see the sale, and their machines' booked GPUs
    _send_machines(sorted({t.offer.machine_id for t in trades}))
    publish("operator", snapshots.operator())


def jobs_changed(event: JobsChanged) -> None:
    """A job moved (state, progress) or its trade's money did (recorded, settled,
    refunded): its buyer's ``jobs`` channel gets the job as it is after the commit,
    and its provider's ``sales`` channel the sale with the provider's new totals."""
    if not event.job_ids and not event.trade_ids:
        return
    ids = list(event.job_ids)
    if event.trade_ids:
        ids += list(Job.objects.filter(trade_id__in=event.trade_ids).values_list("pk", flat=True))
    sold: dict[int, list[int]] = {}
    for job in Job.objects.filter(pk__in=ids).select_related("trade", "trade__provider").order_by("id"):
        publish("jobs", {"job": snapshots.job_private(job, log=True)}, user_id=job.trade.buyer_id)
        sold.setdefault(job.trade.provider.user_id, []).append(job.trade_id)
    _send_sales(sold)


def _send_sales(trades_by_user: dict[int, list[int]], *, loaded: list[Trade] | None = None) -> None:
    """``loaded``: those trades, read with their round and job, when the caller has them."""
    providers = dict(Provider.objects.filter(user_id__in=list(trades_by_user)).values_list("user_id", "pk"))
    sales = snapshots.sales_rows_by_provider([t for ids in trades_by_user.values() for t in ids], loaded=loaded)
    totals_of = snapshots.providers_totals(list(providers.values()))
    for user_id, _ in sorted(trades_by_user.items()):
        provider_id = providers[user_id]
        totals = totals_of[provider_id]
        for sale in sales.get(provider_id, []):
            publish("sales", {"sale": sale, "totals": totals}, user_id=user_id)


def machines_changed(event: MachinesChanged) -> None:
    """A heartbeat arrived or machines went quiet: each owner's ``machines`` channel gets
    the machine with its telemetry; the operator's overview follows a change of state."""
    if not event.machine_ids:
        return
    _send_machines(list(event.machine_ids))
    if event.states_changed:
        publish("operator", snapshots.operator())


def _send_machines(machine_ids: list[int]) -> None:
    owners = dict(Machine.objects.filter(pk__in=machine_ids).values_list("provider_id", "provider__user_id"))
    rows = snapshots.machine_rows_by_provider(machine_ids)
    for provider_id, user_id in sorted(owners.items()):
        for machine in rows.get(provider_id, []):
            publish("machines", {"machine": machine}, user_id=user_id)


def operator_changed(event: OperatorChanged) -> None:
    """Operators get the overview, whole."""
    publish("operator", snapshots.operator())


def balances_changed(event: BalancesChanged) -> None:
    """Each owner of the addresses (a buyer's custodial key or wallet, a provider's
    address) gets its escrow on the ``balances`` channel."""
    if not event.addresses:
        return
    owners: set[int] = set()
    for address in event.addresses:
        owners |= set(CustodialKey.objects.filter(address__iexact=address).values_list("user_id", flat=True))
        owners |= set(User.objects.filter(chain_address__iexact=address).values_list("pk", flat=True))
        owners |= set(Provider.objects.filter(chain_address__iexact=address).values_list("user_id", flat=True))
    for user in User.objects.filter(pk__in=sorted(owners)):
        publish("balances", snapshots.balances(user), user_id=user.pk)


def token_revoked(event: TokenRevoked) -> None:
    """Open sockets the token authenticated close at once, not at their next action."""
    credentials_revoked(token_group(event.token_id), "This token was revoked. Create a new one on your account page.")


def user_deactivated(event: UserDeactivated) -> None:
    """Every open socket of the account closes, whether a token or a session opened it."""
    credentials_revoked(account_group(event.user_id), "This account is disabled.")

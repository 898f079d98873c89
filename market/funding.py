"""Money behind bids: a bid can be placed, and matched, only while the buyer's free escrow
covers what it may cost.

A bid's worst case is its max price x GPUs x hours (the engine's own formula, so a trade
never costs more than the bid's worst case). The buyer's escrow is the journal's `free`
balance of its address, which the listener writes from confirmed chain events; from it we
take what is already promised: the worst case of its other open bids (not yet expired) and the amount of its
trades matched but not yet locked on chain (`pending`). Checked when the bid is placed
(under the buyer's row lock, so two placements cannot both spend the same money) and
again in each round's snapshot, since the buyer may withdraw in between.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from django.db.models import Q, Sum
from django.utils import timezone

from ledger.models import CustodialKey, JournalEntry
from market.errors import PaymentRequired
from market.models import Bid, Trade, User
from market.money import TOKEN, usdc  # noqa: F401 (messages here and in jobs and rounds use them)
from market.states import BidState, TradeState


def bid_worst_case(*, max_price: int, gpus: int, duration_s: int) -> int:
    return max_price * gpus * duration_s // 3600


class EscrowShort(PaymentRequired):
    """The buyer's free escrow does not cover the bid's worst case (HTTP 402)."""

    code = "insufficient_escrow"

    def __init__(self, message: str, *, cost: int, available: int, free: int, committed: int) -> None:
        self.cost, self.available, self.free, self.committed = cost, available, free, committed
        self.shortfall = cost - available
        super().__init__(message, fields={"max_price": [f"Deposit at least {usdc(self.shortfall)} more, or lower max_price, gpus or duration_s."]})
        # base units, for programs: what the bid may cost and what the escrow has for it
        self.details = {"cost": cost, "free": free, "committed": committed, "available": available, "shortfall": self.shortfall}


@dataclass(frozen=True)
class Funds:
    free: int  # in escrow and not locked, per the journal (confirmed chain events)
    committed: int  # promised to open bids (worst case) and to trades not yet locked on chain

    @property
    def available(self) -> int:
        return self.free - self.committed


def _addresses(user_ids: Iterable[int]) -> dict[int, str]:
    out = dict(User.objects.filter(pk__in=list(user_ids)).exclude(chain_address="").values_list("pk", "chain_address"))
    out.update(CustodialKey.objects.filter(user_id__in=list(user_ids)).values_list("user_id", "address"))
    return out


def _free_by_address(addresses: Iterable[str]) -> dict[str, int]:
    """Each address's `free:` balance in the journal, in two grouped queries."""
    accounts = {f"free:{a}".lower(): a for a in addresses}
    if not accounts:
        return {}
    debit_q, credit_q = Q(), Q()
    for account in accounts:
        debit_q |= Q(debit__iexact=account)
        credit_q |= Q(credit__iexact=account)
    out: dict[str, int] = defaultdict(int)
    for account, total in JournalEntry.objects.filter(debit_q).values_list("debit").annotate(n=Sum("amount")):
        out[accounts[account.lower()]] += int(total)
    for account, total in JournalEntry.objects.filter(credit_q).values_list("credit").annotate(n=Sum("amount")):
        out[accounts[account.lower()]] -= int(total)
    return out


def _pending_by_buyer(user_ids: Iterable[int]) -> dict[int, int]:
    return {b: int(n) for b, n in Trade.objects.filter(buyer_id__in=list(user_ids), state=TradeState.PENDING).values_list("buyer_id").annotate(n=Sum("amount"))}


def funds_of(user: User, *, except_bid: int | None = None) -> Funds:
    address = _addresses([user.pk]).get(user.pk)
    free = _free_by_address([address]).get(address, 0) if address else 0
    # a bid past its expiry promises nothing, also before a round (or the task) marks it expired
    bids = Bid.objects.filter(buyer=user, state=BidState.OPEN, expires_at__gt=timezone.now())
    if except_bid is not None:
        bids = bids.exclude(pk=except_bid)
    promised = sum(bid_worst_case(max_price=p, gpus=g, duration_s=d) for p, g, d in bids.values_list("max_price", "gpus", "duration_s"))
    return Funds(free=free, committed=promised + _pending_by_buyer([user.pk]).get(user.pk, 0))


def funds_check(*, user: User, max_price: int, gpus: int, duration_s: int) -> Funds:
    """Raise EscrowShort unless the buyer's available escrow covers this bid's worst case.
    The caller holds the buyer's row lock."""
    cost = bid_worst_case(max_price=max_price, gpus=gpus, duration_s=duration_s)
    funds = funds_of(user)
    if cost > funds.available:
        raise EscrowShort(
            f"This bid may cost up to {usdc(cost)} (max price x GPUs x hours) but your escrow has {usdc(max(funds.available, 0))} free to commit "
            f"({usdc(funds.free)} deposited and unlocked, {usdc(funds.committed)} promised to your open bids and unrecorded trades). "
            f"Deposit at least {usdc(cost - funds.available)} more (Wallet page, or POST /api/v1/ledger/deposit/), or bid for less.",
            cost=cost, available=funds.available, free=funds.free, committed=funds.committed,
        )
    return funds


def bids_uncovered(bids: Iterable[tuple[int, int, int, int, int]]) -> dict[int, str]:
    """Of open bids `(id, buyer_id, max_price, gpus, duration_s)`, those the buyer's escrow no
    longer covers, oldest bids first in line, each with the reason to show its owner."""
    rows = sorted(bids)
    buyers = {r[1] for r in rows}
    if not buyers:
        return {}
    addresses = _addresses(buyers)
    free = _free_by_address(addresses.values())
    pending = _pending_by_buyer(buyers)
    left = {b: free.get(addresses.get(b, ""), 0) - pending.get(b, 0) for b in buyers}
    out: dict[int, str] = {}
    for bid_id, buyer_id, max_price, gpus, duration_s in rows:
        cost = bid_worst_case(max_price=max_price, gpus=gpus, duration_s=duration_s)
        if cost <= left[buyer_id]:
            left[buyer_id] -= cost
            continue
        out[bid_id] = (f"Your escrow does not cover this bid: it may cost up to {usdc(cost)} and {usdc(max(left[buyer_id], 0))} of your escrow is free "
                       f"for it. Deposit at least {usdc(cost - max(left[buyer_id], 0))} more; the bid stays in the book and takes part once it is covered.")
    return out

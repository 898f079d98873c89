"""Balances as the journal has them (confirmed chain events only): an account's escrow and a
provider's earnings. They read only the ledger's own tables; the market's pages, API and
streams show these figures, so each is the chain's to the unit."""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from django.db.models import Max, Q, Sum

from ledger.journal import account_balances
from ledger.models import ChainTx, ChainTxState, CustodialKey, JournalEntry, RecordItem

if TYPE_CHECKING:
    from market.models import User
    from providers.models import Provider


# --- escrow ------------------------------------------------------------------------------------
def escrow_of(*, user: User | None = None, address: str | None = None) -> dict[str, Any]:
    """An account's escrow as the journal has it: free and locked balances, the locks per
    trade (what is still locked for each), and transactions of its key not yet final."""
    custodial = None
    if user is not None:
        custodial = CustodialKey.objects.filter(user=user).first()
        address = custodial.address if custodial is not None else (user.chain_address or None)
    out: dict[str, Any] = {"address": address, "custodial": custodial is not None, "free": 0, "locked": 0, "locks": [], "pending": []}
    if not address:
        return out
    balances = account_balances(prefix_filter=address)
    out["free"] = balances.get(f"free:{address}", 0)
    out["locked"] = balances.get(f"locked:{address}", 0)
    per_trade: dict[int, int] = defaultdict(int)
    account = f"locked:{address}"
    entries = JournalEntry.objects.filter(Q(debit__iexact=account) | Q(credit__iexact=account), trade_id__isnull=False)
    for e in entries.values("trade_id", "debit", "amount"):
        per_trade[e["trade_id"]] += e["amount"] if e["debit"].lower() == account.lower() else -e["amount"]
    items = {i.trade_id: i for i in RecordItem.objects.filter(trade_id__in=list(per_trade)).select_related("batch")}
    for trade_id in sorted(t for t, amount in per_trade.items() if amount):
        item = items.get(trade_id)
        out["locks"].append({"trade": trade_id, "amount": per_trade[trade_id], "deadline": item.deadline if item else None,
                             "batch": item.batch.number if item else None})
    open_states = (ChainTxState.SIGNED, ChainTxState.SENT, ChainTxState.MINED)
    for row in ChainTx.objects.filter(sender__iexact=address, state__in=open_states).order_by("id"):
        out["pending"].append({"purpose": row.purpose, "tx_hash": row.tx_hash, "state": row.state})
    return out


def earnings_of(*, provider: Provider, series_limit: int = 500) -> dict[str, Any]:
    """A provider's money, built only from journal entries (confirmed chain events), so each
    figure is the chain's to the unit. The one source for the earnings API, the provider page
    and `gridbid-agent earnings`. Token base units:

    * `settled`: what settlement batches paid it (price x GPU-seconds used; the share of a
      lock refunded to the buyer is never its money);
    * `paid`: `settled` less what disputes it lost gave back to buyers. A dispute it won
      counts once: the released amount is the payment coming back, not new earnings;
    * `held`: the part of `paid` held now in open disputes over its trades (from its free
      balance or its stake), with `disputes` counting open, won and lost ones and amounts;
    * `free` (withdrawable, the contract's `balance_of`), `withdrawn`, `stake`, `slashed`;
    * `payments`: per trade, newest first, what it paid and where its dispute stands;
    * `series`: (unix time, cumulative `paid` less `held`) after each event that moved it.
    """
    address = provider.chain_address or None
    disputes = {"open": 0, "held": 0, "won": 0, "won_amount": 0, "lost": 0, "lost_amount": 0}
    out: dict[str, Any] = {"provider": provider.pk, "address": address, "settled": 0, "paid": 0, "held": 0, "free": 0,
                           "withdrawn": 0, "stake": 0, "slashed": 0, "disputes": disputes, "payments": [], "series": []}
    if not address:
        return out
    free, stake = f"free:{address}", f"stake:{address}"
    mine = Q(debit__iexact=free) | Q(credit__iexact=free) | Q(debit__iexact=stake) | Q(credit__iexact=stake)
    balances = {k.lower(): v for k, v in account_balances(prefix_filter=address).items()}
    out["free"], out["stake"] = balances.get(free.lower(), 0), balances.get(stake.lower(), 0)
    pays = JournalEntry.objects.filter(kind="pay", debit__iexact=free)
    out["settled"] = int(pays.aggregate(total=Sum("amount"))["total"] or 0)
    out["withdrawn"] = int(JournalEntry.objects.filter(kind="withdraw", credit__iexact=free).aggregate(total=Sum("amount"))["total"] or 0)
    out["slashed"] = int(JournalEntry.objects.filter(kind="slash", credit__iexact=stake).aggregate(total=Sum("amount"))["total"] or 0)

    # disputes, trade by trade: what was held from this provider (its free balance or stake),
    # given back to it (won) or passed to the buyer (lost: that leg touches none of its accounts)
    holds = list(JournalEntry.objects.filter(mine, kind__in=["hold", "release"], trade_id__isnull=False).order_by("seq"))
    held_trades = {e.trade_id for e in holds if e.kind == "hold"}
    losses = list(JournalEntry.objects.filter(kind="refund", trade_id__in=held_trades, credit__startswith="held:").order_by("seq")) if held_trades else []
    held_now: dict[int, int] = defaultdict(int)
    outcome: dict[int, str] = {}
    for e in sorted([*holds, *losses], key=lambda e: e.seq):
        trade_id = int(e.trade_id)  # type: ignore[arg-type]
        if e.kind == "hold":
            held_now[trade_id] += e.amount
            outcome[trade_id] = "open"
        elif e.kind == "release":
            held_now[trade_id] -= e.amount
            outcome[trade_id] = "won"
            disputes["won_amount"] += e.amount
        elif e.credit == f"held:{trade_id}":
            held_now[trade_id] -= e.amount
            outcome[trade_id] = "lost"
            disputes["lost_amount"] += e.amount
    for state in outcome.values():
        disputes["open" if state == "open" else state] += 1
    disputes["held"] = out["held"] = sum(held_now.values())
    out["paid"] = out["settled"] - disputes["lost_amount"]

    per_trade = pays.exclude(trade_id__isnull=True).values("trade_id").annotate(paid=Sum("amount"), seq=Max("seq")).order_by("-trade_id")[:100]
    last = {e.seq: e for e in JournalEntry.objects.filter(seq__in=[row["seq"] for row in per_trade])}
    out["payments"] = [{"trade": row["trade_id"], "paid": int(row["paid"]), "dispute": outcome.get(row["trade_id"]),
                        "tx_hash": last[row["seq"]].tx_hash, "block": last[row["seq"]].block_number} for row in per_trade]

    if series_limit > 0:
        # paid less held after each confirmed event that moved it; events applied together share a point
        moves = JournalEntry.objects.filter(Q(kind="pay", debit__iexact=free) | Q(pk__in=[e.pk for e in holds])).order_by("seq")
        series: list[tuple[float, int]] = []
        running = 0
        for kind, amount, at in moves.values_list("kind", "amount", "created_at").iterator():
            running += -amount if kind == "hold" else amount
            t = round(at.timestamp(), 3)
            if series and t - series[-1][0] < 1:
                series[-1] = (series[-1][0], running)
            else:
                series.append((t, running))
        out["series"] = series[-series_limit:]
    return out


# --- statement ---------------------------------------------------------------------------------
STATEMENT_KINDS = {
    # journal kind -> what the line says, for the account whose statement it is
    "deposit": "deposit from your wallet",
    "withdraw": "withdrawal to your wallet",
    "lock": "locked for trade #{trade}",
    "pay": "paid for trade #{trade}",
    "refund": "refunded from trade #{trade}",
    "hold": "held in the dispute over trade #{trade}",
    "release": "released from the dispute over trade #{trade}",
    "slash": "slashed in the dispute over trade #{trade}",
    "stake": "staked",
    "unstake": "stake returned",
}
STATEMENT_COLUMNS = ("seq", "at", "kind", "what", "trade", "free_change", "locked_change", "free_after", "locked_after", "tx_hash", "block")


def statement_months(address: str | None) -> list[str]:
    """The months (YYYY-MM, newest first) in which the journal moved this address's money."""
    if not address:
        return []
    mine = _statement_q(address)
    return sorted({at.strftime("%Y-%m") for at in JournalEntry.objects.filter(mine).values_list("created_at", flat=True)}, reverse=True)


def _statement_q(address: str) -> Q:
    free, locked = f"free:{address}", f"locked:{address}"
    return Q(debit__iexact=free) | Q(credit__iexact=free) | Q(debit__iexact=locked) | Q(credit__iexact=locked)


def month_check(month: str | None) -> str | None:
    """``YYYY-MM`` as given, or None for none; ValueError saying what to send otherwise."""
    if month is None or month == "":
        return None
    import re

    if not re.fullmatch(r"\d{4}-(0[1-9]|1[0-2])", month):
        raise ValueError(f"month: expected YEAR-MONTH like 2026-12, got {month[:20]!r}")
    return month


def statement_of(*, address: str | None, month: str | None = None) -> dict[str, Any]:
    """Every movement of an address's escrow (its free and locked balances) in journal order:
    deposits, locks, payments, refunds, withdrawals, dispute holds and releases, each with
    its transaction, block and the balances after it. Built from the journal (confirmed
    chain events only), so the closing balances are the contract's. With ``month``
    (``YYYY-MM``, by when the journal confirmed each), that month's lines between its
    opening and closing balances. Token base units."""
    out: dict[str, Any] = {"address": address, "month": month, "opening": {"free": 0, "locked": 0}, "closing": {"free": 0, "locked": 0},
                           "lines": [], "totals": {}}
    if not address:
        return out
    free_acct, locked_acct = f"free:{address}".lower(), f"locked:{address}".lower()
    free = locked = 0
    totals: dict[str, int] = defaultdict(int)
    rows = (JournalEntry.objects.filter(_statement_q(address)).order_by("seq")
            .values_list("seq", "created_at", "kind", "debit", "credit", "amount", "trade_id", "tx_hash", "block_number"))
    for seq, at, kind, debit, credit, amount, trade, tx, block in rows:
        d, c = debit.lower(), credit.lower()
        dfree = (amount if d == free_acct else 0) - (amount if c == free_acct else 0)
        dlocked = (amount if d == locked_acct else 0) - (amount if c == locked_acct else 0)
        this_month = at.strftime("%Y-%m")
        if month is not None and this_month < month:
            free, locked = free + dfree, locked + dlocked
            out["opening"] = {"free": free, "locked": locked}
            continue
        if month is not None and this_month > month:
            break
        free, locked = free + dfree, locked + dlocked
        if kind == "pay" and d == free_acct:
            what = "earned from trade #{trade}"  # the provider's side of a payment
        elif kind == "slash" and d == free_acct:
            what = "from the provider's stake: the dispute over trade #{trade} went your way"
        else:
            what = STATEMENT_KINDS.get(kind, kind)
        totals[kind] += amount
        out["lines"].append({"seq": seq, "at": at.isoformat().replace("+00:00", "Z"), "kind": kind, "what": what.format(trade=trade),
                             "trade": trade, "free_change": dfree, "locked_change": dlocked, "free_after": free, "locked_after": locked,
                             "tx_hash": tx, "block": block})
    out["closing"] = {"free": free, "locked": locked}
    out["totals"] = dict(totals)
    return out


def statement_csv(statement: dict[str, Any]) -> str:
    """The statement as CSV: one row per line, amounts in USDC with every digit (6 decimals)."""
    import csv
    import io

    def usdc(v: int) -> str:
        sign = "-" if v < 0 else ""
        whole, frac = divmod(abs(v), 10**6)
        return f"{sign}{whole}.{frac:06d}"

    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(STATEMENT_COLUMNS)
    for line in statement["lines"]:
        w.writerow([usdc(line[c]) if c in ("free_change", "locked_change", "free_after", "locked_after") else ("" if line[c] is None else line[c])
                    for c in STATEMENT_COLUMNS])
    return buf.getvalue()

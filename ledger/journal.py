"""The double-entry, hash-chained journal and its verification against the chain.

Every entry moves `amount` from `credit` to `debit` (so it balances by
construction) and commits to the previous entry's hash. Entries are written
only by the listener from confirmed events (ledger/listener.py), in chain order,
so a reorg deeper than the confirmation depth removes a suffix of the chain.

An account's balance is what entered it minus what left it. `wallet:<addr>`
accounts are outside the market (they go negative as money comes in); the
others mirror the contract: `free:<addr>` = balance_of(addr), `locked:*` sums to
total_locked, `stake:<addr>` = providers(addr).stake, `held:*` sums to total_held.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from django.db.models import Sum

from ledger.models import CustodialKey, JournalEntry
from providers.models import Provider

GENESIS = "0" * 64


@dataclass(frozen=True)
class Leg:
    kind: str
    debit: str
    credit: str
    amount: int
    trade_id: int | None = None


def entry_hash(*, prev_hash: str, seq: int, kind: str, debit: str, credit: str, amount: int, trade_id: int | None,
               tx_hash: str, log_index: int, leg: int, block_number: int, block_hash: str) -> str:
    body = [prev_hash, seq, kind, debit, credit, amount, trade_id, tx_hash.lower(), log_index, leg, block_number, block_hash.lower()]
    return hashlib.sha256(json.dumps(body, separators=(",", ":")).encode()).hexdigest()


def journal_append(*, legs: Iterable[Leg], tx_hash: str, log_index: int, block_number: int, block_hash: str) -> list[JournalEntry]:
    """Append one event's legs. The caller holds the listener's lock (one writer)."""
    last = JournalEntry.objects.order_by("-seq").first()
    seq, prev = (last.seq, last.hash) if last else (0, GENESIS)
    out = []
    for n, leg in enumerate(legs):
        if leg.amount == 0:
            continue
        if leg.amount < 0 or leg.debit == leg.credit:
            raise ValueError(f"journal: unbalanced leg {leg}")
        seq += 1
        fields: dict[str, Any] = dict(seq=seq, kind=leg.kind, debit=leg.debit, credit=leg.credit, amount=leg.amount, trade_id=leg.trade_id,
                                      tx_hash=tx_hash, log_index=log_index, leg=n, block_number=block_number, block_hash=block_hash)
        h = entry_hash(prev_hash=prev, **fields)
        out.append(JournalEntry.objects.create(hash=h, prev_hash=prev, **fields))
        prev = h
    return out


def journal_truncate(*, after_block: int) -> int:
    """Drop the entries derived from blocks after `after_block` (a reorg removed them)."""
    deleted, _ = JournalEntry.objects.filter(block_number__gt=after_block).delete()
    return deleted


def account_balances(*, prefix_filter: str | None = None) -> dict[str, int]:
    balances: dict[str, int] = defaultdict(int)
    debits = JournalEntry.objects.all()
    credits = JournalEntry.objects.all()
    if prefix_filter:
        debits = debits.filter(debit__iendswith=prefix_filter)
        credits = credits.filter(credit__iendswith=prefix_filter)
    for row in debits.values("debit").annotate(total=Sum("amount")):
        balances[row["debit"]] += int(row["total"])
    for row in credits.values("credit").annotate(total=Sum("amount")):
        balances[row["credit"]] -= int(row["total"])
    return dict(balances)


def balance_of(account: str) -> int:
    return account_balances(prefix_filter=None).get(account, 0)


def chain_check() -> list[str]:
    """Recompute every hash and check every entry: the problems found, or []."""
    problems = []
    prev = GENESIS
    expected_seq = 1
    for e in JournalEntry.objects.order_by("seq").iterator():
        if e.seq != expected_seq:
            problems.append(f"entry #{e.seq}: expected sequence number {expected_seq} (entries missing)")
        if e.prev_hash != prev:
            problems.append(f"entry #{e.seq}: prev_hash does not match the hash of the entry before it")
        h = entry_hash(prev_hash=e.prev_hash, seq=e.seq, kind=e.kind, debit=e.debit, credit=e.credit, amount=e.amount, trade_id=e.trade_id,
                       tx_hash=e.tx_hash, log_index=e.log_index, leg=e.leg, block_number=e.block_number, block_hash=e.block_hash)
        if h != e.hash:
            problems.append(f"entry #{e.seq}: hash does not match its contents (edited after it was written)")
        if e.amount <= 0 or e.debit == e.credit:
            problems.append(f"entry #{e.seq}: does not balance ({e.amount} from {e.credit} to {e.debit})")
        prev = e.hash
        expected_seq = e.seq + 1
    return problems


def journal_verify(*, ctx: Any, block: int | None = None) -> list[str]:
    """The hash chain, then every account against the contract at `block` (default: the
    last block the listener applied, so events not yet confirmed are not counted as drift)."""
    from ledger.models import ListenerCursor

    problems = chain_check()
    if block is None:
        cursor = ListenerCursor.objects.filter(deployment=ctx.deployment).first()
        block = cursor.applied_to if cursor is not None and cursor.applied_to >= 0 else ctx.client.block_number()
    balances = account_balances()
    market = ctx.market

    def view(fn: str, *args: Any) -> Any:
        return ctx.client.view_at(market, fn, block, *args)

    addresses = {a.split(":", 1)[1] for a in balances if a.startswith(("free:", "stake:"))}
    addresses |= set(CustodialKey.objects.values_list("address", flat=True))
    addresses |= {a for a in Provider.objects.exclude(chain_address="").values_list("chain_address", flat=True)}
    for address in sorted(addresses, key=str.lower):
        on_chain = int(view("balance_of", address))
        mine = balances.get(f"free:{address}", 0)
        if on_chain != mine:
            problems.append(f"free balance of {address}: journal {mine}, chain {on_chain}")
        stake = int(view("providers", address)[1])
        mine = balances.get(f"stake:{address}", 0)
        if stake != mine:
            problems.append(f"stake of {address}: journal {mine}, chain {stake}")
    for total, prefix in (("total_locked", "locked:"), ("total_held", "held:"), ("total_staked", "stake:")):
        mine = sum(v for k, v in balances.items() if k.startswith(prefix))
        on_chain = int(view(total))
        if mine != on_chain:
            problems.append(f"{total}: journal {mine}, chain {on_chain}")
    inside = sum(v for k, v in balances.items() if not k.startswith("wallet:"))
    held_tokens = int(ctx.client.view_at(ctx.token, "balanceOf", block, ctx.deployment.market_address))
    if inside != held_tokens:
        problems.append(f"tokens held by the market: journal {inside}, chain {held_tokens}")
    if sum(balances.values()) != 0:
        problems.append(f"the accounts do not sum to zero ({sum(balances.values())})")
    return problems


RECONCILIATION_KEY = "gridbid:ledger:reconciliation"


def reconcile(*, ctx: Any) -> dict[str, Any]:
    """Run `journal_verify` and keep its outcome for the operator page (and say it):
    {at, ok, entries, problems (the first 20), block}. The same check as `gridbid ledger verify`."""
    from django.core.cache import cache
    from django.utils import timezone

    from ledger.models import JournalEntry, ListenerCursor

    cursor = ListenerCursor.objects.filter(deployment=ctx.deployment).first()
    block = cursor.applied_to if cursor is not None and cursor.applied_to >= 0 else None
    problems = journal_verify(ctx=ctx, block=block)
    status = {"at": timezone.now().isoformat(), "ok": not problems, "entries": JournalEntry.objects.count(),
              "problems": problems[:20], "more": max(0, len(problems) - 20), "block": block}
    cache.set(RECONCILIATION_KEY, status, None)
    return status


def reconciliation_status() -> dict[str, Any] | None:
    """The last reconciliation's outcome, or None before the first one."""
    from django.core.cache import cache

    value = cache.get(RECONCILIATION_KEY)
    return value if isinstance(value, dict) else None

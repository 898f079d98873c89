"""The double-entry, hash-chained journal and its verification against the chain.

Every entry moves `amount` from `credit` to `debit` (so it balances by
construction) and commits to the previous entry's hash. Entries are written
only by the listener from confirmed events (ledger/listener.py), in chain order,
so a reorg deeper than the confirmation depth removes a suffix of the chain.

An account's balance is what entered it minus what left it. `wallet:<addr>`
accounts are outside the market (they go negative as money comes in); the
others mirror the contract: `free:<addr>` = balance_of(addr), `locked:*` sums to
total_locked, `stake:<addr>` = providers(addr).stake, `held:*` sums to total_held.

The hash chain shows an entry edited after it was written, but not a journal rewritten
consistently (an entry changed and every later hash recomputed). So `journal_verify`
derives every entry again from the chain: the market's logs, read in pages of blocks, and
the calls of the record and settle transactions, mapped to legs by the same function the
listener uses (ledger/legs.py), hashed as the listener hashes them, and compared entry by
entry with the stored ones. The chain is the anchor: the first entry that differs is named.

Cost: one eth_getLogs per LOG_PAGE blocks since the deployment and one
eth_getTransactionByHash per record or settle batch, on every run. `gridbid ledger verify`
does all of it. The periodic `reconcile` (every minute) starts from a checkpoint instead:
the last entry, block and block hash its last clean run verified, kept in the cache. It
re-derives only the blocks after it, and the prefix is still covered: the whole hash chain
is recomputed every run and the checkpoint's entry must still have the hash that was
verified, so a rewrite before it breaks the anchor, and then (or after a reorg of the
checkpoint's block, or with no checkpoint) the run is a full one.
"""

from __future__ import annotations

import hashlib
import json
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

from django.db.models import Sum

from ledger.legs import CALL_OF, DerivationError, Leg, event_legs
from ledger.models import CustodialKey, JournalEntry, ListenerCursor
from providers.models import Provider

__all__ = ["GENESIS", "LOG_PAGE", "Leg", "account_balances", "balance_of", "chain_check", "entries_of", "entry_hash",
           "journal_append", "journal_truncate", "journal_verify", "reconcile", "reconciliation_status"]

GENESIS = "0" * 64
LOG_PAGE = 2000  # blocks per eth_getLogs when verify reads the chain
# what an entry says, compared with what the chain says in this order (the hashes last)
ENTRY_FIELDS = ("seq", "kind", "debit", "credit", "amount", "trade_id", "tx_hash", "log_index", "leg", "block_number", "block_hash")


def entry_hash(*, prev_hash: str, seq: int, kind: str, debit: str, credit: str, amount: int, trade_id: int | None,
               tx_hash: str, log_index: int, leg: int, block_number: int, block_hash: str) -> str:
    body = [prev_hash, seq, kind, debit, credit, amount, trade_id, tx_hash.lower(), log_index, leg, block_number, block_hash.lower()]
    return hashlib.sha256(json.dumps(body, separators=(",", ":")).encode()).hexdigest()


def entries_of(legs: Iterable[Leg], *, seq: int, prev_hash: str, tx_hash: str, log_index: int, block_number: int,
               block_hash: str) -> list[dict[str, Any]]:
    """The entries one event's legs make after entry `seq` whose hash is `prev_hash`: every
    field of a JournalEntry. A zero leg makes no entry but keeps its number in `leg`. Pure:
    what the listener writes and what verify expects."""
    out = []
    for n, leg in enumerate(legs):
        if leg.amount == 0:
            continue
        if leg.amount < 0 or leg.debit == leg.credit:
            raise ValueError(f"journal: unbalanced leg {leg}")
        seq += 1
        fields: dict[str, Any] = dict(seq=seq, kind=leg.kind, debit=leg.debit, credit=leg.credit, amount=leg.amount, trade_id=leg.trade_id,
                                      tx_hash=tx_hash, log_index=log_index, leg=n, block_number=block_number, block_hash=block_hash)
        h = entry_hash(prev_hash=prev_hash, **fields)
        out.append({**fields, "prev_hash": prev_hash, "hash": h})
        prev_hash = h
    return out


def journal_append(*, legs: Iterable[Leg], tx_hash: str, log_index: int, block_number: int, block_hash: str) -> list[JournalEntry]:
    """Append one event's legs. The caller holds the listener's lock (one writer)."""
    last = JournalEntry.objects.order_by("-seq").first()
    seq, prev = (last.seq, last.hash) if last else (0, GENESIS)
    rows = entries_of(legs, seq=seq, prev_hash=prev, tx_hash=tx_hash, log_index=log_index, block_number=block_number, block_hash=block_hash)
    return [JournalEntry.objects.create(**row) for row in rows]


def journal_truncate(*, after_block: int) -> int:
    """Drop the entries derived from blocks after `after_block` (a reorg removed them)."""
    deleted, _ = JournalEntry.objects.filter(block_number__gt=after_block).delete()
    return deleted


def account_balances(*, prefix_filter: str | None = None, up_to_block: int | None = None) -> dict[str, int]:
    """Every account's balance from the journal; with `up_to_block`, as it stood after that
    block (the listener may have applied later ones meanwhile)."""
    balances: dict[str, int] = defaultdict(int)
    entries = JournalEntry.objects.all() if up_to_block is None else JournalEntry.objects.filter(block_number__lte=up_to_block)
    debits = entries
    credits = entries
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


@dataclass(frozen=True)
class Checkpoint:
    """Where a clean re-derivation ended: entry `seq` (hash `hash`) is the last entry derived
    from blocks up to `block` (hash `block_hash`); `disputes`, the DisputeOpened args of the
    trades then in dispute (a later DisputeResolved names its buyer and provider by them)."""

    seq: int
    hash: str
    block: int
    block_hash: str
    disputes: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class _Derived:
    problems: list[str] = field(default_factory=list)
    block_hash: str | None = None
    disputes: dict[str, dict[str, Any]] = field(default_factory=dict)


def _expected(ctx: Any, *, since: Checkpoint | None, block: int, page: int, out: _Derived) -> Iterator[dict[str, Any]]:
    """Every entry the chain's events after `since` up to `block` make, in order (lazily,
    one page of logs at a time). Events whose legs cannot be derived go to `out.problems`
    and make no entry, as in the listener."""
    seq, prev = (since.seq, since.hash) if since else (0, GENESIS)
    start = since.block + 1 if since else ctx.deployment.deployed_block
    out.disputes = dict(since.disputes) if since else {}
    calls: dict[str, Any] = {}
    while start <= block:
        end = min(block, start + page - 1)
        for e in ctx.client.events(ctx.market, start, end):
            call = None
            if e.name in CALL_OF:
                key = e.tx_hash.lower()
                if key not in calls:
                    calls[key] = ctx.client.transaction_call(ctx.market, e.tx_hash)
                call = calls[key]
            trade = str(e.args.get("trade_id"))
            try:
                legs = event_legs(e.name, e.args, call=call, opened=out.disputes.get(trade))
                rows = entries_of(legs, seq=seq, prev_hash=prev, tx_hash=e.tx_hash, log_index=e.log_index,
                                  block_number=e.block_number, block_hash=e.block_hash)
            except (DerivationError, ValueError, KeyError) as exc:
                out.problems.append(f"block {e.block_number}, log {e.log_index}: {e.name}: no legs derived ({type(exc).__name__}: {exc})")
                rows = []
            if e.name == "DisputeOpened":
                out.disputes[trade] = {"buyer": e.args["buyer"], "provider": e.args["provider"]}
            elif e.name == "DisputeResolved":
                out.disputes.pop(trade, None)
            yield from rows
            if rows:
                seq, prev = rows[-1]["seq"], rows[-1]["hash"]
        start = end + 1


def _same(name: str, mine: Any, chain: Any) -> bool:
    if name in ("tx_hash", "block_hash", "hash", "prev_hash"):
        return str(mine).lower() == str(chain).lower()
    return bool(mine == chain)


def _compare(expected: Iterator[dict[str, Any]], stored: Iterator[JournalEntry], *, block: int) -> tuple[str | None, JournalEntry | None]:
    """The first stored entry that differs from what the chain says (None if none), and the
    last one that matched."""
    last = None
    for want in expected:
        got = next(stored, None)
        where = f"(tx {want['tx_hash']}, log {want['log_index']}, leg {want['leg']})"
        if got is None:
            return (f"entry #{want['seq']} is missing: the chain says {want['kind']} of {want['amount']} from {want['credit']} "
                    f"to {want['debit']} {where}"), last
        diffs = [f"{f} is {getattr(got, f)!r}, the chain says {want[f]!r}" for f in ENTRY_FIELDS if not _same(f, getattr(got, f), want[f])]
        if not diffs and not (_same("prev_hash", got.prev_hash, want["prev_hash"]) and _same("hash", got.hash, want["hash"])):
            diffs = [f"hash is {got.hash}, the chain's entries hash to {want['hash']}"]
        if diffs:
            return f"entry #{got.seq}: {'; '.join(diffs)} {where}", last
        last = got
    extra = next(stored, None)
    if extra is not None and extra.block_number <= block:
        return (f"entry #{extra.seq}: the chain has no such entry ({extra.kind} of {extra.amount} from {extra.credit} to {extra.debit}, "
                f"tx {extra.tx_hash}, log {extra.log_index}, leg {extra.leg})"), last
    return None, last


def journal_rederive(*, ctx: Any, block: int, since: Checkpoint | None = None, page: int = LOG_PAGE) -> tuple[list[str], Checkpoint | None]:
    """Derive the journal again from the chain up to `block` (after `since`, whose entry
    must still be the one verified) and compare it entry by entry with the stored one: the
    problems, and where a clean run ended (None when it found any)."""
    out = _Derived()
    stored = JournalEntry.objects.filter(seq__gt=since.seq if since else 0).order_by("seq").iterator()
    first, last = _compare(_expected(ctx, since=since, block=block, page=page, out=out), stored, block=block)
    problems = ([first] if first else []) + out.problems
    if problems:
        return problems, None
    block_hash = ctx.client.block_hash(block) if block >= 0 else None
    if block_hash is None:
        return [], None
    seq, h = (last.seq, last.hash) if last else ((since.seq, since.hash) if since else (0, GENESIS))
    return [], Checkpoint(seq=seq, hash=h, block=block, block_hash=block_hash, disputes=out.disputes)


def _checkpoint_key(ctx: Any) -> str:
    d = ctx.deployment
    return f"gridbid:ledger:verified:{d.pk}:{d.chain_id}:{d.market_address.lower()}"


def checkpoint_usable(*, ctx: Any, block: int) -> Checkpoint | None:
    """The last clean run's checkpoint, if it still anchors the journal and the chain: its
    entry has the hash it had, and its block is still canonical and not after `block`."""
    from django.core.cache import cache

    raw = cache.get(_checkpoint_key(ctx))
    if not isinstance(raw, dict):
        return None
    try:
        cp = Checkpoint(**raw)
    except TypeError:
        return None
    if cp.block > block:
        return None
    if cp.seq == 0:
        if cp.hash != GENESIS:
            return None
    elif not JournalEntry.objects.filter(seq=cp.seq, hash=cp.hash).exists():
        return None  # rewritten (or rolled back) before the checkpoint
    if ctx.client.block_hash(cp.block) != cp.block_hash:
        return None  # a reorg reached the checkpoint's block
    return cp


def _checked_block(ctx: Any, block: int | None) -> int:
    """Default: the last block the listener applied, so events not yet confirmed are not
    counted as drift."""
    if block is not None:
        return block
    cursor = ListenerCursor.objects.filter(deployment=ctx.deployment).first()
    return cursor.applied_to if cursor is not None and cursor.applied_to >= 0 else ctx.client.block_number()


def _verify(*, ctx: Any, block: int, since: Checkpoint | None, page: int) -> list[str]:
    """The hash chain, every entry re-derived from the chain (after `since`), then every
    account against the contract at `block`. A clean run leaves its checkpoint."""
    from django.core.cache import cache

    problems = chain_check()
    head = ctx.client.block_number()
    if block > head:
        # nothing at `block` can be read: the node has no such block
        return problems + [
            f"the journal is applied to block {block} but the chain's head is {head}: the chain lost blocks "
            "(a reorg, or a dev chain restarted from an older state file); the listener rolls the journal back "
            "on its next tick and the outbox sends the lost transactions again: verify again after that"]
    derived, checkpoint = journal_rederive(ctx=ctx, block=block, since=since, page=page)
    problems += derived
    if not problems and checkpoint is not None:
        cache.set(_checkpoint_key(ctx), asdict(checkpoint), None)
    return problems + balance_check(ctx=ctx, block=block)


def journal_verify(*, ctx: Any, block: int | None = None, page: int = LOG_PAGE) -> list[str]:
    """The hash chain, every entry derived again from the chain's events and calldata and
    compared (the first one that differs is named), then every account against the contract
    at `block` (default: the last block the listener applied)."""
    return _verify(ctx=ctx, block=_checked_block(ctx, block), since=None, page=page)


def balance_check(*, ctx: Any, block: int) -> list[str]:
    """Every account against the contract at `block`: free balances and stakes of every
    address the journal, custody or the providers know, the totals, the tokens held. The
    journal is read as of `block` too: on a live market the listener applies later blocks
    while a verify runs."""
    problems = []
    balances = account_balances(up_to_block=block)
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
    """The check of `gridbid ledger verify`, from the last clean run's checkpoint when it
    still anchors the journal (see the module's docstring), and keep its outcome for the
    operator page (and say it): {at, ok, entries, problems (the first 20), block, mode}."""
    from django.core.cache import cache
    from django.utils import timezone

    block = _checked_block(ctx, None)
    since = checkpoint_usable(ctx=ctx, block=block)
    problems = _verify(ctx=ctx, block=block, since=since, page=LOG_PAGE)
    status = {"at": timezone.now().isoformat(), "ok": not problems, "entries": JournalEntry.objects.count(),
              "problems": problems[:20], "more": max(0, len(problems) - 20), "block": block,
              "mode": f"from entry #{since.seq}" if since else "full"}
    cache.set(RECONCILIATION_KEY, status, None)
    return status


def reconciliation_status() -> dict[str, Any] | None:
    """The last reconciliation's outcome, or None before the first one."""
    from django.core.cache import cache

    value = cache.get(RECONCILIATION_KEY)
    return value if isinstance(value, dict) else None

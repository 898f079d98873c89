"""`ledger verify` re-derives the journal from the chain (issue 17, item 3): a journal
rewritten consistently (an entry changed, it and every later row re-hashed, so the hash
chain holds) is named at its first entry that differs from what the chain's events and the
record/settle calldata say. Against a real anvil and PostgreSQL."""

from __future__ import annotations

from typing import Any

import pytest

from tests.integration.helpers import TOKENS, fund_buyer, settled_trade

pytestmark = [pytest.mark.django_db, pytest.mark.anvil]


def _rewrite(seq: int, **changes: Any) -> None:
    """Change entry `seq` as someone with write access to the database would, and re-hash
    it and every later entry so that the hash chain stays consistent."""
    from ledger.journal import GENESIS, chain_check, entry_hash
    from ledger.models import JournalEntry

    JournalEntry.objects.filter(seq=seq).update(**changes)
    before = JournalEntry.objects.filter(seq__lt=seq).order_by("-seq").first()
    prev = before.hash if before is not None else GENESIS
    for e in JournalEntry.objects.filter(seq__gte=seq).order_by("seq"):
        h = entry_hash(prev_hash=prev, seq=e.seq, kind=e.kind, debit=e.debit, credit=e.credit, amount=e.amount, trade_id=e.trade_id,
                       tx_hash=e.tx_hash, log_index=e.log_index, leg=e.leg, block_number=e.block_number, block_hash=e.block_hash)
        JournalEntry.objects.filter(pk=e.pk).update(prev_hash=prev, hash=h)
        prev = h
    assert chain_check() == [], "the rewrite is consistent: the hash chain alone cannot tell"


@pytest.fixture
def settled(ctx: Any, buyer: Any, provider_user: Any, make_offer: Any, make_bid: Any) -> Any:
    """Deposits (the buyer's escrow, the provider's stake), a recorded batch (lock) and a
    settled one (a pay and a refund leg: half the time bought was used)."""
    from ledger.models import JournalEntry

    trade, _, _ = settled_trade(ctx, buyer, provider_user, make_offer, make_bid)
    kinds = set(JournalEntry.objects.values_list("kind", flat=True))
    assert {"deposit", "stake", "lock", "pay", "refund"} <= kinds, kinds
    return trade


def test_an_untouched_journal_passes_verify_entry_by_entry(ctx: Any, settled: Any, capsys: Any) -> None:
    from django.core.management import call_command

    from ledger.journal import journal_verify
    from ledger.models import JournalEntry

    assert journal_verify(ctx=ctx) == []
    call_command("ledger_verify")  # exits 0 (raises SystemExit otherwise)
    out = capsys.readouterr().out
    assert f"{JournalEntry.objects.count()} entries" in out and "re-derived from the chain" in out


def test_a_pay_relabelled_refund_and_rehashed_is_named_by_verify(ctx: Any, settled: Any) -> None:
    from ledger.journal import journal_verify
    from ledger.models import JournalEntry

    pay = JournalEntry.objects.get(kind="pay")
    _rewrite(pay.seq, kind="refund")
    problems = journal_verify(ctx=ctx)
    assert problems, "a relabelled entry moves no balance: only re-deriving it from the chain sees it"
    assert problems[0] == f"entry #{pay.seq}: kind is 'refund', the chain says 'pay' (tx {pay.tx_hash}, log {pay.log_index}, leg {pay.leg})"


def test_a_trade_id_changed_and_rehashed_is_named_by_verify(ctx: Any, settled: Any) -> None:
    from ledger.journal import journal_verify
    from ledger.models import JournalEntry

    lock = JournalEntry.objects.get(kind="lock")
    _rewrite(lock.seq, trade_id=settled.pk + 1000)
    problems = journal_verify(ctx=ctx)
    assert problems and problems[0].startswith(f"entry #{lock.seq}: trade_id is {settled.pk + 1000}, the chain says {settled.pk} (tx {lock.tx_hash}")


def test_verify_exits_non_zero_naming_the_relabelled_entry(ctx: Any, settled: Any, capsys: Any) -> None:
    from django.core.management import call_command

    from ledger.models import JournalEntry

    pay = JournalEntry.objects.get(kind="pay")
    _rewrite(pay.seq, kind="refund")
    with pytest.raises(SystemExit) as exit_info:
        call_command("ledger_verify")
    assert exit_info.value.code == 1
    out = capsys.readouterr().out
    assert f"DISCREPANCY entry #{pay.seq}: kind is 'refund', the chain says 'pay'" in out


def test_a_dropped_last_entry_is_named_missing(ctx: Any, settled: Any) -> None:
    from ledger.journal import journal_verify
    from ledger.models import JournalEntry

    last = JournalEntry.objects.order_by("-seq").first()
    assert last is not None
    last.delete()  # what is left is a consistent hash chain, trivially
    problems = journal_verify(ctx=ctx)
    assert problems and problems[0] == (f"entry #{last.seq} is missing: the chain says {last.kind} of {last.amount} from {last.credit} to {last.debit}"
                                        f" (tx {last.tx_hash}, log {last.log_index}, leg {last.leg})")


def test_an_entry_the_chain_never_made_is_named_extra(ctx: Any, buyer: Any) -> None:
    from ledger.journal import Leg, journal_append, journal_verify
    from ledger.models import JournalEntry

    address = fund_buyer(ctx, buyer, 9 * TOKENS)
    last = JournalEntry.objects.order_by("-seq").first()
    assert last is not None
    # appended as the listener appends, so the hash chain holds; no event on chain says it
    (forged,) = journal_append(legs=[Leg("deposit", f"free:{address}", f"wallet:{address}", TOKENS)], tx_hash=last.tx_hash,
                               log_index=last.log_index + 1, block_number=last.block_number, block_hash=last.block_hash)
    problems = journal_verify(ctx=ctx)
    assert problems and problems[0].startswith(f"entry #{forged.seq}: the chain has no such entry (deposit of {TOKENS}")


def test_verify_reads_the_logs_in_pages_of_blocks(ctx: Any, settled: Any) -> None:
    from ledger.journal import journal_verify
    from ledger.models import JournalEntry

    assert journal_verify(ctx=ctx, page=3) == [], "a page boundary inside the chain changes nothing"
    pay = JournalEntry.objects.get(kind="pay")
    _rewrite(pay.seq, kind="refund")
    assert journal_verify(ctx=ctx, page=3)[0].startswith(f"entry #{pay.seq}: kind is 'refund'")


def test_reconcile_checks_from_its_checkpoint_and_still_sees_history_rewritten_before_it(ctx: Any, settled: Any, stranger: Any) -> None:
    from ledger.journal import reconcile
    from ledger.models import JournalEntry

    first = reconcile(ctx=ctx)
    assert first["ok"] and first["mode"] == "full", first
    verified = JournalEntry.objects.count()
    fund_buyer(ctx, stranger, 5 * TOKENS)  # one more deposit: an entry after the checkpoint
    new = JournalEntry.objects.order_by("-seq").first()
    assert new is not None and new.seq == verified + 1 and new.kind == "deposit"
    _rewrite(new.seq, amount=new.amount + 1)
    second = reconcile(ctx=ctx)
    assert not second["ok"] and second["mode"] == f"from entry #{verified}", second
    assert second["problems"][0].startswith(f"entry #{new.seq}: amount is {new.amount + 1}, the chain says {new.amount}")

    _rewrite(new.seq, amount=new.amount)  # put back
    third = reconcile(ctx=ctx)
    assert third["ok"] and third["mode"] == f"from entry #{verified}", third
    pay = JournalEntry.objects.get(kind="pay")
    _rewrite(pay.seq, kind="refund")  # before the checkpoint: its anchor no longer matches
    fourth = reconcile(ctx=ctx)
    assert not fourth["ok"] and fourth["mode"] == "full", fourth
    assert fourth["problems"][0].startswith(f"entry #{pay.seq}: kind is 'refund', the chain says 'pay'")


def test_verify_says_the_chain_lost_blocks_when_the_journal_is_ahead_of_its_head(ctx: Any, buyer: Any) -> None:
    """A dev chain restarted from an older state file (or a deep reorg) leaves the listener's
    last applied block above the head: verify said so with a traceback (the node refuses a
    view at a block it does not have); now it names the blocks and what happens next."""
    from ledger.journal import journal_verify
    from ledger.models import ListenerCursor

    fund_buyer(ctx, buyer, 5 * TOKENS)
    head = ctx.client.block_number()
    ListenerCursor.objects.filter(deployment=ctx.deployment).update(applied_to=head + 5)
    problems = journal_verify(ctx=ctx)
    assert any(f"applied to block {head + 5}" in p and f"head is {head}" in p for p in problems), problems


def test_balances_are_checked_at_the_verified_block_while_the_listener_runs_ahead(ctx: Any, settled: Any) -> None:
    """Verify checks every balance at the block the listener had applied when it began. On
    a live market the listener applies more meanwhile: entries after that block are not yet
    on the chain's side of the comparison, and must not count on the journal's (a demo
    market's verify named 3 discrepancies that were only this)."""
    from ledger.journal import balance_check
    from ledger.models import JournalEntry

    lock = JournalEntry.objects.filter(kind="lock").order_by("seq").first()
    assert JournalEntry.objects.filter(block_number__gt=lock.block_number, kind__in=["pay", "refund"]).exists()
    assert balance_check(ctx=ctx, block=lock.block_number) == []

"""`gridbid ledger verify`: recompute the journal's hash chain, derive every entry again
from the chain (the market's events and the record/settle calldata, from the deployment
block on) and compare entry by entry, naming the first that differs, and compare every
account with the contract. Exit 1 on any discrepancy.

Always the full re-derivation: the periodic reconciliation checks from its last clean
checkpoint instead (ledger/journal.py says why)."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand

from ledger.context import chain_context
from ledger.journal import chain_check, journal_verify
from ledger.models import JournalEntry
from ledger.outbox import outbox_problems


class Command(BaseCommand):
    help = "Verify the ledger journal against itself and the chain; exit 1 on any discrepancy."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--block", type=int, default=None, help="Compare with the chain at this block (default: the last applied)")
        parser.add_argument("--offline", action="store_true", help="Check only the hash chain, without the chain")

    def handle(self, *args: Any, block: int | None = None, offline: bool = False, **options: Any) -> None:
        try:
            ctx = None if offline else chain_context()
            if ctx is None and not offline:
                self.stderr.write("ledger verify: no chain configured (no deployment); checking the hash chain only")
            problems = chain_check() if ctx is None else journal_verify(ctx=ctx, block=block)
            if ctx is not None:  # the outbox too: a nonce gap or a stuck transaction stalls settlement

                problems = [*problems, *outbox_problems(client=ctx.client, senders=(ctx.operator.address,))]
        except (ConnectionError, OSError) as exc:
            self.stderr.write(f"ledger verify: the chain is unreachable ({type(exc).__name__}); use --offline to check the hash chain only")
            sys.exit(2)
        for line in problems:
            self.stdout.write(f"DISCREPANCY {line}")
        count = JournalEntry.objects.count()
        if problems:
            self.stderr.write(f"ledger verify: {len(problems)} discrepancies in {count} entries")
            sys.exit(1)
        checked = "hash chain intact" if ctx is None else "hash chain intact, every entry re-derived from the chain, balances match the chain"
        self.stdout.write(f"ledger verify: {count} entries, {checked}")

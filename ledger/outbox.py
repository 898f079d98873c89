"""The operator's (and custodial keys') outgoing transactions: one nonce owner per
account, signed bytes stored before broadcast, rebroadcast and receipts until confirmed.

Idempotency: every transaction has a key (`record:<batch>`, `settle:<batch>`, ...).
`tx_submit` with a key it has seen returns the stored transaction and broadcasts
its stored bytes again, so a worker that dies between broadcast and receipt, or
between signing and broadcast, resends the *same* transaction after a restart,
never a second one. The nonce cursor's row lock serialises signers across workers;
a restarted server resumes from max(its cursor, the node's pending nonce).
No chain call happens while a database transaction is open.

Lost blocks: a confirmed transaction is final only as long as its block stays on the
chain. A reorg deeper than CHAIN_CONFIRMATIONS, or a dev chain restarted from an older
state file, takes it away; its nonce is free again and every later transaction of its
sender queues behind the gap. `txs_reopen` (each tracking pass) puts such transactions
back to sent, and the tracker sends their stored bytes again, same nonce. `outbox_problems`
names what cannot move on by itself (for `ledger verify` and `/readyz`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.utils import timezone

from ledger.chain import ChainClient, ChainError, Signer
from ledger.chain.client import Fees, NonceConsumed, SignedTx
from ledger.custody import custodial_signer
from ledger.models import ChainTx, ChainTxState, CustodialKey, NonceCursor

log = logging.getLogger("gridbid.ledger.outbox")

OPEN_STATES = (ChainTxState.SIGNED, ChainTxState.SENT, ChainTxState.MINED)
FINAL_STATES = (ChainTxState.CONFIRMED, ChainTxState.FAILED)
REORG_HORIZON = 128  # blocks: a final transaction this close to the head is checked to be still there...
RECHECK_LIMIT = 500  # ...among this many of the newest final ones (a bounded index scan, not the whole history)
STUCK_AFTER_S = 900.0  # open this long after signing: stuck (fees are raised after 90 s, 8 times)
WATCH_SENDERS = 10  # nonce gaps are looked for among at most this many senders
FEE_BUMP_AFTER_S = 90.0  # unmined this long after signing: re-sign with higher fees
FEE_BUMP_MAX = 8  # at most this many replacements (1.125 ** 8 = 2.6x the first fees, or the node's)
SignerFor = Callable[[str], Signer | None]


class NonceManager:
    """Hands out nonces for one account on one chain from a database cursor."""

    def __init__(self, *, chain_id: int, address: str) -> None:
        self.chain_id = chain_id
        self.address = address

    def reserve(self, *, chain_pending: int) -> int:
        """The next nonce, under the cursor's row lock. Call inside transaction.atomic()."""
        if not transaction.get_connection().in_atomic_block:
            raise RuntimeError("NonceManager.reserve must run inside a transaction")
        NonceCursor.objects.get_or_create(chain_id=self.chain_id, address=self.address)
        cursor = NonceCursor.objects.select_for_update().get(chain_id=self.chain_id, address=self.address)
        nonce = max(cursor.next_nonce, chain_pending)
        cursor.next_nonce = nonce + 1
        cursor.save(update_fields=["next_nonce", "updated_at"])
        return nonce


def tx_submit(*, client: ChainClient, signer: Signer, key: str, purpose: str, call: Any, gas_limit: int | None = None) -> ChainTx:
    """Sign, store, then broadcast `call` from `signer`, once per `key`.

    Raises ChainError when the call would revert (nothing is stored or sent then). With
    `gas_limit` the call is not estimated (see ChainClient.build) and so not checked.
    """
    existing = ChainTx.objects.filter(key=key).first()
    if existing is not None:
        tx_broadcast(client=client, tx=existing)
        return existing
    fields = client.build(call, signer.address, gas_limit=gas_limit)
    fees = client.fees()
    chain_pending = client.pending_nonce(signer.address)
    try:
        with transaction.atomic():
            nonce = NonceManager(chain_id=client.chain_id, address=signer.address).reserve(chain_pending=chain_pending)
            signed = client.sign(fields, nonce=nonce, fees=fees, signer=signer)
            row = ChainTx.objects.create(
                purpose=purpose, key=key, chain_id=client.chain_id, sender=signer.address, to=str(fields.get("to", "")),
                nonce=nonce, tx_hash=signed.tx_hash, raw=signed.raw, signed_at=timezone.now(),
            )
    except IntegrityError:  # a concurrent submit of the same key won
        row = ChainTx.objects.get(key=key)
    tx_broadcast(client=client, tx=row)
    return row


def tx_broadcast(*, client: ChainClient, tx: ChainTx) -> None:
    """(Re)send the stored bytes of a transaction that is not final yet."""
    if tx.state not in (ChainTxState.SIGNED, ChainTxState.SENT):
        return
    try:
        client.broadcast(SignedTx(raw=tx.raw, tx_hash=tx.tx_hash))
    except NonceConsumed as exc:
        # another transaction took this nonce: this one can never be mined
        ChainTx.objects.filter(pk=tx.pk, state__in=OPEN_STATES).update(state=ChainTxState.FAILED, error=str(exc)[:2000])
        tx.refresh_from_db()
        return
    except ChainError as exc:
        ChainTx.objects.filter(pk=tx.pk).update(error=str(exc)[:2000])
        log.warning("broadcast of %s refused: %s", tx.tx_hash, exc)
        return
    ChainTx.objects.filter(pk=tx.pk, state=ChainTxState.SIGNED).update(state=ChainTxState.SENT)
    ChainTx.objects.filter(pk=tx.pk).update(broadcasts=tx.broadcasts + 1)
    tx.refresh_from_db()


def tx_bump(*, client: ChainClient, tx: ChainTx, signer: Signer) -> ChainTx:
    """Replace a stuck transaction: the same nonce and call, fees raised by at least 12.5%
    (what nodes require of a replacement) or to what the node suggests now, whichever is
    higher. The old hash is kept: if it is mined after all, that one counts."""
    old = client.fees_of(tx.raw)
    now = client.fees()
    fees = Fees(
        max_fee_per_gas=max(now.max_fee_per_gas, old.max_fee_per_gas * 9 // 8 + 1),
        max_priority_fee_per_gas=max(now.max_priority_fee_per_gas, old.max_priority_fee_per_gas * 9 // 8 + 1),
    )
    signed = client.resign(tx.raw, fees=fees, signer=signer)
    ChainTx.objects.filter(pk=tx.pk, tx_hash=tx.tx_hash).update(
        tx_hash=signed.tx_hash, raw=signed.raw, replaced=[*tx.replaced, tx.tx_hash], fee_bumps=tx.fee_bumps + 1,
        signed_at=timezone.now(), state=ChainTxState.SIGNED,
    )
    tx.refresh_from_db()
    log.info("%s %s: fees raised to %s (bump %d), replaces %s", tx.purpose, tx.key, fees, tx.fee_bumps, tx.replaced[-1])
    tx_broadcast(client=client, tx=tx)
    return tx


def tx_track(*, client: ChainClient, tx: ChainTx, confirmations: int, signer_for: SignerFor | None = None,
             bump_after_s: float = FEE_BUMP_AFTER_S) -> ChainTx:
    """Move a transaction along signed -> sent -> mined -> confirmed/failed from its receipt.
    A mined transaction whose block was reorged out goes back to sent and is rebroadcast;
    one unmined `bump_after_s` after signing is replaced with higher fees when `signer_for`
    gives its sender's key."""
    if tx.state in (ChainTxState.CONFIRMED, ChainTxState.FAILED):
        return tx
    receipt = client.receipt(tx.tx_hash)
    if (receipt is None or receipt.confirmations == 0) and tx.replaced:
        for earlier in reversed(tx.replaced):  # a replaced version may be the one that got mined
            found = client.receipt(earlier)
            if found is not None and found.confirmations > 0:
                ChainTx.objects.filter(pk=tx.pk).update(tx_hash=earlier, replaced=[h for h in tx.replaced if h != earlier] + [tx.tx_hash])
                tx.refresh_from_db()
                receipt = found
                break
    if receipt is None or receipt.confirmations == 0:
        if tx.state == ChainTxState.MINED:
            ChainTx.objects.filter(pk=tx.pk).update(state=ChainTxState.SENT, block_number=None, block_hash="")
            tx.refresh_from_db()
        stuck = tx.signed_at is not None and timezone.now() - tx.signed_at >= timedelta(seconds=bump_after_s)
        if tx.state == ChainTxState.SENT and stuck and signer_for is not None and tx.fee_bumps < FEE_BUMP_MAX:
            signer = signer_for(tx.sender)
            if signer is not None:
                return tx_bump(client=client, tx=tx, signer=signer)
        tx_broadcast(client=client, tx=tx)
        return tx
    final = receipt.confirmations >= max(confirmations, 1)
    state = ChainTxState.MINED
    if final:
        state = ChainTxState.CONFIRMED if receipt.succeeded else ChainTxState.FAILED
    ChainTx.objects.filter(pk=tx.pk).update(
        state=state, block_number=receipt.block_number, block_hash=receipt.block_hash, gas_used=receipt.gas_used,
        error="" if receipt.succeeded else "reverted",
    )
    tx.refresh_from_db()
    return tx


def txs_track(*, client: ChainClient, confirmations: int, limit: int = 200, signer_for: SignerFor | None = None,
              bump_after_s: float = FEE_BUMP_AFTER_S, horizon: int = REORG_HORIZON) -> int:
    """Re-open final transactions the chain has lost (`txs_reopen`), then track every open
    transaction of this chain, oldest first (nonce order). Returns how many were tracked."""
    txs_reopen(client=client, horizon=horizon)
    rows = list(ChainTx.objects.filter(chain_id=client.chain_id, state__in=OPEN_STATES).order_by("id")[:limit])
    for row in rows:
        tx_track(client=client, tx=row, confirmations=confirmations, signer_for=signer_for, bump_after_s=bump_after_s)
    return len(rows)


def _mined_nonce(client: ChainClient, address: str) -> int:
    """How many transactions of `address` the chain's head holds: its next nonce on chain."""
    return int(client.rpc("eth_getTransactionCount", [address, "latest"]), 16)


def txs_reopen(*, client: ChainClient, horizon: int = REORG_HORIZON) -> list[ChainTx]:
    """Put confirmed (or reverted) transactions whose block the chain no longer holds back to
    sent, so that the tracker sends their stored bytes again with the same nonce.

    Two checks, both bounded, neither proportional to the outbox's history:

    * Block hashes, newest first, of the blocks that hold final transactions (the newest
      RECHECK_LIMIT) and lie within `horizon` blocks of today's head, or above it (a chain
      restarted from an older state file has no such block at all, however deep the loss).
      Like the listener, the walk stops at the first block still canonical: its ancestors
      are canonical too. One call per tick when nothing happened.
    * The chain's nonce for each sender with open transactions: a transaction at or above it
      cannot be on chain, however old (one call per such sender; those senders are being
      tracked anyway). This is the stall the issue saw: later transactions queued behind a
      lost one.

    Re-opening only moves the row; `tx_track` then reads the receipt (the transaction may
    sit in another block now) or broadcasts. Trades and batches are left alone: they move
    on events, which the listener rolls back and applies again once the transaction is
    mined again. The signing time restarts, so the same bytes are sent first and fees are
    raised only if they stay unmined (FEE_BUMP_AFTER_S).
    """
    head = client.block_number()
    final = ChainTx.objects.filter(chain_id=client.chain_id, state__in=FINAL_STATES, block_number__isnull=False).defer("raw", "replaced")
    lost: dict[int, ChainTx] = {}
    by_block: dict[int, list[ChainTx]] = {}
    recent = [row for row in final.order_by("-id")[:RECHECK_LIMIT] if int(row.block_number or 0) > head - horizon]
    for row in sorted(recent, key=lambda r: -int(r.block_number or 0)):
        by_block.setdefault(int(row.block_number or 0), []).append(row)
    for number, rows in by_block.items():  # newest first
        canonical = client.block_hash(number) if number <= head else None
        if all(row.block_hash == canonical for row in rows):
            break
        lost.update((row.pk, row) for row in rows if row.block_hash != canonical)
    senders = ChainTx.objects.filter(chain_id=client.chain_id, state__in=OPEN_STATES).values_list("sender", flat=True).distinct()
    for sender in sorted(set(senders)):
        mined = _mined_nonce(client, sender)
        lost.update((row.pk, row) for row in final.filter(sender=sender, nonce__gte=mined))
    reopened = []
    for row in sorted(lost.values(), key=lambda r: (r.sender, r.nonce)):
        moved = ChainTx.objects.filter(pk=row.pk, state=row.state, block_hash=row.block_hash).update(
            state=ChainTxState.SENT, block_number=None, block_hash="", error="", signed_at=timezone.now(),
        )
        if not moved:
            continue  # another tracker moved it meanwhile
        log.warning("%s %s (nonce %d) was %s in block %s, which the chain no longer holds: sending it again",
                    row.purpose, row.key, row.nonce, row.state, row.block_number)
        if not row.raw:
            log.error("%s %s (nonce %d): its signed bytes are not stored; it cannot be sent again", row.purpose, row.key, row.nonce)
        reopened.append(row)
    return reopened


def outbox_senders(*, chain_id: int | None = None, limit: int = WATCH_SENDERS) -> list[str]:
    """The senders whose nonces are worth checking: those with open transactions, then those
    of the latest final ones (a lost transaction with nothing queued behind it yet)."""
    rows = ChainTx.objects.all() if chain_id is None else ChainTx.objects.filter(chain_id=chain_id)
    out = list(dict.fromkeys(rows.filter(state__in=OPEN_STATES).order_by("id").values_list("sender", flat=True)))
    for sender in rows.filter(state__in=FINAL_STATES, block_number__isnull=False).order_by("-id").values_list("sender", flat=True)[:50]:
        if sender not in out:
            out.append(sender)
    return out[:limit]


def nonce_gaps(*, mined: dict[str, int], chain_id: int | None = None) -> list[str]:
    """Senders whose chain nonce is below a nonce the outbox believes used, where no open
    transaction would fill the nonces between: nothing the tracker does can mine them, or
    any later transaction of the sender. `mined` is each sender's next nonce on chain.

    A nonce the outbox believes used is one of an open transaction or of a final one with a
    receipt (confirmed, or reverted); one failed because another transaction took its nonce
    claims nothing."""
    rows = ChainTx.objects.all() if chain_id is None else ChainTx.objects.filter(chain_id=chain_id)
    gaps = []
    for sender, next_on_chain in mined.items():
        claims = list(rows.filter(sender=sender, nonce__gte=next_on_chain).exclude(state=ChainTxState.FAILED, block_number__isnull=True)
                      .order_by("nonce").values("nonce", "key", "state", "raw", "block_number"))
        if not claims:
            continue
        by_nonce = {c["nonce"]: c for c in claims}
        top = claims[-1]["nonce"]
        holes = []
        for nonce in range(next_on_chain, top + 1):
            claim = by_nonce.get(nonce)
            if claim is not None and claim["state"] in OPEN_STATES:
                continue
            if claim is None:
                holes.append(f"nonce {nonce}: no transaction stored; it cannot be sent again")
            elif not claim["raw"]:
                holes.append(f"nonce {nonce} ({claim['key']}): its signed bytes are not stored; it cannot be sent again")
            else:
                holes.append(f"nonce {nonce} ({claim['key']}): {claim['state']} in block {claim['block_number']}, "
                             "which the chain no longer holds; the tracker sends it again")
        if not holes:
            continue
        waiting = [c["nonce"] for c in claims if c["state"] in OPEN_STATES]
        where = f"the outbox waits at {waiting[0]}" if waiting else f"the outbox holds nonces up to {top} as mined"
        shown = holes[:5] + ([f"and {len(holes) - 5} more"] if len(holes) > 5 else [])
        gaps.append(f"nonce gap for {sender}: the chain expects nonce {next_on_chain}, {where} ({'; '.join(shown)})")
    return gaps


def outbox_problems(*, client: ChainClient, senders: tuple[str, ...] = (), stuck_after_s: float = STUCK_AFTER_S) -> list[str]:
    """What keeps the outbox of this chain from emptying by itself: transactions open longer
    than `stuck_after_s`, and nonce gaps (`nonce_gaps`) of `senders` (the operator's, say)
    and of `outbox_senders`. One chain call per sender."""
    problems = []
    now = timezone.now()
    open_rows = ChainTx.objects.filter(chain_id=client.chain_id, state__in=OPEN_STATES)
    stuck = [r for r in open_rows.order_by("id").values("key", "nonce", "state", "signed_at", "created_at")
             if (now - (r["signed_at"] or r["created_at"])).total_seconds() > stuck_after_s]
    if stuck:
        oldest = max((now - (r["signed_at"] or r["created_at"])).total_seconds() for r in stuck)
        names = ", ".join(f"{r['key']} (nonce {r['nonce']}, {r['state']})" for r in stuck[:5])
        problems.append(f"stuck outbox: {len(stuck)} transaction(s) open for over {stuck_after_s:g} s (oldest {oldest:.0f} s): {names}")
    watched = list(dict.fromkeys([*senders, *outbox_senders(chain_id=client.chain_id)]))
    problems.extend(nonce_gaps(mined={s: _mined_nonce(client, s) for s in watched}, chain_id=client.chain_id))
    return problems


def signers_of(operator: Signer) -> SignerFor:
    """The keys this server holds: the operator's and the custodial buyers'."""
    def signer_for(address: str) -> Signer | None:
        if address.lower() == operator.address.lower():
            return operator
        key = CustodialKey.objects.filter(address__iexact=address).first()
        return custodial_signer(key) if key is not None else None

    return signer_for

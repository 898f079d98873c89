"""The operator's (and custodial keys') outgoing transactions: one nonce owner per
account, signed bytes stored before broadcast, rebroadcast and receipts until confirmed.

Idempotency: every transaction has a key (`record:<batch>`, `settle:<batch>`, ...).
`tx_submit` with a key it has seen returns the stored transaction and broadcasts
its stored bytes again, so a worker that dies between broadcast and receipt, or
between signing and broadcast, resends the *same* transaction after a restart,
never a second one. The nonce cursor's row lock serialises signers across workers;
a restarted server resumes from max(its cursor, the node's pending nonce).
No chain call happens while a database transaction is open.
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
from ledger.models import ChainTx, ChainTxState, NonceCursor

log = logging.getLogger("gridbid.ledger.outbox")

OPEN_STATES = (ChainTxState.SIGNED, ChainTxState.SENT, ChainTxState.MINED)
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
              bump_after_s: float = FEE_BUMP_AFTER_S) -> int:
    """Track every open transaction of this chain, oldest first (nonce order). Returns how many."""
    rows = list(ChainTx.objects.filter(chain_id=client.chain_id, state__in=OPEN_STATES).order_by("id")[:limit])
    for row in rows:
        tx_track(client=client, tx=row, confirmations=confirmations, signer_for=signer_for, bump_after_s=bump_after_s)
    return len(rows)


def signers_of(operator: Signer) -> SignerFor:
    """The keys this server holds: the operator's and the custodial buyers'."""
    from ledger.custody import custodial_signer
    from ledger.models import CustodialKey

    def signer_for(address: str) -> Signer | None:
        if address.lower() == operator.address.lower():
            return operator
        key = CustodialKey.objects.filter(address__iexact=address).first()
        return custodial_signer(key) if key is not None else None

    return signer_for

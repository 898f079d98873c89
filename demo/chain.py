"""The demo's chain side: what real buyers and provider agents do on chain, done for the
demo accounts of `gridbid up --demo`, on the embedded dev chain only.

- Buyers get a custodial key with gas, test tokens and an escrow deposit.
- Providers get an address (a custodial key of their user) with gas and a stake, and a BLS
  key registered on chain with its proof of possession. The BLS secret is derived from the
  provider's encrypted Ethereum key, so nothing new is stored.
- Each finished demo job gets the receipt its agent would sign, and each co-signature request
  to a demo provider is answered after the leaf's Merkle proof checks out, as the agent does
  (`contracts.receipts.cosign`).

Real providers do all of this from `gridbid-agent`; nothing here runs outside the demo.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import time
from typing import Any

from django.db import transaction

from contracts import bls, receipts
from contracts.bls import BlsKey
from demo.market import BUYERS, PROVIDERS
from ledger.context import DEV_CHAIN_ID, ChainContext
from ledger.custody import custodial_key_get_or_create, custodial_signer
from ledger.models import Cosign
from ledger.outbox import tx_submit
from ledger.services import cosign_submit, escrow_deposit
from market.models import Job, User

log = logging.getLogger(__name__)

TOKEN = 10**6
GAS_WEI = 10 * 10**18
BUYER_DEPOSIT = 500_000 * TOKEN  # test tokens: enough for hours of demo trades at a round every 2 s
PROVIDER_STAKE = 500 * TOKEN


class DemoChainError(Exception):
    pass


def _require_dev_chain(ctx: ChainContext) -> None:
    if ctx.chain_id != DEV_CHAIN_ID:
        raise DemoChainError(f"the demo only acts on the dev chain ({DEV_CHAIN_ID}), not on chain {ctx.chain_id}")


def demo_bls_key(user: User) -> BlsKey:
    """The demo provider's BLS key, derived from its custodial Ethereum key."""
    secret = bytes(custodial_signer(custodial_key_get_or_create(user=user)).key)
    return _bls_key_of(hashlib.sha256(b"gridbid-demo-bls-v1" + secret).digest())


@functools.lru_cache(maxsize=64)
def _bls_key_of(seed: bytes) -> BlsKey:
    # its public key and proof of possession cost two G1/G2 multiplications (~0.3 s of
    # py-ecc), which each agents' tick paid again for each provider
    sk = bls.keygen(seed)
    return BlsKey(sk, bls.public_key(sk), bls.pop_prove(sk))


def _send(ctx: ChainContext, signer: Any, key: str, purpose: str, call: Any) -> None:
    tx = tx_submit(client=ctx.client, signer=signer, key=key, purpose=purpose, call=call)
    if not ctx.client.wait(tx.tx_hash).succeeded:
        raise DemoChainError(f"demo {purpose} transaction {tx.tx_hash} reverted")


def _mint(ctx: ChainContext, to: str, amount: int, key: str) -> None:
    _send(ctx, ctx.operator, f"demo-mint:{key}", "mint", ctx.token.functions.mint(to, amount))


def demo_chain_setup(ctx: ChainContext) -> str:
    """Fund the demo buyers' escrow and register the demo providers; idempotent (each
    transaction has an outbox key and each step checks the chain first)."""
    _require_dev_chain(ctx)
    funded = registered = 0
    for name, _ in BUYERS:
        user = User.objects.filter(username=name).first()
        if user is None:
            continue
        address = custodial_key_get_or_create(user=user).address
        if ctx.client.view(ctx.market, "balance_of", address) > 0:
            continue
        ctx.client.rpc("anvil_setBalance", [address, hex(GAS_WEI)])
        _mint(ctx, address, BUYER_DEPOSIT, f"buyer:{address}")
        tx = escrow_deposit(ctx=ctx, user=user, amount=BUYER_DEPOSIT, key=f"demo:{address}")
        if not ctx.client.wait(tx.tx_hash).succeeded:
            raise DemoChainError(f"demo deposit for {name} reverted")
        funded += 1
    for name, _, _ in PROVIDERS:
        user = User.objects.filter(username=name).select_related("provider").first()
        if user is None or not hasattr(user, "provider"):
            continue
        provider = user.provider
        signer = custodial_signer(custodial_key_get_or_create(user=user))
        bls_key = demo_bls_key(user)
        if provider.chain_address.lower() != signer.address.lower() or provider.bls_public_key != bls_key.public_key.hex():
            ctx.client.rpc("anvil_setBalance", [signer.address, hex(GAS_WEI)])
            _mint(ctx, signer.address, PROVIDER_STAKE, f"stake:{signer.address}")
            _send(ctx, signer, f"demo-approve-stake:{signer.address}", "approve",
                  ctx.token.functions.approve(ctx.deployment.market_address, PROVIDER_STAKE))
            _send(ctx, signer, f"demo-register:{signer.address}", "register", ctx.market.functions.register(
                bls.g1_to_eip2537(bls_key.public_key), bls.g2_to_eip2537(bls_key.proof_of_possession), PROVIDER_STAKE))
            provider.chain_address = signer.address
            provider.bls_public_key = bls_key.public_key.hex()
            provider.save(update_fields=["chain_address", "bls_public_key"])
            registered += 1
    return f"{funded} demo buyers funded, {registered} demo providers registered on chain"


def _receipt_of(job: Job) -> receipts.Receipt:
    trade = job.trade
    started = int((job.started_at or trade.created_at).timestamp())
    ended = max(started, int((job.ended_at or trade.created_at).timestamp()))
    return receipts.Receipt(
        trade_id=trade.pk, job_spec_hash=receipts.spec_hash(trade.bid.job_spec), started_at=started, ended_at=ended,
        gpu_seconds=int(job.gpu_seconds or 0), exit_code=job.exit_code, outputs_root=receipts.EMPTY_OUTPUTS_ROOT,
        # a stopped job ends as a preempted one does (the agent's receipt says so)
        outcome={"stopped": "preempted"}.get(str(job.state), str(job.state)) if str(job.state) in ("completed", "failed", "preempted", "stopped") else "completed",
    )


def demo_agents_act(ctx: ChainContext, *, limit: int = 20) -> dict[str, int]:
    """One tick of the demo providers' simulated agents: sign the receipts of finished
    jobs, and co-sign the settlement batches that contain them."""
    _require_dev_chain(ctx)
    names = [p[0] for p in PROVIDERS]
    keys: dict[int, BlsKey] = {}

    def key_of(user: User) -> BlsKey:
        if user.pk not in keys:
            keys[user.pk] = demo_bls_key(user)
        return keys[user.pk]

    signed = 0
    jobs = (Job.objects.filter(trade__provider__user__username__in=names, state__in=("completed", "failed", "preempted", "stopped"))
            .exclude(checkpoint__has_key="receipt").select_related("trade__bid", "trade__provider__user").order_by("id")[:limit])
    for job in jobs:
        if not job.trade.provider.bls_public_key:
            continue
        r = _receipt_of(job)
        body = {"body": r.body(), "signature": receipts.receipt_sign(r, key_of(job.trade.provider.user)),
                "digest": r.digest().hex(), "leaf": r.leaf().hex()}
        with transaction.atomic():
            locked = Job.objects.select_for_update().get(pk=job.pk)
            if "receipt" in (locked.checkpoint or {}):
                continue
            locked.checkpoint = {**(locked.checkpoint or {}), "receipt": body}
            locked.save(update_fields=["checkpoint", "updated_at"])
        signed += 1
    cosigned = 0
    for cosign in Cosign.objects.filter(signature="", provider__user__username__in=names).select_related("provider__user", "batch")[:limit]:
        req = cosign.request
        job = Job.objects.filter(trade_id=req["trade"]).first()
        receipt = (job.checkpoint or {}).get("receipt") if job else None
        if receipt is None:
            continue
        try:
            sig = receipts.cosign(
                receipt=receipts.receipt_from_body(receipt["body"]), root=bytes.fromhex(req["root"][2:]),
                proof=[bytes.fromhex(p[2:]) for p in req["proof"]], index=req["index"], chain_id=req["chain_id"],
                market=req["market"], bls_key=key_of(cosign.provider.user))
        except receipts.CosignRefused as exc:  # what a real agent does: refuse, and say why
            log.warning("demo provider %s refuses to co-sign batch %s: %s", cosign.provider_id, cosign.batch_id, exc)
            continue
        cosign_submit(cosign_id=cosign.pk, provider=cosign.provider, signature_hex=sig.hex())
        cosigned += 1
    return {"receipts": signed, "cosigned": cosigned, "at": int(time.time())}

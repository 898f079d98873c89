"""Helpers shared by the integration suites: the anvil dev accounts and money helpers, the
steps of a provider's life on chain, an in-process transport for the real agent daemon, and
a redis-server of a test's own (one it may stop)."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent_loop import tick_until
from tests.conftest import service_missing
from tests.workers import free_port  # noqa: F401 - from this worker's port band; kept here for the suites that import it

OPERATOR_KEY = "0xac0974bec39a17e36ba4a6b4d238ff944bacb478cbed5efcae784d7bf4f2ff80"
PROVIDER_KEYS = [
    "0x5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a",
    "0x7c852118294e51e653712a81e05800f419141751be58f605c371e15141b007a6",
]
TOKENS = 10**6


def mint(ctx: Any, to: str, amount: int) -> None:
    from ledger.outbox import tx_submit

    tx = tx_submit(client=ctx.client, signer=ctx.operator, key=f"mint:{to}:{amount}:{time.monotonic_ns()}", purpose="mint",
                   call=ctx.token.functions.mint(to, amount))
    assert ctx.client.wait(tx.tx_hash).succeeded


def fund_buyer(ctx: Any, user: Any, amount: int, *, journal: bool = True) -> str:
    """Mint `amount` to the user's custodial address and deposit it into escrow on chain; with
    `journal`, the listener then journals it (a bid is covered by what the journal shows free)."""
    from ledger.custody import custodial_key_get_or_create
    from ledger.services import escrow_deposit

    key = custodial_key_get_or_create(user=user)
    ctx.client.rpc("anvil_setBalance", [key.address, hex(10**20)])
    mint(ctx, key.address, amount)
    tx = escrow_deposit(ctx=ctx, user=user, amount=amount, key=f"{user.pk}:1")
    assert ctx.client.wait(tx.tx_hash).succeeded
    if journal:
        sync_chain(ctx)
    return key.address


def register_provider(ctx: Any, provider_user: Any, index: int = 0) -> Any:
    from contracts import bls
    from contracts.bls import BlsKey
    from ledger.chain import signer_from_hex
    from ledger.outbox import tx_submit

    account = signer_from_hex(PROVIDER_KEYS[index])
    sk = bls.keygen(bytes([index + 7]) * 32)
    key = BlsKey(sk, bls.public_key(sk), bls.pop_prove(sk))
    stake = 100 * TOKENS
    mint(ctx, account.address, stake)
    approve = tx_submit(client=ctx.client, signer=account, key=f"approve-stake:{account.address}", purpose="approve",
                        call=ctx.token.functions.approve(ctx.deployment.market_address, stake))
    # the register's gas estimate runs against the chain as it is: the approve must be mined first
    assert ctx.client.wait(approve.tx_hash).succeeded
    tx = tx_submit(client=ctx.client, signer=account, key=f"register:{account.address}", purpose="register",
                   call=ctx.market.functions.register(bls.g1_to_eip2537(key.public_key), bls.g2_to_eip2537(key.proof_of_possession), stake))
    assert ctx.client.wait(tx.tx_hash).succeeded
    provider = provider_user.provider
    provider.chain_address = account.address
    provider.bls_public_key = key.public_key.hex()
    provider.save()
    return key


def finish_with_receipt(trade: Any, bls_key: Any, gpu_seconds: int) -> Any:
    from contracts import receipts
    from market.models import Job

    r = receipts.Receipt(trade_id=trade.pk, job_spec_hash=receipts.spec_hash(trade.bid.job_spec), started_at=1, ended_at=2,
                         gpu_seconds=gpu_seconds, exit_code=0, outputs_root=receipts.EMPTY_OUTPUTS_ROOT, outcome="completed")
    signature = receipts.receipt_sign(r, bls_key)
    Job.objects.filter(trade=trade).update(state="completed", gpu_seconds=gpu_seconds, checkpoint={
        "receipt": {"body": r.body(), "signature": signature, "digest": r.digest().hex(), "leaf": r.leaf().hex()}})
    return r


def agents_cosign(batch: Any, keys: dict[str, Any], receipts_by_trade: dict[int, Any]) -> None:
    """What each provider's agent does: check its own leaf by Merkle proof, then sign."""
    from contracts import receipts
    from ledger.services import cosign_submit

    for cosign in batch.cosigns.select_related("provider"):
        req = cosign.request
        sig = receipts.cosign(receipt=receipts_by_trade[req["trade"]], root=bytes.fromhex(req["root"][2:]),
                              proof=[bytes.fromhex(p[2:]) for p in req["proof"]], index=req["index"],
                              chain_id=req["chain_id"], market=req["market"], bls_key=keys[cosign.address])
        cosign_submit(cosign_id=cosign.pk, provider=cosign.provider, signature_hex=sig.hex())


def chain_mined(ctx: Any, *, timeout_s: float = 30.0) -> None:
    """Wait until anvil has mined every transaction in its pool (while it mines on its own).

    anvil answers a send once the transaction is in its pool and mines it on another task:
    under a suite's load 15% of receipts were not there yet right after the send, the head
    not yet moved, for up to 137 ms (tests/FLAKES.md). Beat's next tick comes seconds later;
    a test's next line came first, and its sync saw nothing. An empty pool means the receipt
    and the head are there (0 misses in 1,022 sends under load)."""
    if not ctx.client.rpc("anvil_getAutomine"):
        return  # the test mines by hand: what is pending stays pending
    deadline = time.monotonic() + timeout_s
    while int(ctx.client.rpc("txpool_status")["pending"], 16):
        if time.monotonic() > deadline:
            pytest.fail(f"anvil still has {ctx.client.rpc('txpool_status')} after {timeout_s:g} s")
        time.sleep(0.005)


def cosigned_trade(ctx: Any, buyer: Any, provider_user: Any, make_offer: Any, make_bid: Any) -> tuple[Any, str]:
    """A trade recorded through the tasks, half its time used, its settlement batch co-signed
    and not yet sent: (trade, buyer)."""
    from ledger import tasks
    from ledger.models import SettleBatch
    from market.models import Trade
    from market.rounds import round_clear

    bls_key = register_provider(ctx, provider_user)
    buyer_address = fund_buyer(ctx, buyer, 1000 * TOKENS)
    make_offer(provider_user, price=2 * TOKENS, count=8)
    make_bid(buyer, gpus=4, max_price=3 * TOKENS, duration_s=3600)
    round_clear()
    trade = Trade.objects.get()
    tasks.trades_record.delay()
    sync_chain(ctx)
    trade.refresh_from_db()
    r = finish_with_receipt(trade, bls_key, trade.gpus * 1800)
    tasks.batches_settle.delay()
    agents_cosign(SettleBatch.objects.get(), {provider_user.provider.chain_address: bls_key}, {trade.pk: r})
    return trade, buyer_address


def settled_trade(ctx: Any, buyer: Any, provider_user: Any, make_offer: Any, make_bid: Any) -> tuple[Any, str, str]:
    """A trade recorded and settled through the tasks, half its time used: (trade, buyer, provider)."""
    from market.models import Trade

    trade, buyer_address = cosigned_trade(ctx, buyer, provider_user, make_offer, make_bid)
    settle_as_beat_does(ctx, lambda: Trade.objects.filter(pk=trade.pk, state="settled").exists())
    trade.refresh_from_db()
    return trade, buyer_address, provider_user.provider.chain_address


def settle_as_beat_does(ctx: Any, done: Any, *, passes: int = 5) -> None:
    """Send co-signed batches, track their transactions and journal their events, as beat's
    ledger ticks do, until `done()`; past `passes`, fail with where settlement stands. One
    pass settles on a quiet box; a loaded CI run once found the trade still recorded after
    one (tests/FLAKES.md), and this message says why next time."""
    from ledger import tasks

    for _ in range(passes):
        tasks.batches_settle.delay()
        sync_chain(ctx)
        if done():
            return
    pytest.fail(f"not settled after {passes} passes of settle, track and sync: {settlement_state(ctx)}")


def settlement_state(ctx: Any) -> str:
    """Where settlement stands, for a failure message: trades, batches, transactions, listener."""
    from ledger.models import ChainTx, ListenerCursor, RecordBatch, SettleBatch
    from market.models import Trade

    cursor = ListenerCursor.objects.filter(deployment=ctx.deployment).values("scanned_to", "applied_to").first()
    return (f"trades {list(Trade.objects.values_list('pk', 'state'))}; "
            f"record batches {list(RecordBatch.objects.values_list('pk', 'state', 'error'))}; "
            f"settle batches {list(SettleBatch.objects.values_list('pk', 'state', 'error'))}; "
            f"txs {list(ChainTx.objects.values_list('purpose', 'nonce', 'state', 'error', 'block_number'))}; "
            f"chain head {ctx.client.block_number()}; listener {cursor}")


def sync_chain(ctx: Any) -> Any:
    """One of beat's ledger ticks, once the chain has mined what was sent to it."""
    from ledger import tasks

    chain_mined(ctx)
    tasks.chain_txs_track.delay()
    return tasks.chain_events_sync.delay()


class DjangoTransport:
    """An httpx transport that hands each request to Django's test client (same DB transaction)."""

    def __init__(self) -> None:
        from django.test import Client

        self.client = Client()

    def handle_request(self, request):  # type: ignore[no-untyped-def]
        import httpx

        request.read()  # a streamed body (an uploaded file) is read here
        resp = self.client.generic(
            request.method, request.url.raw_path.decode(), data=request.content,
            content_type=request.headers.get("content-type", "application/json"),
            HTTP_AUTHORIZATION=request.headers.get("authorization", ""),
        )
        return httpx.Response(resp.status_code, content=resp.content, headers={"content-type": resp.get("Content-Type", "")})

    def close(self) -> None:
        pass


def drive(agent, done, timeout=20.0):
    tick_until(agent, done, timeout)


@contextlib.contextmanager
def own_redis(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """A redis-server of this test's own on a free port, so the test may stop it."""
    binary = shutil.which("redis-server")
    if binary is None:
        service_missing("redis-server is not installed")
    port = free_port()
    proc = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"redis://127.0.0.1:{port}/0"
    try:
        import redis

        deadline = time.monotonic() + 15
        while True:
            try:
                redis.Redis.from_url(url, socket_connect_timeout=1).ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    pytest.fail("redis-server did not start")
                time.sleep(0.1)
        yield proc, url
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=10)

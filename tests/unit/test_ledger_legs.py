"""ledger/legs.py: the legs of a record and a settle batch, derived from the call as the
ABI decodes it, are the locks, payments and refunds the batch was packed with
(contracts/batches.py). No chain: the calls are encoded and decoded offline."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from eth_account import Account
from web3 import Web3

from contracts import bls
from contracts.batches import Completion, TradeFill, record_args, settlement_args
from contracts.deploy import contract_at
from contracts.orders import Order, sign_order
from ledger.chain import call_decode
from ledger.legs import DerivationError, Leg, event_legs

MARKET = "0x" + "ab" * 20
MARKET_ABI = contract_at(Web3(), "GridBidMarket", MARKET)
PROVIDERS = [Account.from_key(bytes([k]) * 32).address for k in (3, 4)]
BUYERS = [Account.from_key(bytes([k]) * 32) for k in (5, 6)]


def _decoded(fn: str, *args: Any) -> Any:
    call = call_decode(MARKET_ABI, getattr(MARKET_ABI.functions, fn)(*args)._encode_transaction_data())
    assert call is not None and call.function == fn
    return call


@pytest.fixture(scope="module")
def recorded() -> Any:
    orders = [sign_order(b.key, Order(order_id=10 + i, buyer=b.address, max_price=9_000_000, gpus=8, duration=3600 * (i + 1), deadline=2**40),
                         chain_id=31337, market=MARKET) for i, b in enumerate(BUYERS)]
    fills = [TradeFill(trade_id=100, order_id=10, provider=PROVIDERS[1], price=2_000_000, gpus=3),
             TradeFill(trade_id=101, order_id=11, provider=PROVIDERS[0], price=2_500_001, gpus=1),
             TradeFill(trade_id=102, order_id=10, provider=PROVIDERS[0], price=1_999_999, gpus=5)]
    return record_args(orders, fills)


def test_a_record_call_locks_each_trade_from_its_buyer_in_position_order(recorded: Any) -> None:
    call = _decoded("record_trades", *recorded.args)
    event = {"root": "0x00", "trades": 3, "locked": sum(t.lock for t in recorded.recorded)}
    legs = event_legs("TradesRecorded", event, call=call)
    assert legs == [Leg("lock", f"locked:{t.buyer}", f"free:{t.buyer}", t.lock, t.trade_id) for t in recorded.recorded]
    assert [leg.trade_id for leg in legs] == [100, 101, 102]


def test_a_settle_call_pays_each_provider_and_refunds_each_buyer_the_rest(recorded: Any) -> None:
    keys = {p: bls.public_key(bls.keygen(bytes([i + 1]) * 32)) for i, p in enumerate(PROVIDERS)}
    used = {100: 3 * 1800, 101: 3600, 102: 0}  # half, all, nothing of the time bought
    done = [Completion(trade=t, batch=0, position=i, gpu_seconds=used[t.trade_id], digest=hashlib.sha256(bytes([i])).digest())
            for i, t in enumerate(recorded.recorded)]
    settlement = settlement_args(done, {0: recorded.recorded}, chain_id=31337, market=MARKET, keys=keys)
    call = _decoded("settle_batch", *settlement.args(b"\x00" * 256))
    paid = [c.trade.payment(c.gpu_seconds) for c in settlement.completions]
    legs = event_legs("BatchSettled", {"root": "0x00", "trades": 3, "paid": sum(paid), "refunded": 0}, call=call)
    expected = []
    for c, p in zip(settlement.completions, paid, strict=True):
        t = c.trade
        expected += [Leg("pay", f"free:{t.provider}", f"locked:{t.buyer}", p, t.trade_id),
                     Leg("refund", f"free:{t.buyer}", f"locked:{t.buyer}", t.lock - p, t.trade_id)]
    assert legs == expected
    assert paid[0] == recorded.recorded[0].lock // 2 and paid[2] == 0, "the amounts are the contract's, not a pass-through"


def test_a_call_that_disagrees_with_its_event_is_not_journaled(recorded: Any) -> None:
    call = _decoded("record_trades", *recorded.args)
    with pytest.raises(DerivationError, match="the event says 2"):
        event_legs("TradesRecorded", {"root": "0x00", "trades": 2, "locked": 1}, call=call)
    with pytest.raises(DerivationError, match="calls withdraw, not record_trades"):
        event_legs("TradesRecorded", {"root": "0x00", "trades": 3, "locked": 1}, call=_decoded("withdraw", 5))
    with pytest.raises(DerivationError, match="does not call the market directly"):
        event_legs("BatchSettled", {"root": "0x00", "trades": 1, "paid": 0, "refunded": 0}, call=None)

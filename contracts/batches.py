"""Build the arguments of ``record_trades`` and ``settle_batch`` (pure Python, no web3).

The contract stores only a Merkle root per record batch, so whoever settles,
refunds or disputes must present the trades again. ``RecordedTrade`` is a
trade exactly as locked (keep it, with its batch number and position, in the
ledger); ``settlement_args`` lays receipts out the way ``settle_batch``
rebuilds the record roots.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from eth_utils import to_checksum_address

from contracts import bls
from contracts.merkle import MerkleTree, receipt_leaf, settlement_message, trade_leaf
from contracts.orders import SignedOrder

# the contract's bounds (GridBidMarket.vy): trades and orders of one record batch; receipts,
# distinct providers and buyers, record batches touched and filler leaves of one settlement.
# Vyper reserves memory for an array argument at its bound and memory is priced
# quadratically, so the bounds are what the batches need: 128 trades, not 512, saved
# about 390 gas per trade of a 100-trade batch (tests/bench/bench_gas.py).
MAX_TRADES = 128
MAX_ORDERS = 128
MAX_SIGNERS = 64
MAX_BUYERS = 128
MAX_SEGMENTS = 16
MAX_FILLERS = 256

__all__ = [
    "MAX_BUYERS",
    "MAX_FILLERS",
    "MAX_ORDERS",
    "MAX_SEGMENTS",
    "MAX_SIGNERS",
    "MAX_TRADES",
    "Completion",
    "RecordCall",
    "RecordedTrade",
    "Settlement",
    "TradeFill",
    "packed_key",
    "record_args",
    "recorded_of",
    "settled_of",
    "settlement_args",
]

U16 = 2**16 - 1
U32 = 2**32 - 1
U64 = 2**64 - 1
U128 = 2**128 - 1


@dataclass(frozen=True, slots=True)
class TradeFill:
    """One trade of a record batch: fills ``gpus`` of an order at ``price``."""

    trade_id: int
    order_id: int
    provider: str
    price: int
    gpus: int


@dataclass(frozen=True, slots=True)
class RecordedTrade:
    trade_id: int
    buyer: str
    provider: str
    price: int
    gpus: int
    duration: int
    deadline: int

    @property
    def lock(self) -> int:
        return self.price * self.gpus * self.duration // 3600

    def payment(self, gpu_seconds: int) -> int:
        return min(self.lock, self.price * gpu_seconds // 3600)

    @property
    def leaf(self) -> bytes:
        return trade_leaf(
            self.trade_id, self.buyer, self.provider, self.price, self.gpus, self.duration, self.deadline
        )

    def as_abi(self) -> tuple[Any, ...]:
        return (
            self.trade_id,
            to_checksum_address(self.buyer),
            to_checksum_address(self.provider),
            self.price,
            self.gpus,
            self.duration,
            self.deadline,
        )


@dataclass(frozen=True, slots=True)
class RecordCall:
    """The arguments of one ``record_trades`` call and the trades it records."""

    args: tuple[Any, ...]  # (orders, providers, trades)
    recorded: list[RecordedTrade]  # recorded[i] is at position i of the batch's record tree


def record_args(orders: Sequence[SignedOrder], fills: Sequence[TradeFill]) -> RecordCall:
    """Pack a record batch: each trade is one word naming its order and its
    provider by index (providers listed once each, in order of first use)."""
    if len(fills) > MAX_TRADES or len(orders) > MAX_ORDERS:
        raise ValueError(
            f"batches: {len(fills)} trades of {len(orders)} orders in one record batch; "
            f"the contract takes at most {MAX_TRADES} and {MAX_ORDERS}"
        )
    index = {o.order.order_id: i for i, o in enumerate(orders)}
    providers: dict[str, int] = {}
    trades: list[int] = []
    recorded: list[RecordedTrade] = []
    for fill in fills:
        i = index[fill.order_id]
        order = orders[i].order
        provider = to_checksum_address(fill.provider)
        p = providers.setdefault(provider, len(providers))
        if fill.price >= 2**128 or fill.gpus >= 2**32 or fill.trade_id >= 2**64:
            raise ValueError("batches: trade id, price or gpus too large for the packed trade")
        trades.append((i << 240) | (p << 224) | (fill.trade_id << 160) | (fill.price << 32) | fill.gpus)
        recorded.append(
            RecordedTrade(
                fill.trade_id, order.buyer, provider, fill.price, fill.gpus, order.duration, order.deadline,
            )
        )
    return RecordCall(args=([o.as_abi() for o in orders], list(providers), trades), recorded=recorded)


def recorded_of(
    orders: Sequence[tuple[str, int]], providers: Sequence[str], trades: Sequence[int]
) -> list[RecordedTrade]:
    """The inverse of ``record_args``: the trades a ``record_trades`` call locks, in
    position order, from its arguments as the ABI decodes them. ``orders`` are each
    order's (buyer, terms); ``providers`` and ``trades`` as passed. The contract reads
    the same fields from the same bits (GridBidMarket.vy, ``record_trades``)."""
    out = []
    for t in trades:
        buyer, terms = orders[t >> 240]
        out.append(
            RecordedTrade(
                trade_id=(t >> 160) & U64,
                buyer=to_checksum_address(buyer),
                provider=to_checksum_address(providers[(t >> 224) & U16]),
                price=(t >> 32) & U128,
                gpus=t & U32,
                duration=(terms >> 64) & U32,
                deadline=terms & U64,
            )
        )
    return out


@dataclass(frozen=True, slots=True)
class Completion:
    """A receipt to settle: the trade, where it was recorded, and what it used."""

    trade: RecordedTrade
    batch: int
    position: int
    gpu_seconds: int
    digest: bytes


@dataclass(frozen=True, slots=True)
class Settlement:
    root: bytes
    message: bytes  # what each provider signs with BLS
    receipts: list[tuple[Any, ...]]
    buyers: list[str]
    signers: list[str]  # the providers, ascending by address
    signer_keys: list[tuple[Any, ...]]  # (address, pk0, pk1, pk2) of each signer
    coverage: list[tuple[int, int]]
    fillers: list[bytes]
    tree: MerkleTree
    completions: list[Completion]

    def args(self, aggregate_signature_eip2537: bytes) -> tuple[Any, ...]:
        return (
            self.root,
            self.receipts,
            self.buyers,
            self.signer_keys,
            aggregate_signature_eip2537,
            self.coverage,
            self.fillers,
        )


def settlement_args(
    completions: Sequence[Completion],
    record_batches: Mapping[int, Sequence[RecordedTrade]],
    *,
    chain_id: int,
    market: str,
    keys: Mapping[str, bytes],
) -> Settlement:
    """Order receipts by (batch, position), fill the record trees' other leaves,
    and compute the completion root and the message providers sign.

    ``record_batches[b]`` is the full list of trades recorded in batch ``b``;
    ``keys`` maps each provider's address to its registered BLS public key
    (48 bytes compressed, as ``bls.public_key`` makes it).
    """
    done = sorted(completions, key=lambda c: (c.batch, c.position))
    signers = sorted({to_checksum_address(c.trade.provider) for c in done}, key=lambda a: int(a, 16))
    buyers = list(dict.fromkeys(to_checksum_address(c.trade.buyer) for c in done))
    if len(done) > MAX_TRADES or len(signers) > MAX_SIGNERS or len(buyers) > MAX_BUYERS:
        raise ValueError(
            f"batches: {len(done)} receipts, {len(signers)} providers and {len(buyers)} buyers in one "
            f"settlement; the contract takes at most {MAX_TRADES}, {MAX_SIGNERS} and {MAX_BUYERS}"
        )
    by_address = {to_checksum_address(a): k for a, k in keys.items()}
    missing = [s for s in signers if s not in by_address]
    if missing:
        raise ValueError(f"batches: no BLS key for provider {missing[0]}")
    signer_index = {s: i for i, s in enumerate(signers)}
    buyer_index = {b: i for i, b in enumerate(buyers)}
    coverage: list[tuple[int, int]] = []
    fillers: list[bytes] = []
    by_batch: dict[int, set[int]] = {}
    for c in done:
        by_batch.setdefault(c.batch, set()).add(c.position)
        if record_batches[c.batch][c.position].leaf != c.trade.leaf:
            raise ValueError(f"batches: trade {c.trade.trade_id} is not at {c.batch}/{c.position}")
    for batch in sorted(by_batch):
        trades = record_batches[batch]
        coverage.append((batch, len(trades)))
        fillers.extend(t.leaf for pos, t in enumerate(trades) if pos not in by_batch[batch])
    if len(coverage) > MAX_SEGMENTS or len(fillers) > MAX_FILLERS:
        raise ValueError(
            f"batches: a settlement touching {len(coverage)} record batches with {len(fillers)} other "
            f"leaves; the contract takes at most {MAX_SEGMENTS} and {MAX_FILLERS}"
        )
    # packed Receipt: (terms, place, digest), see GridBidMarket.vy
    receipts = []
    for c in done:
        t = c.trade
        if c.gpu_seconds >= 2**64 or t.trade_id >= 2**64 or c.batch >= 2**64 or c.position >= 2**32:
            raise ValueError(f"batches: receipt of trade {t.trade_id} too large for the packed receipt")
        terms = (t.price << 128) | (t.gpus << 96) | (t.duration << 64) | t.deadline
        signer = signer_index[to_checksum_address(t.provider)]
        buyer = buyer_index[to_checksum_address(t.buyer)]
        place = (
            (c.gpu_seconds << 192) | (t.trade_id << 128) | (c.batch << 64) | (c.position << 32)
            | (signer << 16) | buyer
        )
        receipts.append((terms, place, c.digest))
    tree = MerkleTree([receipt_leaf(c.trade.trade_id, c.gpu_seconds, c.digest) for c in done])
    return Settlement(
        root=tree.root,
        message=settlement_message(tree.root, chain_id, market),
        receipts=receipts,
        buyers=buyers,
        signers=signers,
        signer_keys=[(s, *packed_key(by_address[s])) for s in signers],
        coverage=coverage,
        fillers=fillers,
        tree=tree,
        completions=done,
    )


def settled_of(
    receipts: Sequence[tuple[int, int, bytes]], buyers: Sequence[str], signers: Sequence[str]
) -> list[Completion]:
    """The inverse of ``settlement_args``: what a ``settle_batch`` call settles, in receipt
    order, from its arguments as the ABI decodes them. ``receipts`` are each receipt's
    (terms, place, digest); ``signers`` the signers' addresses. Each completion pays
    ``trade.payment(gpu_seconds)`` and refunds the rest of ``trade.lock``, as the contract does."""
    out = []
    for terms, place, digest in receipts:
        trade = RecordedTrade(
            trade_id=(place >> 128) & U64,
            buyer=to_checksum_address(buyers[place & U16]),
            provider=to_checksum_address(signers[(place >> 16) & U16]),
            price=terms >> 128,
            gpus=(terms >> 96) & U32,
            duration=(terms >> 64) & U32,
            deadline=terms & U64,
        )
        out.append(
            Completion(trade=trade, batch=(place >> 64) & U64, position=(place >> 32) & U32,
                       gpu_seconds=place >> 192, digest=bytes(digest))
        )
    return out


def packed_key(public_key: bytes) -> tuple[int, int, int]:
    """A BLS public key as ``GridBidMarket`` takes it in a ``Signer``: the
    EIP-2537 G1 encoding in three words (pk0 = x[16:32] << 128 | y[16:32]
    of the padded halves, pk1 = x[32:64], pk2 = y[32:64])."""
    eip = bls.g1_to_eip2537(public_key) if len(public_key) == 48 else bytes(public_key)
    if len(eip) != 128:
        raise ValueError("batches: a BLS public key is 48 bytes compressed or 128 bytes EIP-2537")
    word = [int.from_bytes(eip[i : i + 32], "big") for i in range(0, 128, 32)]
    return (word[0] << 128) | word[2], word[1], word[3]

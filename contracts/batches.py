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

from contracts.merkle import MerkleTree, receipt_leaf, settlement_message, trade_leaf
from contracts.orders import SignedOrder

__all__ = [
    "Completion",
    "RecordedTrade",
    "Settlement",
    "TradeFill",
    "record_args",
    "settlement_args",
]


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


def record_args(
    orders: Sequence[SignedOrder], fills: Sequence[TradeFill]
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[RecordedTrade]]:
    """``(orders_abi, trades_abi, recorded)`` for ``record_trades(orders, trades)``.

    ``recorded[i]`` is the trade at position ``i`` of the batch's record tree.
    """
    index = {o.order.order_id: i for i, o in enumerate(orders)}
    trades_abi: list[tuple[Any, ...]] = []
    recorded: list[RecordedTrade] = []
    for fill in fills:
        i = index[fill.order_id]
        order = orders[i].order
        if fill.price >= 2**128 or fill.gpus >= 2**32:
            raise ValueError("batches: price or gpus too large for the packed trade")
        # packed TradeIn: (trade_id, provider, order index << 160 | price << 32 | gpus)
        trades_abi.append(
            (fill.trade_id, to_checksum_address(fill.provider), (i << 160) | (fill.price << 32) | fill.gpus)
        )
        recorded.append(
            RecordedTrade(
                fill.trade_id, order.buyer, to_checksum_address(fill.provider), fill.price,
                fill.gpus, order.duration, order.deadline,
            )
        )
    return [o.as_abi() for o in orders], trades_abi, recorded


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
    signers: list[str]
    coverage: list[tuple[int, int]]
    fillers: list[bytes]
    tree: MerkleTree
    completions: list[Completion]

    def args(self, aggregate_signature_eip2537: bytes) -> tuple[Any, ...]:
        return (
            self.root,
            self.receipts,
            self.signers,
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
) -> Settlement:
    """Order receipts by (batch, position), fill the record trees' other leaves,
    and compute the completion root and the message providers sign.

    ``record_batches[b]`` is the full list of trades recorded in batch ``b``.
    """
    done = sorted(completions, key=lambda c: (c.batch, c.position))
    signers = sorted({to_checksum_address(c.trade.provider) for c in done}, key=lambda a: int(a, 16))
    signer_index = {s: i for i, s in enumerate(signers)}
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
    # packed Receipt: (trade_id, buyer, terms, place, digest), see GridBidMarket.vy
    receipts = []
    for c in done:
        t = c.trade
        terms = (t.price << 128) | (t.gpus << 96) | (t.duration << 64) | t.deadline
        signer = signer_index[to_checksum_address(t.provider)]
        place = (c.gpu_seconds << 128) | (signer << 96) | (c.position << 64) | c.batch
        receipts.append((t.trade_id, to_checksum_address(t.buyer), terms, place, c.digest))
    tree = MerkleTree([receipt_leaf(c.trade.trade_id, c.gpu_seconds, c.digest) for c in done])
    return Settlement(
        root=tree.root,
        message=settlement_message(tree.root, chain_id, market),
        receipts=receipts,
        signers=signers,
        coverage=coverage,
        fillers=fillers,
        tree=tree,
        completions=done,
    )

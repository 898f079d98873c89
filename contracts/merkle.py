"""Merkle trees shared by GridBidMarket.vy, the server and the provider agent.

One construction serves two trees:

* the *completion tree* of a settlement batch, whose leaves are receipts
  ``receipt_leaf(trade_id, gpu_seconds, receipt_digest)``; providers co-sign
  ``settlement_message(root, chain_id, market)`` with BLS;
* the *record tree* of a ``record_trades`` batch, whose leaves are
  ``trade_leaf(...)``; the contract stores only its root, and settlement,
  refunds and disputes prove trades against it.

Hashing (mirrored byte for byte in ``GridBidMarket.vy``):

* receipt leaf = keccak256(0x00 || abi.encode(uint256 trade_id, uint256 gpu_seconds, bytes32 digest))
* trade leaf   = keccak256(0x02 || abi.encode(uint256 trade_id, address buyer, address provider,
                                              uint256 price, uint256 gpus, uint256 duration,
                                              uint256 deadline))
* inner node   = keccak256(0x01 || left || right)

The one-byte prefixes separate leaves from inner nodes (and the two kinds of
leaf from each other), so no inner node can pass for a leaf. Pairs are
index-ordered, not sorted: position ``i`` is bound by the proof. A level with
an odd number of nodes pairs its last node with ``bytes32(0)``, so every proof
in a tree of ``n`` leaves has exactly ``ceil(log2(n))`` siblings and its
left/right turns are the bits of the index. A one-leaf tree's root is the leaf.
"""

from __future__ import annotations

from collections.abc import Sequence

from eth_abi import encode
from eth_utils import keccak, to_canonical_address

__all__ = [
    "EMPTY",
    "MerkleTree",
    "hash_pair",
    "merkle_root",
    "receipt_leaf",
    "settlement_message",
    "trade_leaf",
    "verify_proof",
]

RECEIPT_LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"
TRADE_LEAF_PREFIX = b"\x02"
SETTLEMENT_TAG = keccak(b"GridBid.settlement.v1")
EMPTY = bytes(32)


def _b32(value: bytes, name: str) -> bytes:
    if not isinstance(value, bytes | bytearray) or len(value) != 32:
        raise ValueError(f"merkle: {name} must be 32 bytes")
    return bytes(value)


def receipt_leaf(trade_id: int, gpu_seconds: int, receipt_digest: bytes) -> bytes:
    """Leaf of the completion tree for one trade's receipt."""
    return keccak(
        RECEIPT_LEAF_PREFIX
        + encode(
            ["uint256", "uint256", "bytes32"],
            [trade_id, gpu_seconds, _b32(receipt_digest, "receipt_digest")],
        )
    )


def trade_leaf(
    trade_id: int,
    buyer: str | bytes,
    provider: str | bytes,
    price: int,
    gpus: int,
    duration: int,
    deadline: int,
) -> bytes:
    """Leaf of a record tree: a trade exactly as ``record_trades`` locked it."""
    return keccak(
        TRADE_LEAF_PREFIX
        + encode(
            ["uint256", "address", "address", "uint256", "uint256", "uint256", "uint256"],
            [
                trade_id,
                to_canonical_address(buyer),
                to_canonical_address(provider),
                price,
                gpus,
                duration,
                deadline,
            ],
        )
    )


def hash_pair(left: bytes, right: bytes) -> bytes:
    return keccak(NODE_PREFIX + left + right)


def settlement_message(root: bytes, chain_id: int, market: str | bytes) -> bytes:
    """The 32 bytes every provider of a batch signs with BLS.

    It binds the completion root to one chain and one market contract, so a
    signed batch cannot be replayed on another deployment.
    """
    return keccak(
        encode(
            ["bytes32", "uint256", "address", "bytes32"],
            [SETTLEMENT_TAG, chain_id, to_canonical_address(market), _b32(root, "root")],
        )
    )


class MerkleTree:
    """An index-ordered Merkle tree over 32-byte leaves (already hashed)."""

    def __init__(self, leaves: Sequence[bytes]) -> None:
        if len(leaves) == 0:
            raise ValueError("merkle: a tree needs at least one leaf")
        level = [_b32(leaf, "leaf") for leaf in leaves]
        self.levels: list[list[bytes]] = [level]
        while len(level) > 1:
            if len(level) % 2:
                level = [*level, EMPTY]
            level = [hash_pair(level[i], level[i + 1]) for i in range(0, len(level), 2)]
            self.levels.append(level)

    def __len__(self) -> int:
        return len(self.levels[0])

    @property
    def leaves(self) -> list[bytes]:
        return list(self.levels[0])

    @property
    def root(self) -> bytes:
        return self.levels[-1][0]

    def proof(self, index: int) -> list[bytes]:
        """Siblings from the leaf up, ``ceil(log2(len))`` of them."""
        if not 0 <= index < len(self):
            raise IndexError(f"merkle: leaf index {index} out of range")
        path: list[bytes] = []
        for level in self.levels[:-1]:
            sibling = index ^ 1
            path.append(level[sibling] if sibling < len(level) else EMPTY)
            index //= 2
        return path


def merkle_root(leaves: Sequence[bytes]) -> bytes:
    return MerkleTree(leaves).root


def verify_proof(leaf: bytes, proof: Sequence[bytes], root: bytes, index: int) -> bool:
    """True when ``leaf`` sits at ``index`` of the tree with ``root``."""
    if index < 0 or index >> len(proof):
        return False
    node = _b32(leaf, "leaf")
    for sibling in proof:
        sibling = _b32(sibling, "proof node")
        node = hash_pair(sibling, node) if index & 1 else hash_pair(node, sibling)
        index >>= 1
    return node == _b32(root, "root")

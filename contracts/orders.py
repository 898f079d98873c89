"""A buyer's order as EIP-712 typed data: the buyer's on-chain consent.

The buyer signs each order once (wallet ``eth_signTypedData_v4``, or the
server's custodial key). ``GridBidMarket.record_trades`` recovers the signer
once per order per batch, whatever the number of trades that fill it, and
marks the order id used, so an order can be neither replayed nor over-filled:

* ``order_id``   unique id from the market DB; the contract keeps a bitmap of
                 used ids, and an order is consumed by the batch that fills it
                 (an unfilled remainder needs a fresh order);
* ``buyer``      the signer and the account debited;
* ``max_price``  token base units per GPU-hour; every trade's price <= it;
* ``gpus``       the trades filling the order hold at most this many GPUs in all;
* ``duration``   seconds each trade runs (the lock is price x gpus x duration / 3600);
* ``deadline``   unix time: the order can be recorded before it, the job must be
                 settled by ``deadline + grace``, else anyone can refund it.

Domain: name "GridBid", version "1", chainId, verifyingContract (the market).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eth_abi import encode
from eth_account import Account
from eth_utils import keccak, to_canonical_address, to_checksum_address

__all__ = [
    "DOMAIN_NAME",
    "DOMAIN_VERSION",
    "ORDER_TYPE",
    "Order",
    "SignedOrder",
    "domain_separator",
    "order_digest",
    "order_struct_hash",
    "recover_order_signer",
    "sign_order",
    "typed_data",
]

DOMAIN_NAME = "GridBid"
DOMAIN_VERSION = "1"
DOMAIN_TYPE = (
    "EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"
)
ORDER_TYPE = (
    "Order(uint256 orderId,address buyer,uint256 maxPrice,uint256 gpus,"
    "uint256 duration,uint256 deadline)"
)
DOMAIN_TYPEHASH = keccak(text=DOMAIN_TYPE)
ORDER_TYPEHASH = keccak(text=ORDER_TYPE)


@dataclass(frozen=True, slots=True)
class Order:
    order_id: int
    buyer: str
    max_price: int
    gpus: int
    duration: int
    deadline: int

    def __post_init__(self) -> None:
        for name in ("order_id", "max_price", "gpus", "duration", "deadline"):
            value = getattr(self, name)
            if not isinstance(value, int) or not 0 <= value < 2**256:
                raise ValueError(f"orders: {name} must be a uint256, got {value!r}")
        object.__setattr__(self, "buyer", to_checksum_address(self.buyer))


@dataclass(frozen=True, slots=True)
class SignedOrder:
    order: Order
    v: int
    r: bytes
    s: bytes

    @property
    def signature(self) -> bytes:
        return self.r + self.s + bytes([self.v])

    def as_abi(self) -> tuple[Any, ...]:
        """The packed ``SignedOrder`` struct of ``GridBidMarket.record_trades``:
        (order_id, buyer, terms, r, vs) with
        terms = max_price << 128 | gpus << 96 | duration << 64 | deadline and
        the EIP-2098 compact signature vs = (v - 27) << 255 | s."""
        o = self.order
        if o.max_price >= 2**128 or o.gpus >= 2**32 or o.duration >= 2**32 or o.deadline >= 2**64:
            raise ValueError("orders: a field is too large for the packed on-chain order")
        terms = (o.max_price << 128) | (o.gpus << 96) | (o.duration << 64) | o.deadline
        vs = ((self.v - 27) << 255) | int.from_bytes(self.s, "big")
        return (o.order_id, o.buyer, terms, self.r, vs.to_bytes(32, "big"))


def domain_separator(chain_id: int, market: str | bytes) -> bytes:
    return keccak(
        encode(
            ["bytes32", "bytes32", "bytes32", "uint256", "address"],
            [
                DOMAIN_TYPEHASH,
                keccak(text=DOMAIN_NAME),
                keccak(text=DOMAIN_VERSION),
                chain_id,
                to_canonical_address(market),
            ],
        )
    )


def order_struct_hash(order: Order) -> bytes:
    return keccak(
        encode(
            ["bytes32", "uint256", "address", "uint256", "uint256", "uint256", "uint256"],
            [
                ORDER_TYPEHASH,
                order.order_id,
                to_canonical_address(order.buyer),
                order.max_price,
                order.gpus,
                order.duration,
                order.deadline,
            ],
        )
    )


def order_digest(order: Order, *, chain_id: int, market: str | bytes) -> bytes:
    """The EIP-712 digest the buyer signs (keccak(0x1901 || domain || struct))."""
    return keccak(b"\x19\x01" + domain_separator(chain_id, market) + order_struct_hash(order))


def typed_data(order: Order, *, chain_id: int, market: str | bytes) -> dict[str, Any]:
    """The full EIP-712 message, as a browser wallet's ``eth_signTypedData_v4`` takes it."""
    return {
        "types": {
            "EIP712Domain": [
                {"name": "name", "type": "string"},
                {"name": "version", "type": "string"},
                {"name": "chainId", "type": "uint256"},
                {"name": "verifyingContract", "type": "address"},
            ],
            "Order": [
                {"name": "orderId", "type": "uint256"},
                {"name": "buyer", "type": "address"},
                {"name": "maxPrice", "type": "uint256"},
                {"name": "gpus", "type": "uint256"},
                {"name": "duration", "type": "uint256"},
                {"name": "deadline", "type": "uint256"},
            ],
        },
        "primaryType": "Order",
        "domain": {
            "name": DOMAIN_NAME,
            "version": DOMAIN_VERSION,
            "chainId": chain_id,
            "verifyingContract": to_checksum_address(market),
        },
        "message": {
            "orderId": order.order_id,
            "buyer": order.buyer,
            "maxPrice": order.max_price,
            "gpus": order.gpus,
            "duration": order.duration,
            "deadline": order.deadline,
        },
    }


def sign_order(
    private_key: bytes | str, order: Order, *, chain_id: int, market: str | bytes
) -> SignedOrder:
    """Sign ``order`` with the buyer's key; the key must belong to ``order.buyer``."""
    account = Account.from_key(private_key)
    if account.address != order.buyer:
        raise ValueError(f"orders: key of {account.address} cannot sign for {order.buyer}")
    signed = Account.unsafe_sign_hash(order_digest(order, chain_id=chain_id, market=market), private_key)
    return SignedOrder(
        order=order, v=signed.v, r=signed.r.to_bytes(32, "big"), s=signed.s.to_bytes(32, "big")
    )


def recover_order_signer(signed: SignedOrder, *, chain_id: int, market: str | bytes) -> str:
    digest = order_digest(signed.order, chain_id=chain_id, market=market)
    return str(Account._recover_hash(digest, vrs=(signed.v, signed.r, signed.s)))

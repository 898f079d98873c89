"""The one place contract tests deploy from (through contracts/deploy.py)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from web3 import Web3
from web3.contract import Contract

from contracts import bls
from contracts.batches import Completion, RecordedTrade, TradeFill, record_args, settlement_args
from contracts.compile import compile_contract
from contracts.deploy import deploy_market, deploy_token
from contracts.orders import Order, sign_order

HERE = Path(__file__).resolve().parent
PRICE = 3_600_000  # 3.6 tokens per GPU-hour: 1,000 base units per GPU-second
HOUR = 3600


def deploy_harness(w3: Web3, name: str, *args: Any, deployer: str, build_dir: Path) -> Contract:
    artifact = compile_contract(HERE / f"{name}.vy", build_dir=build_dir)
    tx = w3.eth.contract(abi=artifact["abi"], bytecode=artifact["bytecode"]).constructor(*args).transact(
        {"from": deployer}
    )
    address = w3.eth.wait_for_transaction_receipt(tx)["contractAddress"]
    return w3.eth.contract(address=address, abi=artifact["abi"])


@dataclass
class BlsKey:
    sk: int
    pk: bytes = field(init=False)
    pk_eip: bytes = field(init=False)
    pop_eip: bytes = field(init=False)

    def __post_init__(self) -> None:
        self.pk = bls.public_key(self.sk)
        self.pk_eip = bls.g1_to_eip2537(self.pk)
        self.pop_eip = bls.g2_to_eip2537(bls.pop_prove(self.sk))


def bls_key(label: str) -> BlsKey:
    return BlsKey(bls.keygen(hashlib.sha256(label.encode()).digest()))


@dataclass
class Market:
    """A deployed market, its token and the role keys that drive it."""

    w3: Web3
    token: Contract
    market: Contract
    roles: dict[str, str]
    keys: dict[str, bytes]
    bls_keys: dict[str, BlsKey]
    records: dict[int, list[RecordedTrade]] = field(default_factory=dict)
    next_id: int = 1

    @property
    def chain_id(self) -> int:
        return self.w3.eth.chain_id

    def now(self) -> int:
        return self.w3.eth.get_block("latest")["timestamp"]

    def order(self, buyer: str, *, gpus: int = 1, max_price: int = PRICE, duration: int = HOUR,
              deadline: int | None = None, order_id: int | None = None):
        if order_id is None:
            order_id = self.next_id
            self.next_id += 1
        order = Order(order_id, self.roles[buyer], max_price, gpus, duration,
                      deadline if deadline is not None else self.now() + 10 * HOUR)
        return sign_order(self.keys[buyer], order, chain_id=self.chain_id, market=self.market.address)

    def fill(self, signed, provider: str, *, gpus: int = 1, price: int = PRICE, trade_id: int | None = None):
        if trade_id is None:
            trade_id = self.next_id
            self.next_id += 1
        return TradeFill(trade_id, signed.order.order_id, self.roles[provider], price, gpus)

    def record(self, orders, fills, *, sender: str = "operator") -> tuple[int, list[RecordedTrade], dict]:
        call = record_args(orders, fills)
        recorded = call.recorded
        fn = self.market.functions.record_trades(*call.args)
        batch = fn.call({"from": self.roles[sender]})
        receipt = self.w3.eth.wait_for_transaction_receipt(fn.transact({"from": self.roles[sender]}))
        self.records[batch] = recorded
        return batch, recorded, receipt

    def settlement(self, completions: list[Completion]):
        keys = {self.roles[name]: k.pk for name, k in self.bls_keys.items() if name in self.roles}
        return settlement_args(
            completions, self.records, chain_id=self.chain_id, market=self.market.address, keys=keys
        )

    def aggregate(self, message: bytes, providers: list[str]) -> bytes:
        return bls.g2_to_eip2537(bls.aggregate([bls.sign(self.bls_keys[p].sk, message) for p in providers]))

    def provider_name(self, address: str) -> str:
        return next(name for name, a in self.roles.items() if a == address)

    def settle(self, completions: list[Completion], *, signature: bytes | None = None, sender: str = "operator"):
        s = self.settlement(completions)
        if signature is None:
            signature = self.aggregate(s.message, [self.provider_name(a) for a in s.signers])
        tx = self.market.functions.settle_batch(*s.args(signature)).transact({"from": self.roles[sender]})
        return s, self.w3.eth.wait_for_transaction_receipt(tx)


def deploy_market_fixture(w3: Web3, roles: dict[str, str], keys: dict[str, bytes],
                          bls_keys: dict[str, BlsKey], **params: int) -> Market:
    token = deploy_token(w3, roles["admin"])
    market = deploy_market(
        w3, admin=roles["admin"], token=token.address, operator=roles["operator"],
        arbiter=roles["arbiter"], **params,
    )
    m = Market(w3, token, market, roles, keys, bls_keys)
    for name in ("buyer", "buyer2", "provider", "provider2"):
        token.functions.mint(roles[name], 10**12).transact({"from": roles["admin"]})
        token.functions.approve(market.address, 2**256 - 1).transact({"from": roles[name]})
    for name in ("buyer", "buyer2"):
        market.functions.deposit(10**11).transact({"from": roles[name]})
    for name, key in bls_keys.items():
        market.functions.register(key.pk_eip, key.pop_eip, params.get("min_stake", 10**8)).transact(
            {"from": roles[name]}
        )
    return m

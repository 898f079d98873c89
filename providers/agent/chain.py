"""The settlement chain as the agent uses it: JSON-RPC over httpx, transactions signed
here with eth-account. No web3, so the agent stays light.

The agent calls few contract functions; their signatures are listed below and a unit
test checks them against the ABIs the compile step produces, so they cannot drift.

Errors carry a message fit for the provider:

* `Unreachable`: the node does not answer (or is not a JSON-RPC node);
* `Reverted`: the contract refused, with its revert string (`market: already registered`);
* `ChainError`: anything else (wrong chain, no contract, no gas).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any
from urllib.parse import urlsplit

import httpx

# name -> (signature, output types); checked against contracts/build/*.json by tests/unit/agent/test_chain.py
MARKET_FUNCTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "register": ("register(bytes,bytes,uint256)", ()),
    "withdraw": ("withdraw(uint256)", ()),
    "add_stake": ("add_stake(uint256)", ()),
    "balance_of": ("balance_of(address)", ("uint256",)),
    "providers": ("providers(address)", ("uint256", "uint256", "uint256")),
    "min_stake": ("min_stake()", ("uint256",)),
    "token": ("token()", ("address",)),
    "paused": ("paused()", ("bool",)),
}
TOKEN_FUNCTIONS: dict[str, tuple[str, tuple[str, ...]]] = {
    "approve": ("approve(address,uint256)", ("bool",)),
    "allowance": ("allowance(address,address)", ("uint256",)),
    "balanceOf": ("balanceOf(address)", ("uint256",)),
}
ERROR_STRING = bytes.fromhex("08c379a0")  # Error(string)
TOKEN_DECIMALS = 6


class ChainError(Exception):
    """Something on chain went wrong; the message says what and how to fix it."""


class Unreachable(ChainError):
    pass


class Reverted(ChainError):
    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def tokens(units: int) -> str:
    """6-decimal token base units as an exact decimal: 50000 -> '0.05'."""
    text = f"{Decimal(units) / 10**TOKEN_DECIMALS:f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def check_rpc_url(url: str) -> str:
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ChainError(f"{url!r} is not a JSON-RPC URL; give one like http://127.0.0.1:8545 or https://rpc.example")
    return url.strip()


def selector(signature: str) -> bytes:
    from eth_utils import keccak

    return keccak(text=signature)[:4]


def calldata(signature: str, *args: Any) -> bytes:
    from eth_abi import encode

    types = signature[signature.index("(") + 1 : -1]
    return selector(signature) + encode([t for t in types.split(",") if t], list(args))


def revert_reason(error: Any) -> str | None:
    """The revert string of a JSON-RPC error, None when the error is not a revert."""
    if not isinstance(error, dict):
        return None
    data = error.get("data")
    if isinstance(data, dict):
        data = data.get("data")
    if isinstance(data, str) and data.startswith("0x"):
        raw = bytes.fromhex(data[2:]) if len(data) % 2 == 0 else b""
        if raw[:4] == ERROR_STRING:
            from eth_abi import decode

            try:
                return str(decode(["string"], raw[4:])[0])
            except Exception:  # noqa: BLE001 - a malformed payload is just an unnamed revert
                return "reverted"
    message = str(error.get("message", ""))
    if "revert" in message.lower():
        reason = message.split("reverted", 1)[-1].lstrip(": ").strip()
        return reason or "reverted without a reason"
    return None


class Rpc:
    """A JSON-RPC node by URL."""

    def __init__(self, url: str, *, timeout: float = 15.0, transport: httpx.BaseTransport | None = None) -> None:
        self.url = check_rpc_url(url)
        self.http = httpx.Client(timeout=timeout, transport=transport)
        self._ids = itertools.count(1)

    def close(self) -> None:
        self.http.close()

    def call(self, method: str, params: Sequence[Any] = ()) -> Any:
        try:
            r = self.http.post(self.url, json={"jsonrpc": "2.0", "id": next(self._ids), "method": method, "params": list(params)})
        except httpx.TransportError as exc:
            raise Unreachable(f"cannot reach the chain node at {self.url} ({exc}); check it runs, or pass another with --rpc-url") from exc
        try:
            body = r.json()
        except ValueError:
            raise Unreachable(f"{self.url} answered {r.status_code} with something that is not JSON-RPC; is it a chain node?") from None
        if not isinstance(body, dict):
            raise Unreachable(f"{self.url} answered {method} with {str(body)[:100]!r}; is it a chain node?")
        if body.get("error") is not None:
            reason = revert_reason(body["error"])
            if reason is not None:
                raise Reverted(reason)
            err = body["error"]
            raise ChainError(f"the node refused {method}: {err.get('message', err) if isinstance(err, dict) else err}")
        if r.status_code >= 400 or "result" not in body:
            raise Unreachable(f"{self.url} answered {r.status_code} to {method} without a result")
        return body["result"]


@dataclass(frozen=True)
class ChainInfo:
    """What the market says about its settlement chain (GET /api/v1/ledger/chain/)."""

    chain_id: int
    market: str
    token: str
    rpc_url: str | None
    min_stake: int | None
    faucet: bool = False  # the market's dev chain gives test tokens and gas (`gridbid-agent faucet`)

    @classmethod
    def from_api(cls, body: Any) -> ChainInfo | None:
        from eth_utils import is_address, to_checksum_address

        chain = body.get("chain") if isinstance(body, dict) else None
        if chain is None:
            return None
        try:
            market, token = str(chain["market"]), str(chain["token"])
            if not (is_address(market) and is_address(token)):
                raise ValueError("bad address")
            min_stake = chain.get("min_stake")
            return cls(chain_id=int(chain["chain_id"]), market=to_checksum_address(market), token=to_checksum_address(token),
                       rpc_url=chain.get("rpc_url") or None, min_stake=int(min_stake) if min_stake is not None else None,
                       faucet=chain.get("faucet") is True)
        except (KeyError, TypeError, ValueError) as exc:
            raise ChainError(f"the market's chain description is malformed ({exc}); is the market up to date?") from None


class Market:
    """The market and token contracts on one node, for one provider account."""

    def __init__(self, rpc: Rpc, info: ChainInfo, *, sleep: Callable[[float], None] = time.sleep) -> None:
        self.rpc, self.info, self.sleep = rpc, info, sleep

    # --- reads ---
    def check(self) -> None:
        """The node is the market's chain and the market contract is there."""
        actual = int(self.rpc.call("eth_chainId"), 16)
        if actual != self.info.chain_id:
            raise ChainError(f"the node at {self.rpc.url} is chain {actual}, but the market settles on chain {self.info.chain_id}; use a node of chain {self.info.chain_id} (--rpc-url)")
        if self.rpc.call("eth_getCode", [self.info.market, "latest"]) in ("0x", "0x0", None):
            raise ChainError(f"no contract at the market address {self.info.market} on {self.rpc.url}; the node is not synced, or the market's deployment is gone")

    def _view(self, to: str, fn: tuple[str, tuple[str, ...]], *args: Any) -> tuple[Any, ...]:
        from eth_abi import decode

        raw = self.rpc.call("eth_call", [{"to": to, "data": "0x" + calldata(fn[0], *args).hex()}, "latest"])
        return tuple(decode(list(fn[1]), bytes.fromhex(str(raw)[2:])))

    def market_view(self, name: str, *args: Any) -> Any:
        out = self._view(self.info.market, MARKET_FUNCTIONS[name], *args)
        return out if len(out) != 1 else out[0]

    def token_view(self, name: str, *args: Any) -> Any:
        return self._view(self.info.token, TOKEN_FUNCTIONS[name], *args)[0]

    def eth_balance(self, address: str) -> int:
        return int(self.rpc.call("eth_getBalance", [address, "latest"]), 16)

    def registered(self, address: str) -> tuple[bool, int]:
        """(registered, stake) of a provider address in the market contract."""
        state, stake, *_ = self.market_view("providers", address)
        return int(state) != 0, int(stake)

    def min_stake(self) -> int:
        return int(self.market_view("min_stake"))

    # --- writes ---
    def transact(self, account: Any, to: str, data: bytes, *, what: str, timeout_s: float = 90.0) -> dict[str, Any]:
        """Sign and send one call from `account`; wait for its receipt. Simulated first, so a
        refusal comes back with the contract's reason and costs nothing."""
        sender = account.address
        call = {"from": sender, "to": to, "data": "0x" + data.hex()}
        self.rpc.call("eth_call", [call, "latest"])
        gas = int(self.rpc.call("eth_estimateGas", [call]), 16) * 6 // 5 + 10_000
        block = self.rpc.call("eth_getBlockByNumber", ["latest", False]) or {}
        tx: dict[str, Any] = {"to": to, "data": data, "value": 0, "gas": gas, "chainId": self.info.chain_id,
                              "nonce": int(self.rpc.call("eth_getTransactionCount", [sender, "pending"]), 16)}
        if block.get("baseFeePerGas") is not None:
            try:
                tip = int(self.rpc.call("eth_maxPriorityFeePerGas"), 16)
            except ChainError:
                tip = 10**9
            tx.update(maxFeePerGas=2 * int(block["baseFeePerGas"], 16) + tip, maxPriorityFeePerGas=tip, type=2)
            price = tx["maxFeePerGas"]
        else:
            tx["gasPrice"] = price = int(self.rpc.call("eth_gasPrice"), 16)
        have = self.eth_balance(sender)
        if have < gas * price:
            raise ChainError(f"{sender} has {have / 1e18:.6f} ETH but the {what} may cost up to {gas * price / 1e18:.6f} ETH in gas; "
                             + (f"run `gridbid-agent faucet` (this market's dev chain gives test tokens and gas), or send some ETH to {sender}"
                                if self.info.faucet else f"send some ETH to {sender}"))
        signed = account.sign_transaction(tx)
        tx_hash = self.rpc.call("eth_sendRawTransaction", ["0x" + bytes(signed.raw_transaction).hex()])
        return self.wait(str(tx_hash), what=what, timeout_s=timeout_s)

    def wait(self, tx_hash: str, *, what: str, timeout_s: float = 90.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        delay = 0.2
        while True:
            receipt = self.rpc.call("eth_getTransactionReceipt", [tx_hash])
            if receipt:
                if int(receipt.get("status", "0x0"), 16) != 1:
                    raise ChainError(f"the {what} transaction {tx_hash} failed on chain (block {int(receipt['blockNumber'], 16)})")
                return dict(receipt)
            if time.monotonic() >= deadline:
                raise ChainError(f"the {what} transaction {tx_hash} was sent but not mined within {timeout_s:.0f} s; check it later on {self.rpc.url}")
            self.sleep(delay)
            delay = min(delay * 1.5, 2.0)

    def approve(self, account: Any, amount: int) -> dict[str, Any]:
        data = calldata(TOKEN_FUNCTIONS["approve"][0], self.info.market, amount)
        return self.transact(account, self.info.token, data, what="token approval")

    def register(self, account: Any, *, pubkey_eip2537: bytes, pop_eip2537: bytes, stake: int) -> dict[str, Any]:
        data = calldata(MARKET_FUNCTIONS["register"][0], pubkey_eip2537, pop_eip2537, stake)
        return self.transact(account, self.info.market, data, what="registration")

    def add_stake(self, account: Any, amount: int) -> dict[str, Any]:
        data = calldata(MARKET_FUNCTIONS["add_stake"][0], amount)
        return self.transact(account, self.info.market, data, what="stake top-up")

    def withdraw(self, account: Any, amount: int) -> dict[str, Any]:
        data = calldata(MARKET_FUNCTIONS["withdraw"][0], amount)
        return self.transact(account, self.info.market, data, what="withdrawal")

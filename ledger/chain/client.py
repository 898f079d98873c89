"""A typed client over one JSON-RPC node: chain-id check, retries with backoff,
EIP-1559 fees, signing and raw broadcast, receipts by confirmation depth, logs.

Transactions are built, signed and broadcast in separate steps so that the caller
can store the signed bytes between signing and broadcasting (ledger/outbox.py):
broadcasting the same bytes again is harmless, signing twice is not.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import requests
from eth_abi.exceptions import DecodingError
from eth_account.signers.local import LocalAccount
from hexbytes import HexBytes
from web3 import Web3
from web3.contract import Contract
from web3.exceptions import ContractLogicError, TransactionNotFound, Web3RPCError

from contracts.deploy import contract_at

__all__ = ["ChainClient", "ChainError", "ChainIdMismatch", "ContractCall", "Fees", "LogEvent", "NonceConsumed", "Receipt", "SignedTx", "call_decode"]

log = logging.getLogger("gridbid.chain")
T = TypeVar("T")

TRANSIENT: tuple[type[BaseException], ...] = (
    requests.ConnectionError,
    requests.Timeout,
    ConnectionError,
    TimeoutError,
)


class ChainError(Exception):
    """The node refused something for a reason retrying will not change (a revert, a bad tx)."""


class ChainIdMismatch(ChainError):
    pass


class NonceConsumed(ChainError):
    """The nonce of a stored transaction was used by another transaction: it can never be mined."""


@dataclass(frozen=True, slots=True)
class Fees:
    max_fee_per_gas: int
    max_priority_fee_per_gas: int


@dataclass(frozen=True, slots=True)
class SignedTx:
    raw: str  # 0x-hex of the signed bytes
    tx_hash: str  # 0x-hex


@dataclass(frozen=True, slots=True)
class Receipt:
    tx_hash: str
    status: int
    block_number: int
    block_hash: str
    gas_used: int
    confirmations: int  # 0 when the block is no longer canonical
    logs: list[Any] = field(default_factory=list)

    @property
    def succeeded(self) -> bool:
        return self.status == 1


@dataclass(frozen=True, slots=True)
class LogEvent:
    name: str
    args: dict[str, Any]
    block_number: int
    block_hash: str
    tx_hash: str
    log_index: int


@dataclass(frozen=True, slots=True)
class ContractCall:
    """A transaction's call of a contract, decoded through the contract's ABI: arguments
    by their ABI names, structs as dicts, addresses checksummed, bytes as bytes."""

    function: str
    args: dict[str, Any]


def call_decode(contract: Contract, data: bytes | str) -> ContractCall | None:
    """The call `data` makes of `contract`, or None when it is no function of its ABI."""
    raw = HexBytes(data)
    if len(raw) < 4:
        return None
    try:
        fn, args = contract.decode_function_input(raw)
    except (ValueError, DecodingError):  # no function with its selector; arguments that do not decode
        return None
    return ContractCall(function=str(fn.abi["name"]), args=dict(args))


def _hex(value: Any) -> str:
    if isinstance(value, bytes | bytearray):
        return "0x" + bytes(value).hex()
    text = str(value)
    return text if text.startswith("0x") else "0x" + text


def _plain(value: Any) -> Any:
    """Event args as JSON-able values: bytes as 0x-hex, ints as they are."""
    if isinstance(value, bytes | bytearray):
        return "0x" + bytes(value).hex()
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


class ChainClient:
    def __init__(
        self,
        rpc_url: str,
        *,
        expected_chain_id: int | None = None,
        retries: int = 4,
        backoff_s: float = 0.2,
        request_timeout_s: float = 10.0,
    ) -> None:
        self.rpc_url = rpc_url
        self.w3 = Web3(Web3.HTTPProvider(rpc_url, request_kwargs={"timeout": request_timeout_s}))
        self.retries = retries
        self.backoff_s = backoff_s
        self._chain_id: int | None = None
        if expected_chain_id is not None:
            actual = self.chain_id
            if actual != expected_chain_id:
                raise ChainIdMismatch(f"the node at {rpc_url} is chain {actual}, expected {expected_chain_id}")

    # --- plumbing -----------------------------------------------------------------------
    def _retry(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Retry transport failures with exponential backoff and jitter; anything else is raised."""
        attempt = 0
        while True:
            try:
                return fn(*args, **kwargs)
            except TRANSIENT as exc:
                attempt += 1
                if attempt > self.retries:
                    raise
                delay = self.backoff_s * 2 ** (attempt - 1) * (0.5 + random.random())
                log.warning("chain: %s (attempt %d), retrying in %.2f s", exc, attempt, delay)
                time.sleep(delay)

    def rpc(self, method: str, params: Sequence[Any] = ()) -> Any:
        """A raw JSON-RPC call (anvil_*, evm_* in tests and the dev chain)."""
        response = self._retry(self.w3.provider.make_request, method, list(params))
        if "error" in response:
            raise ChainError(f"{method}: {response['error']}")
        return response.get("result")

    @property
    def chain_id(self) -> int:
        if self._chain_id is None:
            self._chain_id = int(self._retry(lambda: self.w3.eth.chain_id))
        return self._chain_id

    def contract(self, name: str, address: str) -> Contract:
        return contract_at(self.w3, name, address)

    # --- reads --------------------------------------------------------------------------
    def block_number(self) -> int:
        return int(self._retry(lambda: self.w3.eth.block_number))

    def block_hash(self, number: int) -> str | None:
        """The canonical hash at `number`, or None past the head."""
        try:
            block = self._retry(self.w3.eth.get_block, number)
        except Exception as exc:  # web3 raises BlockNotFound past the head
            if type(exc).__name__ == "BlockNotFound":
                return None
            raise
        return _hex(block["hash"])

    def block_timestamp(self) -> int:
        """The head block's timestamp: the chain's idea of now (contracts compare with it)."""
        return int(self._retry(self.w3.eth.get_block, "latest")["timestamp"])

    def pending_nonce(self, address: str) -> int:
        return int(self._retry(self.w3.eth.get_transaction_count, Web3.to_checksum_address(address), "pending"))

    def has_code(self, address: str) -> bool:
        return len(self.code(address)) > 0

    def code(self, address: str) -> bytes:
        return bytes(self._retry(self.w3.eth.get_code, Web3.to_checksum_address(address)))

    def eth_balance(self, address: str) -> int:
        return int(self._retry(self.w3.eth.get_balance, Web3.to_checksum_address(address)))

    def view(self, contract: Contract, fn: str, *args: Any) -> Any:
        return self._retry(getattr(contract.functions, fn)(*args).call)

    def view_at(self, contract: Contract, fn: str, block: int, *args: Any) -> Any:
        """A view call against the state after `block` (the node must keep that state)."""
        return self._retry(getattr(contract.functions, fn)(*args).call, block_identifier=block)

    # --- fees ---------------------------------------------------------------------------
    def fees(self) -> Fees:
        """EIP-1559: the node's suggested tip, and a max fee that survives two full blocks
        of base-fee growth (12.5% each), so a stored transaction stays valid a while."""
        latest = self._retry(self.w3.eth.get_block, "latest")
        base = int(latest.get("baseFeePerGas") or 0)
        try:
            tip = int(self._retry(lambda: self.w3.eth.max_priority_fee))
        except Web3RPCError:
            tip = 10**9
        return Fees(max_fee_per_gas=2 * base + tip, max_priority_fee_per_gas=tip)

    # --- transactions -------------------------------------------------------------------
    def build(self, call: Any, sender: str, *, gas_margin: float = 1.2, gas_limit: int | None = None) -> dict[str, Any]:
        """Transaction fields of a contract call, without nonce and fees. The gas estimate
        runs the call, so a call that would revert raises ChainError with its reason.

        `gas_limit` skips the estimate, for a call that can only succeed after an earlier
        transaction of the same sender is mined (a deposit after its approve): the node
        would run it against today's state and report a revert that will not happen."""
        sender = Web3.to_checksum_address(sender)
        if gas_limit is None:
            try:
                gas = int(self._retry(call.estimate_gas, {"from": sender}))
            except ContractLogicError as exc:
                raise ChainError(f"would revert: {exc.message or exc}") from None
            except Web3RPCError as exc:
                raise ChainError(f"would fail: {exc}") from None
            gas_limit = int(gas * gas_margin) + 10_000
        tx: dict[str, Any] = call.build_transaction({"from": sender, "gas": gas_limit, "nonce": 0,
                                                     "maxFeePerGas": 1, "maxPriorityFeePerGas": 1})
        tx.pop("nonce", None)
        tx.pop("maxFeePerGas", None)
        tx.pop("maxPriorityFeePerGas", None)
        tx["chainId"] = self.chain_id
        tx["type"] = 2
        return tx

    def sign(self, tx: dict[str, Any], *, nonce: int, fees: Fees, signer: LocalAccount) -> SignedTx:
        fields = {**tx, "nonce": nonce, "maxFeePerGas": fees.max_fee_per_gas, "maxPriorityFeePerGas": fees.max_priority_fee_per_gas}
        signed = signer.sign_transaction(fields)
        return SignedTx(raw=_hex(signed.raw_transaction), tx_hash=_hex(signed.hash))

    @staticmethod
    def fees_of(raw: str) -> Fees:
        """The EIP-1559 fees a signed transaction offers."""
        from eth_account.typed_transactions.typed_transaction import TypedTransaction

        fields = TypedTransaction.from_bytes(HexBytes(raw)).as_dict()
        return Fees(max_fee_per_gas=int(fields["maxFeePerGas"]), max_priority_fee_per_gas=int(fields["maxPriorityFeePerGas"]))

    def resign(self, raw: str, *, fees: Fees, signer: LocalAccount) -> SignedTx:
        """The same transaction (same nonce, call, gas) with other fees: a replacement."""
        from eth_account.typed_transactions.typed_transaction import TypedTransaction

        fields = dict(TypedTransaction.from_bytes(HexBytes(raw)).as_dict())
        for k in ("v", "r", "s"):
            fields.pop(k, None)
        fields["maxFeePerGas"] = fees.max_fee_per_gas
        fields["maxPriorityFeePerGas"] = fees.max_priority_fee_per_gas
        signed = signer.sign_transaction(fields)
        return SignedTx(raw=_hex(signed.raw_transaction), tx_hash=_hex(signed.hash))

    def broadcast(self, signed: SignedTx) -> str:
        """Send signed bytes; sending bytes the node already has (or has mined) is fine."""
        try:
            return _hex(self._retry(self.w3.eth.send_raw_transaction, HexBytes(signed.raw)))
        except Web3RPCError as exc:
            text = str(exc).lower()
            if "already known" in text or "already imported" in text or "known transaction" in text:
                return signed.tx_hash
            if "nonce too low" in text or "nonce has already been used" in text:
                if self.transaction_known(signed.tx_hash):
                    return signed.tx_hash
                raise NonceConsumed(f"nonce of {signed.tx_hash} was used by another transaction") from None
            raise ChainError(f"broadcast refused: {exc}") from None

    def transaction_known(self, tx_hash: str) -> bool:
        try:
            self._retry(self.w3.eth.get_transaction, HexBytes(tx_hash))
            return True
        except TransactionNotFound:
            return False

    def transaction_call(self, contract: Contract, tx_hash: str) -> ContractCall | None:
        """The call a mined transaction made of `contract`, decoded through its ABI; None when
        the transaction is unknown or did not call `contract` directly (another `to`)."""
        try:
            tx = self._retry(self.w3.eth.get_transaction, HexBytes(tx_hash))
        except TransactionNotFound:
            return None
        if str(tx.get("to") or "").lower() != str(contract.address).lower():
            return None
        return call_decode(contract, bytes(tx["input"]))

    def receipt(self, tx_hash: str) -> Receipt | None:
        """The receipt, with how many blocks bury it (1 = in the head block), or None if not mined."""
        try:
            raw = self._retry(self.w3.eth.get_transaction_receipt, HexBytes(tx_hash))
        except TransactionNotFound:
            return None
        number = int(raw["blockNumber"])
        block_hash = _hex(raw["blockHash"])
        canonical = self.block_hash(number) == block_hash
        depth = self.block_number() - number + 1 if canonical else 0
        return Receipt(
            tx_hash=_hex(raw["transactionHash"]),
            status=int(raw["status"]),
            block_number=number,
            block_hash=block_hash,
            gas_used=int(raw["gasUsed"]),
            confirmations=depth,
            logs=list(raw["logs"]),
        )

    def wait(self, tx_hash: str, *, confirmations: int = 1, timeout_s: float = 60.0, poll_s: float = 0.2) -> Receipt:
        """Poll until the transaction is mined and buried under `confirmations` blocks."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.receipt(tx_hash)
            if found is not None and found.confirmations >= max(confirmations, 1):
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"{tx_hash} not confirmed ({confirmations}) within {timeout_s} s")
            time.sleep(poll_s)

    # --- logs ---------------------------------------------------------------------------
    def events(self, contract: Contract, from_block: int, to_block: int) -> list[LogEvent]:
        """The contract's decoded logs in [from_block, to_block], in chain order."""
        by_topic: dict[str, Any] = {}
        for item in contract.abi:
            spec: dict[str, Any] = dict(item)
            if spec.get("type") == "event":
                event = getattr(contract.events, str(spec["name"]))()
                by_topic[_hex(event.topic).lower()] = event
        raw_logs = self._retry(
            self.w3.eth.get_logs, {"address": contract.address, "fromBlock": from_block, "toBlock": to_block}
        )
        out: list[LogEvent] = []
        for entry in raw_logs:
            if not entry["topics"]:
                continue
            event = by_topic.get(_hex(entry["topics"][0]).lower())
            if event is None:
                continue
            data = event.process_log(entry)
            out.append(
                LogEvent(
                    name=str(data["event"]),
                    args={k: _plain(v) for k, v in dict(data["args"]).items()},
                    block_number=int(entry["blockNumber"]),
                    block_hash=_hex(entry["blockHash"]),
                    tx_hash=_hex(entry["transactionHash"]),
                    log_index=int(entry["logIndex"]),
                )
            )
        out.sort(key=lambda e: (e.block_number, e.log_index))
        return out

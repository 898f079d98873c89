"""The chain the contract tests run on: an anvil of their own (Prague, so EIP-2537's BLS
precompiles are native), driven through web3 as any node, with three rules of its own.

* A send returns once its transaction is mined. anvil answers ``eth_sendTransaction`` as
  the transaction enters its pool and mines it on another task (beside a busy suite 15% of
  receipts were missing right after the send, for up to 185 ms), so a view read right after
  a send could see the state before it. `MinedOnReturn` sends through
  ``eth_sendTransactionSync`` (EIP-7966), which answers with the receipt of the mined
  transaction, and a transaction mined with status 0 raises `MinedReverted`.
* A transaction that would revert is refused before it is sent: ``.transact()`` without a
  gas limit runs ``eth_estimateGas``, which raises web3's ``ContractLogicError``
  ("execution reverted: <reason>") and mines nothing. The tests match the reason on it.
* Block times do not follow the wall clock: blocks are one second apart
  (``anvil_setBlockTimestampInterval``), `Chain.time_travel` sets the next block's time,
  and `Chain.next_timestamp` is tracked here from the receipts, not read from
  ``get_block("pending")``.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from typing import Any, cast

from eth_account import Account
from web3 import Web3
from web3.middleware import Web3Middleware
from web3.types import RPCEndpoint, RPCResponse

# anvil's default accounts: the first `ACCOUNTS` keys of this mnemonic, unlocked on the node
DEV_MNEMONIC = "test test test test test test test test test test test junk"
ACCOUNTS = 10


class MinedReverted(RuntimeError):
    """A transaction sent with a gas limit of its own (so not estimated) was mined and reverted."""


def dev_keys(count: int = ACCOUNTS) -> list[bytes]:
    """The private keys of anvil's first `count` default accounts."""
    Account.enable_unaudited_hdwallet_features()
    return [bytes(Account.from_mnemonic(DEV_MNEMONIC, account_path=f"m/44'/60'/0'/0/{i}").key)
            for i in range(count)]


class Chain:
    """One anvil, its web3, and the time of the block the next transaction lands in."""

    def __init__(self, url: str, proc: subprocess.Popen[bytes] | None = None) -> None:
        self.url, self.proc = url, proc
        # the chain id cached: web3 asks for it before every call and estimate (its
        # validation middleware), a round trip each. Nothing else: a block number means
        # another block after a revert.
        self.w3 = Web3(Web3.HTTPProvider(url, cache_allowed_requests=True,
                                         cacheable_requests={RPCEndpoint("eth_chainId")}))
        self.w3.middleware_onion.inject(_mined_on_return(self), layer=0, name="mined_on_return")
        self._next: int | None = None
        self.rpc("anvil_setBlockTimestampInterval", [1])

    def rpc(self, method: str, params: list[Any] | None = None) -> Any:
        response = self.w3.provider.make_request(RPCEndpoint(method), params or [])
        if "error" in response:
            raise RuntimeError(f"{method}: {response['error']}")
        return response["result"]

    @property
    def next_timestamp(self) -> int:
        """The timestamp of the block the next transaction lands in."""
        if self._next is None:
            self._next = int(self.w3.eth.get_block("latest")["timestamp"]) + 1
        return self._next

    def mined(self, timestamp: int | None) -> None:
        self._next = None if timestamp is None else timestamp + 1

    def time_travel(self, timestamp: int) -> None:
        """The next block (mined by the next transaction or `mine`) has this timestamp."""
        self.rpc("evm_setNextBlockTimestamp", [timestamp])
        self._next = timestamp

    def mine(self, blocks: int = 1) -> None:
        self.rpc("anvil_mine", [blocks])
        self._next = None

    def snapshot(self) -> str:
        return cast(str, self.rpc("evm_snapshot"))

    def revert(self, snapshot: str) -> None:
        """Back to `snapshot`, which anvil then forgets (as it does every later one)."""
        if self.rpc("evm_revert", [snapshot]) is not True:
            raise RuntimeError(f"anvil had no snapshot {snapshot}")
        self._next = None

    def rewind(self, snapshot: str) -> str:
        """Back to `snapshot`; returns a fresh snapshot of that state, to rewind to next time."""
        self.revert(snapshot)
        return self.snapshot()


def _mined_on_return(chain: Chain) -> Callable[[Web3], Web3Middleware]:
    class MinedOnReturn(Web3Middleware):
        """``eth_sendTransaction`` answered once the transaction is mined (see the module)."""

        def wrap_make_request(self, make_request: Any) -> Any:
            def middleware(method: RPCEndpoint, params: Any) -> RPCResponse:
                if method != "eth_sendTransaction":
                    return cast(RPCResponse, make_request(method, params))
                response = cast(RPCResponse, make_request(RPCEndpoint("eth_sendTransactionSync"), params))
                receipt = response.get("result")
                if not isinstance(receipt, dict):
                    chain.mined(None)
                    return response
                stamp = receipt.get("blockTimestamp")
                chain.mined(int(stamp, 16) if isinstance(stamp, str) else None)
                if int(receipt["status"], 16) != 1:
                    raise MinedReverted(f"transaction {receipt['transactionHash']} was mined and reverted")
                return cast(RPCResponse, {**response, "result": receipt["transactionHash"]})

            return middleware

    return MinedOnReturn

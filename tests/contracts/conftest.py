"""Contract tests on the in-process EVM (eth-tester + py-evm, Prague: EIP-2537 present).

The chain, the deployments and the BLS keys are built once per session; each
test runs between a snapshot and a revert. py-evm's BLS precompiles are pure
Python (seconds per pairing), so the tests that check signatures are few and
deliberate.
"""

from __future__ import annotations

from collections.abc import Iterator

import eth_abi as abi
import pytest
from eth_abi.exceptions import DecodingError
from eth_tester import EthereumTester, PyEVMBackend
from eth_tester.exceptions import TransactionFailed
from web3 import Web3
from web3.providers.eth_tester import EthereumTesterProvider

from tests.contracts.deployers import BlsKey, Market, bls_key, deploy_market_fixture

ROLES = ("admin", "operator", "arbiter", "buyer", "buyer2", "provider", "provider2", "stranger")

MARKET_PARAMS = {
    "min_stake": 10**8,
    "grace_period": 3600,
    "dispute_window": 86400,
    "exit_delay": 7 * 86400,
}


ESTIMATE = 8_000_000  # above any call these tests make, below the block's gas limit


class OneRunBackend(PyEVMBackend):  # type: ignore[misc]
    """py-evm that runs each transaction once. eth-tester's gas estimate is a binary search
    that ran each transaction about a dozen times (a settle cost 18 s instead of 1), and
    even one trial run doubled every BLS pairing, which is pure Python here. So the
    "estimate" is a fixed limit, and a transaction that fails raises TransactionFailed with
    its revert reason when it is sent, and is taken back out of the pending block, as if
    the estimate of a real node had refused it before it was sent."""

    def estimate_gas(self, transaction: dict, block_number: str = "latest") -> int:
        return ESTIMATE

    def send_transaction(self, transaction: dict) -> bytes:
        signed = self._get_normalized_and_signed_evm_transaction(transaction)
        pending = self.chain.header
        _block, _receipt, computation = self.chain.apply_transaction(signed)
        if computation.is_error:
            self.chain.header = pending  # the block as it was: state, nonces and transactions
            raise TransactionFailed(_revert_reason(self, computation._error))
        return signed.hash


def _revert_reason(backend: PyEVMBackend, error: Exception) -> str:
    """The reason string of an Error(string) revert, else the error itself (as eth-tester's call)."""
    if backend.is_eip838_error(error):
        try:
            return str(abi.decode(["string"], error.args[0][4:])[0])
        except DecodingError:
            pass
    return str(error)


@pytest.fixture(scope="session")
def tester() -> EthereumTester:
    return EthereumTester(OneRunBackend())


@pytest.fixture(scope="session")
def w3(tester: EthereumTester) -> Web3:
    return Web3(EthereumTesterProvider(tester))


@pytest.fixture(scope="session")
def role_keys(tester: EthereumTester) -> dict[str, bytes]:
    keys = tester.backend.account_keys
    return {name: bytes(keys[i].to_bytes() if hasattr(keys[i], "to_bytes") else keys[i])
            for i, name in enumerate(ROLES)}


@pytest.fixture(scope="session")
def roles(w3: Web3, role_keys: dict[str, bytes]) -> dict[str, str]:
    from eth_account import Account

    return {name: Account.from_key(key).address for name, key in role_keys.items()}


@pytest.fixture(scope="session")
def bls_keys() -> dict[str, BlsKey]:
    return {"provider": bls_key("provider"), "provider2": bls_key("provider2")}


@pytest.fixture(scope="session")
def session_market(w3, roles, role_keys, bls_keys, tester) -> Market:
    market = deploy_market_fixture(w3, roles, role_keys, bls_keys, **MARKET_PARAMS)
    # every test reverts to a snapshot of the latest block, and a revert re-imports that
    # block: ending on the last registration re-ran its proof-of-possession pairing (pure
    # Python, seconds) after every test. An empty block on top costs nothing to re-import.
    tester.mine_blocks()
    return market


@pytest.fixture
def m(session_market: Market, tester: EthereumTester) -> Iterator[Market]:
    snapshot = tester.take_snapshot()
    records, next_id = dict(session_market.records), session_market.next_id
    try:
        yield session_market
    finally:
        tester.revert_to_snapshot(snapshot)
        session_market.records, session_market.next_id = records, next_id


@pytest.fixture
def travel(tester: EthereumTester, w3: Web3):
    def go(seconds: int) -> None:
        tester.time_travel(w3.eth.get_block("latest")["timestamp"] + seconds)
        tester.mine_blocks()

    return go

"""Contract tests on the in-process EVM (eth-tester + py-evm, Prague: EIP-2537 present).

The chain, the deployments and the BLS keys are built once per session; each
test runs between a snapshot and a revert. py-evm's BLS precompiles are pure
Python (seconds per pairing), so the tests that check signatures are few and
deliberate.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from eth_tester import EthereumTester, PyEVMBackend
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
    """py-evm with a gas "estimate" of one run at a fixed limit: eth-tester's binary search
    runs each transaction about a dozen times, which made a settle cost 18 s instead of 1.
    A call that would revert still raises, with its reason, as the real estimate does."""

    def estimate_gas(self, transaction: dict, block_number: str = "latest") -> int:
        self.call({**transaction, "gas": ESTIMATE}, block_number)
        return ESTIMATE


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
def session_market(w3, roles, role_keys, bls_keys) -> Market:
    return deploy_market_fixture(w3, roles, role_keys, bls_keys, **MARKET_PARAMS)


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

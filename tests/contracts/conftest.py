"""Contract tests on anvil (Prague: EIP-2537's BLS precompiles are native there).

Each pytest-xdist worker starts one anvil for all the contract tests it runs (see
tests/contracts/chain.py for how sends, reverts and block times behave on it) and deploys
the market once; each test runs between a snapshot and a revert. Without anvil the tests
skip, or fail under GRIDBID_REQUIRE_SERVICES=1.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from eth_account import Account
from web3 import Web3

from tests.conftest import service_missing
from tests.contracts.chain import ACCOUNTS, Chain, dev_keys
from tests.contracts.deployers import BlsKey, Market, bls_key, deploy_market_fixture
from tests.workers import free_port

ROLES = ("admin", "operator", "arbiter", "buyer", "buyer2", "provider", "provider2", "stranger")

MARKET_PARAMS = {
    "min_stake": 10**8,
    "grace_period": 3600,
    "dispute_window": 86400,
    "exit_delay": 7 * 86400,
}


@pytest.fixture(scope="session")
def chain() -> Iterator[Chain]:
    from ledger.chain.anvil import AnvilNotFound, find_anvil, start_anvil, stop_anvil

    try:
        find_anvil()
    except AnvilNotFound as exc:
        service_missing(str(exc))
    port = free_port()
    proc = start_anvil(port=port, extra_args=["--accounts", str(ACCOUNTS)])
    try:
        yield Chain(f"http://127.0.0.1:{port}", proc)
    finally:
        stop_anvil(proc)


@pytest.fixture(scope="session")
def w3(chain: Chain) -> Web3:
    return chain.w3


@pytest.fixture(scope="session")
def account_keys(chain: Chain) -> list[bytes]:
    """The keys of the node's unlocked accounts, in its order: the roles sign orders with them."""
    keys = dev_keys()
    assert [Account.from_key(k).address for k in keys] == chain.w3.eth.accounts
    return keys


@pytest.fixture(scope="session")
def role_keys(account_keys: list[bytes]) -> dict[str, bytes]:
    return dict(zip(ROLES, account_keys, strict=False))


@pytest.fixture(scope="session")
def roles(role_keys: dict[str, bytes]) -> dict[str, str]:
    return {name: Account.from_key(key).address for name, key in role_keys.items()}


@pytest.fixture(scope="session")
def bls_keys() -> dict[str, BlsKey]:
    return {"provider": bls_key("provider"), "provider2": bls_key("provider2")}


@pytest.fixture(scope="session")
def session_market(chain: Chain, roles: dict[str, str], role_keys: dict[str, bytes],
                   bls_keys: dict[str, BlsKey]) -> Market:
    return deploy_market_fixture(chain.w3, roles, role_keys, bls_keys, **MARKET_PARAMS)


@pytest.fixture
def m(session_market: Market, chain: Chain) -> Iterator[Market]:
    snapshot = chain.snapshot()
    records, next_id = dict(session_market.records), session_market.next_id
    try:
        yield session_market
    finally:
        chain.revert(snapshot)
        session_market.records, session_market.next_id = records, next_id


@pytest.fixture
def travel(chain: Chain) -> Callable[[int], None]:
    """`seconds` past the latest block, in a block of its own."""

    def go(seconds: int) -> None:
        chain.time_travel(chain.w3.eth.get_block("latest")["timestamp"] + seconds)
        chain.mine()

    return go

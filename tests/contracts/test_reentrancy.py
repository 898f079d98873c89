"""Reentrancy through a malicious token is rejected by the market's lock.

The token re-enters the market from inside its own transfer. Each case runs first
disarmed (the control: the same call succeeds with an honest token) and then armed,
so a failure can only come from the reentrancy lock, and nothing moves: no balance
changes, no token leaves the market twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from web3.exceptions import ContractLogicError

from contracts.deploy import deploy_market
from tests.contracts.chain import Chain
from tests.contracts.deployers import deploy_harness

pytestmark = pytest.mark.anvil

WITHDRAW, DEPOSIT = 1, 2


@pytest.fixture
def evil(w3: Any, roles: dict[str, Any], chain: Chain, tmp_path: Any) -> Iterator[tuple[Any, Any]]:
    snapshot = chain.snapshot()
    try:
        token = deploy_harness(w3, "ReentrantToken", deployer=roles["admin"], build_dir=tmp_path)
        market = deploy_market(w3, admin=roles["admin"], token=token.address, operator=roles["operator"], arbiter=roles["arbiter"])
        token.functions.set_market(market.address).transact({"from": roles["admin"]})
        token.functions.mint(roles["buyer"], 10**9).transact({"from": roles["admin"]})
        token.functions.approve(market.address, 10**9).transact({"from": roles["buyer"]})
        yield token, market
    finally:
        chain.revert(snapshot)


def _state(token: Any, market: Any, buyer: str) -> tuple[int, int, int]:
    return (market.functions.balance_of(buyer).call(), token.functions.balanceOf(buyer).call(),
            token.functions.balanceOf(market.address).call())


@pytest.mark.parametrize("mode", [WITHDRAW, DEPOSIT], ids=["re-enter withdraw", "re-enter deposit"])
def test_a_deposit_that_re_enters_the_market_is_rejected(evil: tuple[Any, Any], roles: dict[str, Any], mode: int) -> None:
    token, market = evil
    buyer = roles["buyer"]
    market.functions.deposit(1000).transact({"from": buyer})  # control: an honest transfer works
    assert _state(token, market, buyer) == (1000, 10**9 - 1000, 1000)
    token.functions.arm(mode).transact({"from": roles["admin"]})
    with pytest.raises(ContractLogicError, match="revert|reentran|nonreentrant") as refused:
        market.functions.deposit(1000).transact({"from": buyer})
    assert refused.value.data == "0x", "the lock's bare revert, not another check's reason"
    assert _state(token, market, buyer) == (1000, 10**9 - 1000, 1000), "nothing moved"


@pytest.mark.parametrize("mode", [WITHDRAW, DEPOSIT], ids=["re-enter withdraw", "re-enter deposit"])
def test_a_withdrawal_that_re_enters_the_market_pays_once_or_not_at_all(evil: tuple[Any, Any], roles: dict[str, Any], mode: int) -> None:
    token, market = evil
    buyer = roles["buyer"]
    market.functions.deposit(5000).transact({"from": buyer})
    market.functions.withdraw(1000).transact({"from": buyer})  # control
    assert _state(token, market, buyer) == (4000, 10**9 - 4000, 4000)
    token.functions.arm(mode).transact({"from": roles["admin"]})
    with pytest.raises(ContractLogicError, match="revert|reentran|nonreentrant") as refused:
        market.functions.withdraw(1000).transact({"from": buyer})
    assert refused.value.data == "0x", "the lock's bare revert, not another check's reason"
    assert _state(token, market, buyer) == (4000, 10**9 - 4000, 4000), "no second payout, no lost balance"

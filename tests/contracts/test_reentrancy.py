"""Reentrancy through a malicious token is rejected by the market's lock."""

from __future__ import annotations

import pytest

from contracts.deploy import deploy_market
from tests.contracts.deployers import deploy_harness


def test_reentrancy_through_a_malicious_token_is_rejected(w3, roles, tester, tmp_path):
    snapshot = tester.take_snapshot()
    try:
        evil = deploy_harness(w3, "ReentrantToken", deployer=roles["admin"], build_dir=tmp_path)
        market = deploy_market(
            w3, admin=roles["admin"], token=evil.address, operator=roles["operator"], arbiter=roles["arbiter"]
        )
        evil.functions.set_market(market.address).transact({"from": roles["admin"]})
        evil.functions.mint(roles["buyer"], 10**9).transact({"from": roles["admin"]})
        with pytest.raises(Exception, match="market: transfer failed|revert"):
            market.functions.deposit(1000).transact({"from": roles["buyer"]})
        assert market.functions.balance_of(roles["buyer"]).call() == 0
    finally:
        tester.revert_to_snapshot(snapshot)

"""Issue 17's contract findings, each with the attack that worked before the fix:
the BLS point at infinity as a key, a proof or an aggregate; a slash unbounded by the
disputed trade; deposits and stakes of a fee-on-transfer token credited at the amount
asked for instead of the amount that arrived."""

from __future__ import annotations

from pathlib import Path

import pytest
from py_ecc.optimized_bls12_381 import curve_order
from web3.exceptions import ContractLogicError

from contracts.batches import Completion
from contracts.compile import compile_contract
from contracts.deploy import deploy_market
from contracts.merkle import MerkleTree
from tests.contracts.deployers import PRICE, BlsKey, Market, bls_key, deploy_market_fixture

pytestmark = pytest.mark.anvil

HERE = Path(__file__).resolve().parent
DIGEST = b"\x22" * 32
G1_INFINITY = b"\x00" * 128
G2_INFINITY = b"\x00" * 256


def reverts(reason: str):
    return pytest.raises(ContractLogicError, match=reason)


def send(m: Market, fn, who: str):
    receipt = m.w3.eth.wait_for_transaction_receipt(fn.transact({"from": m.roles[who]}))
    assert receipt["status"] == 1
    return receipt


def events(m: Market, receipt, name: str):
    return getattr(m.market.events, name)().process_receipt(receipt)


# ------------------------------------------------------- the point at infinity
def test_the_point_at_infinity_is_no_provider_key(m):
    with reverts("bls: key at infinity"):
        send(m, m.market.functions.register(G1_INFINITY, G2_INFINITY, 10**8), "stranger")


def test_a_proof_of_possession_at_infinity_is_refused(m, bls_keys):
    key = bls_key("a fresh provider")
    with reverts("bls: signature at infinity"):
        send(m, m.market.functions.register(key.pk_eip, G2_INFINITY, 10**8), "stranger")


def test_keys_that_cancel_in_the_aggregate_settle_nothing(chain, roles, role_keys):
    """pk under one account and -pk under another (each with a valid proof of
    possession: the holder of sk holds -sk too) sum to the point at infinity, which
    would verify any root with an all-zero signature."""
    snapshot = chain.snapshot()
    try:
        key = bls_key("canceller")
        negated = BlsKey(curve_order - key.sk)
        m = deploy_market_fixture(chain.w3, roles, role_keys, {"provider": key, "provider2": negated},
                                  min_stake=0, grace_period=3600, dispute_window=86400, exit_delay=7 * 86400)
        o1, o2 = m.order("buyer"), m.order("buyer2")
        batch, recorded, _ = m.record([o1, o2], [m.fill(o1, "provider"), m.fill(o2, "provider2")])
        completions = [Completion(recorded[0], batch, 0, 3600, DIGEST), Completion(recorded[1], batch, 1, 3600, DIGEST)]
        with reverts("bls: key at infinity"):
            m.settle(completions, signature=G2_INFINITY)
        assert m.market.functions.trade_status(recorded[0].trade_id).call() == 1  # still open
    finally:
        chain.revert(snapshot)


def test_the_verifier_refuses_infinity_on_either_side(m, bls_keys):
    verifier = m.w3.eth.contract(address=m.market.functions.bls_verifier().call(),
                                 abi=compile_contract(HERE.parent.parent / "contracts/BlsVerifier.vy")["abi"])
    with reverts("bls: key at infinity"):
        verifier.functions.verify(G1_INFINITY, b"\x01" * 32, G2_INFINITY).call()
    with reverts("bls: signature at infinity"):
        verifier.functions.verify(bls_keys["provider"].pk_eip, b"\x01" * 32, G2_INFINITY).call()
    with reverts("bls: key at infinity"):
        verifier.functions.pop_verify(G1_INFINITY, bls_keys["provider"].pop_eip).call()


# ------------------------------------------------------------- bounded slash
def _settled_and_disputed(m: Market) -> tuple[int, int]:
    """One trade of PRICE for an hour, half used (it paid PRICE // 2), disputed by its buyer."""
    o = m.order("buyer")
    batch, recorded, _ = m.record([o], [m.fill(o, "provider")])
    s, _ = m.settle([Completion(recorded[0], batch, 0, 1800, DIGEST)])
    t = recorded[0]
    record_tree = MerkleTree([x.leaf for x in recorded])
    send(m, m.market.functions.dispute(t.as_abi(), batch, 0, record_tree.proof(0), 1800, DIGEST, s.root, 0, s.tree.proof(0)), "buyer")
    return t.trade_id, PRICE // 2


def test_a_slash_is_bounded_by_twice_what_the_trade_paid(m):
    trade_id, paid = _settled_and_disputed(m)
    stake = m.market.functions.providers(m.roles["provider"]).call()[1]
    assert stake > 10 * paid  # the stake alone would not bound it
    with reverts("market: slash above 2x the trade's pay"):
        send(m, m.market.functions.resolve_dispute(trade_id, False, 2 * paid + 1), "arbiter")
    r = send(m, m.market.functions.resolve_dispute(trade_id, False, 2 * paid), "arbiter")
    assert events(m, r, "DisputeResolved")[0]["args"]["slashed"] == 2 * paid
    assert m.market.functions.providers(m.roles["provider"]).call()[1] == stake - 2 * paid


def test_the_slash_bound_is_in_the_contracts_natspec():
    source = (HERE.parent.parent / "contracts/GridBidMarket.vy").read_text()
    doc = source.split("def resolve_dispute", 1)[1].split('"""')[1]
    assert "MAX_SLASH_MULTIPLE" in doc and "2" in doc


# ------------------------------------------------------ fee-on-transfer tokens
@pytest.fixture
def fee_market(chain, roles, role_keys, bls_keys):
    snapshot = chain.snapshot()
    w3 = chain.w3
    artifact = compile_contract(HERE / "FeeToken.vy")
    tx = w3.eth.contract(abi=artifact["abi"], bytecode=artifact["bytecode"]).constructor().transact({"from": roles["admin"]})
    token = w3.eth.contract(address=w3.eth.wait_for_transaction_receipt(tx)["contractAddress"], abi=artifact["abi"])
    market = deploy_market(w3, admin=roles["admin"], token=token.address, operator=roles["operator"],
                           arbiter=roles["arbiter"], min_stake=10**6)
    for name in ("buyer", "provider"):
        token.functions.mint(roles[name], 10**12).transact({"from": roles["admin"]})
        token.functions.approve(market.address, 2**256 - 1).transact({"from": roles[name]})
    try:
        yield Market(w3, token, market, roles, role_keys, bls_keys)
    finally:
        chain.revert(snapshot)


def test_a_fee_on_transfer_deposit_credits_what_arrived(fee_market):
    m = fee_market
    r = send(m, m.market.functions.deposit(1_000_000), "buyer")
    assert events(m, r, "Deposited")[0]["args"]["amount"] == 990_000
    assert m.market.functions.balance_of(m.roles["buyer"]).call() == 990_000
    assert m.token.functions.balanceOf(m.market.address).call() == 990_000
    # and it can all leave again: the books hold what the market holds
    send(m, m.market.functions.withdraw(990_000), "buyer")
    assert m.token.functions.balanceOf(m.market.address).call() == 0


def test_a_fee_on_transfer_stake_counts_what_arrived(fee_market):
    m = fee_market
    key = bls_key("fee provider")
    # 1,000,000 asked, 990,000 arrive: below the 1,000,000 minimum
    with reverts("market: stake received below minimum"):
        send(m, m.market.functions.register(key.pk_eip, key.pop_eip, 10**6), "provider")
    r = send(m, m.market.functions.register(key.pk_eip, key.pop_eip, 2 * 10**6), "provider")
    assert events(m, r, "ProviderRegistered")[0]["args"]["stake"] == 1_980_000
    r = send(m, m.market.functions.add_stake(10**6), "provider")
    assert events(m, r, "StakeAdded")[0]["args"]["amount"] == 990_000
    assert m.market.functions.providers(m.roles["provider"]).call()[1] == 2_970_000
    assert m.market.functions.total_staked().call() == m.token.functions.balanceOf(m.market.address).call()


# ---------------------------------------------------------- packed counters
def test_packed_counters_read_as_before(m):
    """record_batches and total_locked share a slot, and so do the operator and the pause
    flag (a cold read less per record and per settlement): their views still say each."""
    before = m.market.functions.record_batches().call()
    o = m.order("buyer", gpus=2)
    batch, _, _ = m.record([o], [m.fill(o, "provider", gpus=2)])
    assert batch == before and m.market.functions.record_batches().call() == before + 1
    assert m.market.functions.total_locked().call() == 2 * PRICE
    assert m.market.functions.operator().call() == m.roles["operator"]
    send(m, m.market.functions.set_paused(True), "admin")
    assert m.market.functions.paused().call() is True
    assert m.market.functions.operator().call() == m.roles["operator"]
    send(m, m.market.functions.set_operator(m.roles["stranger"]), "admin")
    assert m.market.functions.paused().call() is True
    assert m.market.functions.operator().call() == m.roles["stranger"]
    send(m, m.market.functions.set_paused(False), "admin")
    assert m.market.functions.paused().call() is False
    assert m.market.functions.total_locked().call() == 2 * PRICE

"""GridBidMarket: buyers, providers, operator, anyone, arbiter, admin.

A call that must fail is refused by the node's gas estimate before it is sent: web3 raises
``ContractLogicError`` ("execution reverted: <reason>") and nothing is mined.
"""

from __future__ import annotations

import pytest
from web3.exceptions import ContractLogicError

from contracts.batches import Completion
from contracts.merkle import MerkleTree, receipt_leaf
from contracts.orders import Order, sign_order
from tests.contracts.deployers import HOUR, PRICE, bls_key

DIGEST = b"\x11" * 32


pytestmark = pytest.mark.anvil


def reverts(reason: str):
    return pytest.raises(ContractLogicError, match=reason)


def events(m, receipt, name):
    return getattr(m.market.events, name)().process_receipt(receipt)


def send(m, fn, who):
    return m.w3.eth.wait_for_transaction_receipt(fn.transact({"from": m.roles[who]}))


def bal(m, who):
    return m.market.functions.balance_of(m.roles[who]).call()


# ------------------------------------------------------------------ buyers
def test_deposit_credits_the_buyer_and_emits(m):
    before = bal(m, "buyer")
    r = send(m, m.market.functions.deposit(500), "buyer")
    assert bal(m, "buyer") == before + 500
    assert events(m, r, "Deposited")[0]["args"]["amount"] == 500


def test_withdraw_pays_out_and_over_withdrawal_is_rejected(m):
    before = m.token.functions.balanceOf(m.roles["buyer"]).call()
    r = send(m, m.market.functions.withdraw(700), "buyer")
    assert m.token.functions.balanceOf(m.roles["buyer"]).call() == before + 700
    assert events(m, r, "Withdrawn")[0]["args"]["amount"] == 700
    with reverts("market: low balance"):
        send(m, m.market.functions.withdraw(10**30), "buyer")
    with reverts("market: zero amount"):
        send(m, m.market.functions.withdraw(0), "buyer")
    with reverts("market: zero amount"):
        send(m, m.market.functions.deposit(0), "buyer")


def test_pause_stops_deposits_but_never_withdrawals(m):
    r = send(m, m.market.functions.set_paused(True), "admin")
    assert events(m, r, "PausedSet")[0]["args"]["paused"] is True
    with reverts("market: paused"):
        send(m, m.market.functions.deposit(1), "buyer")
    send(m, m.market.functions.withdraw(1), "buyer")


# ---------------------------------------------------------------- record
def test_record_locks_price_times_gpus_times_hours(m):
    o = m.order("buyer", gpus=3)
    fills = [m.fill(o, "provider", gpus=2), m.fill(o, "provider2", gpus=1)]
    before = bal(m, "buyer")
    batch, recorded, r = m.record([o], fills)
    assert bal(m, "buyer") == before - 3 * PRICE
    assert m.market.functions.total_locked().call() == 3 * PRICE
    assert m.market.functions.record_roots(batch).call() == MerkleTree([t.leaf for t in recorded]).root
    assert m.market.functions.trade_status(fills[0].trade_id).call() == 1
    assert m.market.functions.order_used(o.order.order_id).call()
    ev = events(m, r, "TradesRecorded")[0]["args"]
    assert (ev["batch"], ev["trades"], ev["locked"]) == (batch, 2, 3 * PRICE)


def test_record_by_a_stranger_is_rejected(m):
    o = m.order("buyer")
    with reverts("market: not operator"):
        m.record([o], [m.fill(o, "provider")], sender="stranger")


def test_forged_order_signature_is_rejected(m):
    forged = sign_order(
        m.keys["stranger"], Order(99, m.roles["stranger"], PRICE, 1, HOUR, m.now() + HOUR),
        chain_id=m.chain_id, market=m.market.address,
    )
    # claim the buyer's address over the stranger's signature
    object.__setattr__(forged, "order", Order(99, m.roles["buyer"], PRICE, 1, HOUR, m.now() + HOUR))
    with reverts("market: bad order signature"):
        m.record([forged], [m.fill(forged, "provider")])


def test_order_signed_for_another_market_is_rejected(m):
    o = m.order("buyer")
    elsewhere = sign_order(m.keys["buyer"], o.order, chain_id=m.chain_id, market=m.roles["stranger"])
    with reverts("market: bad order signature"):
        m.record([elsewhere], [m.fill(elsewhere, "provider")])


def test_replayed_order_is_rejected(m):
    o = m.order("buyer")
    m.record([o], [m.fill(o, "provider")])
    with reverts("market: order used"):
        m.record([o], [m.fill(o, "provider")])


def test_over_filled_order_is_rejected(m):
    o = m.order("buyer", gpus=1)
    with reverts("market: order over-filled"):
        m.record([o], [m.fill(o, "provider"), m.fill(o, "provider2")])


@pytest.mark.parametrize(
    ("mutate", "reason"),
    [
        ("price", "market: price above order"),
        ("expired", "market: order expired"),
        ("provider", "market: bad provider"),
        ("duplicate", "market: trade exists"),
        ("unfilled", "market: order not filled"),
        ("zero_gpus", "market: zero gpus"),
        ("broke", "market: low balance"),
        ("empty", "market: empty batch"),
    ],
)
def test_record_rejects_bad_batches(m, mutate, reason):
    o = m.order("buyer", gpus=4, deadline=m.now() - 1 if mutate == "expired" else None)
    fills = [m.fill(o, "provider")]
    orders = [o]
    if mutate == "price":
        fills = [m.fill(o, "provider", price=PRICE + 1)]
    elif mutate == "provider":
        fills = [m.fill(o, "stranger")]
    elif mutate == "duplicate":
        fills.append(m.fill(o, "provider2", trade_id=fills[0].trade_id))
    elif mutate == "unfilled":
        orders.append(m.order("buyer2"))
    elif mutate == "zero_gpus":
        fills = [m.fill(o, "provider", gpus=0)]
    elif mutate == "broke":
        big = m.order("buyer", gpus=1, max_price=10**15)
        orders, fills = [big], [m.fill(big, "provider", price=10**15)]
    elif mutate == "empty":
        fills = []
    with reverts(reason):
        m.record(orders, fills)


def test_record_while_paused_is_rejected(m):
    send(m, m.market.functions.set_paused(True), "admin")
    o = m.order("buyer")
    with reverts("market: paused"):
        m.record([o], [m.fill(o, "provider")])


# ---------------------------------------------------------------- settle
@pytest.fixture
def two_trades(m):
    o1, o2 = m.order("buyer"), m.order("buyer2")
    batch, recorded, _ = m.record([o1, o2], [m.fill(o1, "provider"), m.fill(o2, "provider2")])
    completions = [
        Completion(recorded[0], batch, 0, 1800, DIGEST),  # half used
        Completion(recorded[1], batch, 1, 3600, DIGEST),  # all used
    ]
    return batch, recorded, completions


def test_settle_pays_providers_refunds_buyers_once(m, two_trades, travel):
    batch, recorded, completions = two_trades
    before = {r: bal(m, r) for r in ("buyer", "buyer2", "provider", "provider2")}
    s, r = m.settle(completions)
    assert r["status"] == 1
    assert bal(m, "provider") - before["provider"] == PRICE // 2
    assert bal(m, "provider2") - before["provider2"] == PRICE
    assert bal(m, "buyer") - before["buyer"] == PRICE // 2
    assert bal(m, "buyer2") == before["buyer2"]
    assert m.market.functions.trade_status(recorded[0].trade_id).call() == 2
    assert m.market.functions.total_locked().call() == 0
    assert m.market.functions.settled_at(s.root).call() == m.now()
    ev = events(m, r, "BatchSettled")[0]["args"]
    assert (ev["trades"], ev["paid"], ev["refunded"]) == (2, PRICE + PRICE // 2, PRICE // 2)
    # a trade settles once, under any root
    with reverts("market: root settled"):
        m.settle(completions, signature=b"\x00" * 256)
    with reverts("market: trade not open"):
        m.settle(completions[:1], signature=b"\x00" * 256)

    # dispute inside the window holds the payment; the arbiter refunds and slashes
    t = recorded[0]
    record_tree = MerkleTree([x.leaf for x in recorded])
    args = (t.as_abi(), batch, 0, record_tree.proof(0), 1800, DIGEST, s.root, 0, s.tree.proof(0))
    with reverts("market: not buyer"):
        send(m, m.market.functions.dispute(*args), "stranger")
    r = send(m, m.market.functions.dispute(*args), "buyer")
    assert events(m, r, "DisputeOpened")[0]["args"]["held"] == PRICE // 2
    assert m.market.functions.total_held().call() == PRICE // 2
    assert m.market.functions.trade_status(t.trade_id).call() == 3
    with reverts("market: trade not settled"):
        send(m, m.market.functions.dispute(*args), "buyer")
    with reverts("market: not arbiter"):
        send(m, m.market.functions.resolve_dispute(t.trade_id, False, 10), "stranger")
    buyer_before = bal(m, "buyer")
    r = send(m, m.market.functions.resolve_dispute(t.trade_id, False, 10), "arbiter")
    ev = events(m, r, "DisputeResolved")[0]["args"]
    assert (ev["provider_paid"], ev["amount"], ev["slashed"]) == (False, PRICE // 2, 10)
    assert bal(m, "buyer") == buyer_before + PRICE // 2 + 10
    assert m.market.functions.providers(m.roles["provider"]).call()[1] == 10**8 - 10
    with reverts("market: no dispute"):
        send(m, m.market.functions.resolve_dispute(t.trade_id, True, 0), "arbiter")

    # the other trade: dispute after the window is too late
    t2 = recorded[1]
    travel(86400 + 10)
    args2 = (t2.as_abi(), batch, 1, record_tree.proof(1), 3600, DIGEST, s.root, 1, s.tree.proof(1))
    with reverts("market: window closed"):
        send(m, m.market.functions.dispute(*args2), "buyer2")


def test_aggregate_signature_missing_one_provider_is_rejected(m, two_trades):
    _, _, completions = two_trades
    s = m.settlement(completions)
    only_one = m.aggregate(s.message, ["provider"])
    with reverts("market: bad signature"):
        m.settle(completions, signature=only_one)


def test_receipt_for_another_trade_is_rejected(m, two_trades):
    _, _, completions = two_trades
    s = m.settlement(completions)
    sig = b"\x00" * 256
    root, receipts, buyers, signers, _, coverage, fillers = s.args(sig)
    # the first receipt re-labelled with the second trade's id
    id_bits = ((1 << 64) - 1) << 128
    forged = list(receipts)
    forged[0] = (receipts[0][0], receipts[0][1] & ~id_bits | receipts[1][1] & id_bits, receipts[0][2])
    with reverts("market: (unknown trade|trade not open|root mismatch)"):
        send(m, m.market.functions.settle_batch(root, forged, buyers, signers, sig, coverage, fillers), "operator")


def test_settle_checks_signers_and_caller(m, two_trades):
    _, _, completions = two_trades
    s = m.settlement(completions)
    sig = b"\x00" * 256
    root, receipts, buyers, signers, _, coverage, fillers = s.args(sig)
    fn = m.market.functions.settle_batch
    with reverts("market: not operator"):
        send(m, fn(root, receipts, buyers, signers, sig, coverage, fillers), "stranger")
    with reverts("market: root mismatch"):
        send(m, fn(b"\x01" * 32, receipts, buyers, signers, sig, coverage, fillers), "operator")
    with reverts("market: idle signer"):
        one_root = s.tree.leaves[0]  # a one-leaf tree's root is its leaf
        send(m, fn(one_root, receipts[:1], buyers, signers, sig, coverage, [s.completions[1].trade.leaf]), "operator")
    with reverts("market: stray receipt"):
        send(m, fn(root, receipts, buyers, signers, sig, [], fillers), "operator")
    with reverts("market: empty batch"):
        send(m, fn(root, [], buyers, signers, sig, coverage, fillers), "operator")
    # signers swapped (each receipt's index follows, so only the order is wrong)
    swap = [(r[0], r[1] ^ (1 << 16) if len(signers) == 2 else r[1], r[2]) for r in receipts]
    with reverts("market: unsorted signers"):
        send(m, fn(root, swap, buyers, signers[::-1], sig, coverage, fillers), "operator")
    # a signer presented with another provider's key
    wrong_key = [signers[0], (signers[1][0], *signers[0][1:])]
    with reverts("market: unknown signer"):
        send(m, fn(root, receipts, buyers, wrong_key, sig, coverage, fillers), "operator")
    with reverts("market: bad buyer"):
        send(m, fn(root, receipts, buyers[:0], signers, sig, coverage, fillers), "operator")


# ----------------------------------------------------------------- refunds
def test_refund_after_deadline_and_grace_returns_the_lock_once(m, travel):
    o = m.order("buyer", deadline=m.now() + HOUR)
    batch, recorded, _ = m.record([o], [m.fill(o, "provider")])
    t = recorded[0]
    fn = m.market.functions.refund_expired(t.as_abi(), batch, 0, [])
    with reverts("market: not expired"):
        send(m, fn, "stranger")
    travel(2 * HOUR + 10)
    before = bal(m, "buyer")
    r = send(m, fn, "stranger")
    assert bal(m, "buyer") == before + PRICE
    assert events(m, r, "TradeRefunded")[0]["args"]["amount"] == PRICE
    with reverts("market: trade not open"):
        send(m, fn, "stranger")
    tampered = (t.trade_id, t.buyer, t.provider, t.price * 2, t.gpus, t.duration, t.deadline)
    with reverts("market: unknown trade"):
        send(m, m.market.functions.refund_expired(tampered, batch, 0, []), "stranger")
    with reverts("market: trade expired"):
        m.settle([Completion(t, batch, 0, 10, DIGEST)], signature=b"\x00" * 256)


# --------------------------------------------------------------- providers
def test_rogue_key_without_valid_proof_of_possession_is_rejected(m, bls_keys):
    rogue = bls_key("rogue")
    # the rogue key presented with someone else's proof
    with reverts("market: bad pop"):
        send(m, m.market.functions.register(rogue.pk_eip, bls_keys["provider"].pop_eip, 10**8), "stranger")


def test_register_rules(m, bls_keys):
    k = bls_keys["provider"]
    with reverts("market: already registered"):
        send(m, m.market.functions.register(k.pk_eip, k.pop_eip, 10**8), "provider")
    with reverts("market: stake below minimum"):
        send(m, m.market.functions.register(k.pk_eip, k.pop_eip, 1), "stranger")
    with reverts("market: bad key encoding"):
        send(m, m.market.functions.register(k.pk_eip[:64], k.pop_eip, 10**8), "stranger")


def test_exit_waits_for_the_delay_then_returns_the_stake(m, travel):
    with reverts("market: exit not requested"):
        send(m, m.market.functions.exit(), "provider")
    r = send(m, m.market.functions.request_exit(), "provider")
    assert events(m, r, "ExitRequested")[0]["args"]["exit_at"] == m.now() + 7 * 86400
    with reverts("market: exiting"):
        send(m, m.market.functions.request_exit(), "provider")
    o = m.order("buyer")
    with reverts("market: bad provider"):
        m.record([o], [m.fill(o, "provider")])
    with reverts("market: too early"):
        send(m, m.market.functions.exit(), "provider")
    travel(7 * 86400 + 1)
    before = m.token.functions.balanceOf(m.roles["provider"]).call()
    r = send(m, m.market.functions.exit(), "provider")
    assert m.token.functions.balanceOf(m.roles["provider"]).call() == before + 10**8
    assert events(m, r, "ProviderExited")[0]["args"]["stake"] == 10**8
    with reverts("market: not provider"):
        send(m, m.market.functions.exit(), "provider")
    with reverts("market: not provider"):
        send(m, m.market.functions.request_exit(), "stranger")



def test_an_exiting_provider_is_settled_only_while_its_stake_outlasts_the_dispute_window(m, travel):
    day = 86400
    orders = [m.order("buyer", deadline=m.now() + 8 * day) for _ in range(2)]
    batch, recorded, _ = m.record(orders, [m.fill(o, "provider") for o in orders])
    send(m, m.market.functions.request_exit(), "provider")
    exit_at = m.market.functions.providers(m.roles["provider"]).call()[0]
    # a day's disputes still fit before the stake may leave: it settles, into its earnings
    s, r = m.settle([Completion(recorded[0], batch, 0, 3600, DIGEST)])
    assert r["status"] == 1
    assert bal(m, "provider") == PRICE
    # within a dispute window of the exit a buyer could no longer reach the stake
    travel(exit_at - m.now() - day)
    with reverts("market: provider exiting"):
        m.settle([Completion(recorded[1], batch, 1, 3600, DIGEST)])
    # after the exit the earnings stay withdrawable, from the balance word
    travel(day + 1)
    send(m, m.market.functions.exit(), "provider")
    assert list(m.market.functions.providers(m.roles["provider"]).call()) == [0, 0, 0]
    assert bal(m, "provider") == PRICE
    before = m.token.functions.balanceOf(m.roles["provider"]).call()
    send(m, m.market.functions.withdraw(PRICE), "provider")
    assert m.token.functions.balanceOf(m.roles["provider"]).call() == before + PRICE
    assert bal(m, "provider") == 0


def test_a_provider_withdraws_earnings_first_then_its_balance(m, two_trades):
    _, _, completions = two_trades
    m.settle(completions)
    assert bal(m, "provider2") == PRICE  # earnings, in the provider's slot
    send(m, m.market.functions.deposit(10), "provider2")  # and 10 in its balance word
    send(m, m.market.functions.withdraw(PRICE + 5), "provider2")
    assert bal(m, "provider2") == 5
    with reverts("market: low balance"):
        send(m, m.market.functions.withdraw(6), "provider2")


def _dispute_first(m, batch, recorded, s):
    t = recorded[0]
    record_tree = MerkleTree([x.leaf for x in recorded])
    args = (t.as_abi(), batch, 0, record_tree.proof(0), 1800, DIGEST, s.root, 0, s.tree.proof(0))
    return send(m, m.market.functions.dispute(*args), "buyer")


def state_and_stake(m, who):
    return list(m.market.functions.providers(m.roles[who]).call())[:2]


def test_a_provider_slashed_below_the_minimum_is_suspended_until_it_tops_up(m, two_trades):
    batch, recorded, completions = two_trades
    later = m.order("buyer2")
    batch2, recorded2, _ = m.record([later], [m.fill(later, "provider")])
    s, _ = m.settle(completions)
    _dispute_first(m, batch, recorded, s)
    send(m, m.market.functions.resolve_dispute(recorded[0].trade_id, False, 10), "arbiter")
    assert state_and_stake(m, "provider") == [2, 10**8 - 10]
    # suspended: no new trades, and its open trade waits
    o = m.order("buyer")
    with reverts("market: bad provider"):
        m.record([o], [m.fill(o, "provider")])
    pending = [Completion(recorded2[0], batch2, 0, 3600, DIGEST)]
    with reverts("market: provider suspended"):
        m.settle(pending)
    with reverts("market: zero amount"):
        send(m, m.market.functions.add_stake(0), "provider")
    with reverts("market: not provider"):
        send(m, m.market.functions.add_stake(5), "stranger")
    send(m, m.market.functions.add_stake(5), "provider")
    assert state_and_stake(m, "provider") == [2, 10**8 - 5]
    r = send(m, m.market.functions.add_stake(5), "provider")
    assert events(m, r, "StakeAdded")[0]["args"]["stake"] == 10**8
    assert state_and_stake(m, "provider") == [1, 10**8]
    assert m.settle(pending)[1]["status"] == 1
    # an exiting provider's stake only leaves
    send(m, m.market.functions.request_exit(), "provider")
    with reverts("market: exiting"):
        send(m, m.market.functions.add_stake(5), "provider")


def test_a_suspended_provider_can_still_leave(m, two_trades):
    batch, recorded, completions = two_trades
    s, _ = m.settle(completions)
    _dispute_first(m, batch, recorded, s)
    send(m, m.market.functions.resolve_dispute(recorded[0].trade_id, False, 10), "arbiter")
    assert state_and_stake(m, "provider")[0] == 2
    r = send(m, m.market.functions.request_exit(), "provider")
    exit_at = events(m, r, "ExitRequested")[0]["args"]["exit_at"]
    assert state_and_stake(m, "provider") == [exit_at, 10**8 - 10]
    with reverts("market: exiting"):
        send(m, m.market.functions.request_exit(), "provider")


def test_a_provider_found_right_gets_back_what_was_held_from_its_stake(m, two_trades):
    batch, recorded, completions = two_trades
    s, _ = m.settle(completions)
    staked = m.market.functions.total_staked().call()
    send(m, m.market.functions.withdraw(PRICE // 2), "provider")  # nothing free left to hold
    r = _dispute_first(m, batch, recorded, s)
    held = events(m, r, "DisputeOpened")[0]["args"]
    assert (held["held"], held["from_stake"]) == (PRICE // 2, PRICE // 2)
    assert state_and_stake(m, "provider") == [2, 10**8 - PRICE // 2]
    r = send(m, m.market.functions.resolve_dispute(recorded[0].trade_id, True, 0), "arbiter")
    assert events(m, r, "DisputeResolved")[0]["args"]["restaked"] == PRICE // 2
    assert state_and_stake(m, "provider") == [1, 10**8]
    assert bal(m, "provider") == 0
    assert m.market.functions.total_staked().call() == staked

# ------------------------------------------------------------------- admin
def test_admin_rotates_operator_and_arbiter(m):
    r = send(m, m.market.functions.set_operator(m.roles["stranger"]), "admin")
    assert events(m, r, "OperatorChanged")[0]["args"]["operator"] == m.roles["stranger"]
    r = send(m, m.market.functions.set_arbiter(m.roles["stranger"]), "admin")
    assert events(m, r, "ArbiterChanged")[0]["args"]["arbiter"] == m.roles["stranger"]
    assert m.market.functions.operator().call() == m.roles["stranger"]
    for fn in (m.market.functions.set_operator, m.market.functions.set_arbiter):
        with reverts("market: not admin"):
            send(m, fn(m.roles["buyer"]), "stranger")
        with reverts("market: zero address"):
            send(m, fn("0x" + "00" * 20), "admin")
    with reverts("market: not admin"):
        send(m, m.market.functions.set_paused(True), "stranger")


def test_settlement_message_binds_chain_and_market(m):
    from contracts.merkle import settlement_message

    root = receipt_leaf(1, 2, DIGEST)
    assert m.market.functions.settlement_message(root).call() == settlement_message(
        root, m.chain_id, m.market.address
    )

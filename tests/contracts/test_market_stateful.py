"""GridBidMarket as a state machine: random sequences of deposits, records,
settlements, refunds, disputes, rulings, withdrawals and exits across three
buyers and three providers, checked against a model of the books.

After every step:

* the market holds exactly what it owes:
  ``token.balanceOf(market) == free balances + open locks + stakes + held disputes``,
  counted by the model and reported by the market's own views;
* every view the model predicts agrees: each account's free balance, each
  provider's state and stake, each open dispute, the totals, and (after any
  step that writes them) every trade's status;
* no trade pays twice: each trade is paid out (settled to its provider or
  refunded to its buyer) at most once. Every payout is retried at once by
  every other route (another settlement, the same settlement replayed, a
  refund, a second dispute or ruling), and each retry must revert.

Steps also try what must fail (withdrawing more than is free, locking more
than a buyer has, replaying an order, trading with a leaving provider,
settling a trade of a provider that left, refunding early, disputing late or
as a stranger, ruling as a stranger, exiting early) and check the revert
reason; a revert mines nothing, so it changes nothing. Time jumps to the
edges that matter (the last second a trade can settle and the first it can
be refunded, the last second of a dispute window and the first after it, the
first second a provider can leave and the one before), so the model's
``<`` and ``<=`` are checked against the contract's.

The chain is anvil (tests/contracts/chain.py): every transaction goes through
the node's gas estimate, so one the model expects to revert is refused with
its reason before it is sent (web3's ``ContractLogicError``), and one it
expects to succeed returns once mined. The machine runs on its own
deployment, reverted to one snapshot before each example; blocks are one
second apart, and the time of the next one is tracked by the harness.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from eth_abi import decode
from eth_account import Account
from eth_utils import to_bytes, to_checksum_address
from eth_utils.abi import get_abi_output_types
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from web3 import Web3
from web3.contract import Contract
from web3.exceptions import ContractLogicError
from web3.logs import DISCARD

from contracts.batches import Completion, RecordedTrade, record_args
from contracts.merkle import MerkleTree
from contracts.orders import SignedOrder
from tests.contracts.chain import Chain
from tests.contracts.deployers import HOUR, PRICE, BlsKey, Market, bls_key, deploy_market_fixture

pytestmark = pytest.mark.anvil

DAY = 24 * HOUR
MIN_STAKE = 10**8
GRACE = HOUR
WINDOW = DAY
EXIT_DELAY = 7 * DAY
# the last outlives a provider's exit delay: its trades can be left behind
DEADLINES = st.sampled_from([HOUR, 3 * HOUR, 2 * DAY, EXIT_DELAY + DAY])
BIG_PRICE = 10**10  # a few of these exhaust a buyer's escrow: records must then revert

BUYERS = ("buyer", "buyer2", "buyer3")
PROVIDERS = ("provider", "provider2", "provider3")
ACCOUNTS = BUYERS + PROVIDERS
STAKES = {"provider": MIN_STAKE, "provider2": 3 * MIN_STAKE, "provider3": MIN_STAKE}

OPEN, SETTLED, CLOSED = 1, 2, 3
MAX_OPEN = 4  # open trades at a time, so the other rules get their turn
MAX_SETTLEMENTS = 2  # per example
NO_SIGNATURE = b"\x00" * 256  # for settlements that must revert before the pairing

SETTINGS = settings(
    max_examples=20,
    stateful_step_count=15,
    deadline=None,
    # CI sees the same sequences on every run
    derandomize=True,
    database=None,
    # a failing run prints its steps unshrunk: shrinking replays hundreds of
    # transactions per try
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


# ------------------------------------------------------------------ world
@dataclass
class World:
    chain: Chain
    m: Market
    base: str  # the snapshot every example starts from (anvil forgets it on revert: renewed each time)
    outputs: dict[tuple[str, str], list[str]]  # ABI output types of each view


@pytest.fixture(scope="module")
def world(chain: Chain, w3: Web3, role_keys: dict[str, bytes], account_keys: list[bytes],
          bls_keys: dict[str, BlsKey]) -> Iterator[World]:
    before = chain.snapshot()
    try:
        extra = account_keys[len(role_keys):len(role_keys) + 2]
        keys = {**role_keys, "buyer3": extra[0], "provider3": extra[1]}
        roles = {name: Account.from_key(key).address for name, key in keys.items()}
        # no BLS keys here: the providers register below, with their own stakes
        m = deploy_market_fixture(
            w3, roles, keys, {}, min_stake=MIN_STAKE, grace_period=GRACE,
            dispute_window=WINDOW, exit_delay=EXIT_DELAY,
        )
        m.bls_keys = {**bls_keys, "provider3": bls_key("provider3")}
        for name in ("buyer3", "provider3"):
            m.token.functions.mint(roles[name], 10**12).transact({"from": roles["admin"]})
            m.token.functions.approve(m.market.address, 2**256 - 1).transact({"from": roles[name]})
        # a small escrow, so buyer3 runs short
        m.market.functions.deposit(10 * PRICE).transact({"from": roles["buyer3"]})
        for name in PROVIDERS:
            key = m.bls_keys[name]
            m.market.functions.register(key.pk_eip, key.pop_eip, STAKES[name]).transact({"from": roles[name]})
            assert tuple(m.market.functions.providers(roles[name]).call())[:2] == (1, STAKES[name])
        outputs = {(c.address, f["name"]): get_abi_output_types(f)
                   for c in (m.market, m.token) for f in c.abi if f["type"] == "function"}
        yield World(chain, m, chain.snapshot(), outputs)
    finally:
        chain.revert(before)


# ------------------------------------------------------------------ model
@dataclass
class Settled:
    root: bytes
    index: int  # the receipt's leaf in the completion tree
    proof: list[bytes]
    gpu_seconds: int
    digest: bytes
    paid: int
    at: int
    args: tuple[Any, ...]  # the whole settle_batch call, to replay it


@dataclass
class Trade:
    rec: RecordedTrade
    batch: int
    position: int
    status: int = OPEN
    settled: Settled | None = None


@dataclass
class Hold:
    buyer: str
    provider: str
    held: int
    from_stake: int


class MarketMachine(RuleBasedStateMachine):
    def __init__(self, world: World) -> None:
        super().__init__()
        self.world, self.chain, self.m = world, world.chain, world.m
        world.base = self.chain.rewind(world.base)
        # an hour on, blocks are one second apart: the same draws replay the
        # same times, however fast the machine runs
        self.chain.time_travel(self.chain.next_timestamp + HOUR)
        self.m.records = {}
        self.name_of = {self.m.roles[n]: n for n in ACCOUNTS}
        self.free = {n: self.view("balance_of", self.m.roles[n]) for n in ACCOUNTS}
        self.wallet = {n: self.token_balance(n) for n in ACCOUNTS}
        self.stake = dict(STAKES)
        self.state = dict.fromkeys(PROVIDERS, 1)  # 1 active, 2 suspended, its exit time while leaving, 0 gone
        self.trades: dict[int, Trade] = {}
        self.holds: dict[int, Hold] = {}
        self.payouts: dict[int, list[str]] = {}
        self.settlements = 0
        self.verified_block = -1
        self.statuses_written = False  # only record, settle, refund and dispute write them
        # ids spread over several status and order bitmap words
        self.ids = (61 * i for i in itertools.count(1))
        self.digests = (hashlib.sha256(b"receipt %d" % i).digest() for i in itertools.count())

    # ---------------------------------------------------------- plumbing
    def view(self, name: str, *args: Any, contract: Contract | None = None) -> Any:
        """A view read with a bare eth_call, past web3's middleware: the
        invariants read a score of views after every step, and web3's request
        pipeline costs several times anvil's answer."""
        contract = contract or self.m.market
        raw = self.chain.rpc("eth_call", [
            {"from": self.m.roles["stranger"], "to": contract.address,
             "data": contract.encode_abi(name, args=list(args))},
            "latest",
        ])
        values = decode(self.world.outputs[contract.address, name], to_bytes(hexstr=raw))
        return values[0] if len(values) == 1 else tuple(values)

    def token_balance(self, name: str) -> int:
        return int(self.view("balanceOf", self.m.roles[name], contract=self.m.token))

    def now(self) -> int:
        """The timestamp of the block the next transaction lands in."""
        return self.chain.next_timestamp

    def send(self, fn: Any, who: str) -> Any:
        try:
            tx = fn.transact({"from": self.m.roles[who]})
        except ContractLogicError as exc:
            raise AssertionError(f"{fn.fn_name} by {who} reverted ({exc}); the model expected success") from exc
        receipt = self.m.w3.eth.wait_for_transaction_receipt(tx)
        assert receipt["status"] == 1, f"{fn.fn_name} by {who} reverted; the model expected success"
        return receipt

    def refuse(self, fn: Any, who: str, reason: str) -> None:
        block = self.m.w3.eth.block_number
        with pytest.raises(ContractLogicError, match=re.escape(reason)):
            fn.transact({"from": self.m.roles[who]})
        # the estimate reverted, so nothing was mined and nothing changed
        assert self.m.w3.eth.block_number == block

    def act(self, fn: Any, who: str, reason: str | None) -> Any:
        if reason is None:
            return self.send(fn, who)
        self.refuse(fn, who, reason)
        return None

    def event(self, receipt: Any, name: str) -> Any:
        (ev,) = getattr(self.m.market.events, name)().process_receipt(receipt, errors=DISCARD)
        return ev["args"]

    def pick(self, data: st.DataObject, items: Iterable[Any], label: str,
             can_succeed: Callable[[Any], bool]) -> Any:
        """One of `items`, those that can succeed first: Hypothesis leans on
        the first choice when it extends a sequence, so even a small budget
        sees most steps go through."""
        return data.draw(st.sampled_from(sorted(items, key=lambda x: (not can_succeed(x), x))), label=label)

    def paid_out(self, trade_id: int, how: str) -> None:
        """Log a payout the chain made (a settlement's receipt, a refund's event)."""
        self.payouts.setdefault(trade_id, []).append(how)

    # -------------------------------------------------- the model's rules
    def active(self, provider: str) -> bool:
        return self.state[provider] == 1

    def exit_due(self, provider: str) -> bool:
        return 2 < self.state[provider] <= self.now()

    def standing(self, provider: str) -> None:
        """Active <-> suspended as its stake crosses the minimum; exiting stays exiting."""
        if self.state[provider] == 1 and self.stake[provider] < MIN_STAKE:
            self.state[provider] = 2
        elif self.state[provider] == 2 and self.stake[provider] >= MIN_STAKE:
            self.state[provider] = 1

    def expired(self, t: Trade) -> bool:
        return self.now() > t.rec.deadline + GRACE

    def settleable(self, trade_id: int) -> bool:
        t = self.trades[trade_id]
        return t.status == OPEN and not self.expired(t) and self.settles(self.name_of[t.rec.provider])

    def settles(self, provider: str) -> bool:
        """The contract settles a provider whose stake stays for a whole dispute window."""
        state = self.state[provider]
        return state == 1 or (state > 2 and self.now() + WINDOW < state)

    def refundable(self, trade_id: int) -> bool:
        return self.refund_reason(self.trades[trade_id]) is None

    def disputable(self, trade_id: int) -> bool:
        t = self.trades[trade_id]
        return t.settled is not None and self.dispute_reason(t, self.name_of[t.rec.buyer]) is None

    def settlement_reason(self, completions: list[Completion]) -> str | None:
        now = self.now()
        # in the contract's order: each receipt's deadline, then its status
        for c in sorted(completions, key=lambda c: (c.batch, c.position)):
            if now > c.trade.deadline + GRACE:
                return "market: trade expired"
            if self.trades[c.trade.trade_id].status != OPEN:
                return "market: trade not open"
        for address in sorted({c.trade.provider for c in completions}, key=lambda a: int(a, 16)):
            if self.state[self.name_of[address]] == 0:
                return "market: unknown signer"  # an exited provider's key is gone
            if self.state[self.name_of[address]] == 2:
                return "market: provider suspended"
            if not self.settles(self.name_of[address]):
                return "market: provider exiting"
        return None

    def refund_reason(self, t: Trade, *, tampered: bool = False) -> str | None:
        if not self.expired(t):
            return "market: not expired"
        if tampered:
            return "market: unknown trade"
        if t.status != OPEN:
            return "market: trade not open"
        return None

    def dispute_reason(self, t: Trade, who: str) -> str | None:
        assert t.settled is not None
        if who != self.name_of[t.rec.buyer]:
            return "market: not buyer"
        if self.now() > t.settled.at + WINDOW:
            return "market: window closed"
        if t.status != SETTLED:
            return "market: trade not settled"
        return None

    # ---------------------------------------------------- call builders
    def completion(self, t: Trade, used: str) -> Completion:
        full = t.rec.gpus * t.rec.duration
        gpu_seconds = {"none": 0, "half": full // 2, "all": full, "over": full + HOUR}[used]
        return Completion(t.rec, t.batch, t.position, gpu_seconds, next(self.digests))

    def record_call(self, orders: list[SignedOrder], fills: list[Any]) -> Any:
        return self.m.market.functions.record_trades(*record_args(orders, fills).args)

    def unsigned_settle_call(self, completions: list[Completion]) -> Any:
        return self.m.market.functions.settle_batch(*self.m.settlement(completions).args(NO_SIGNATURE))

    def refund_call(self, t: Trade, *, tampered: bool = False) -> Any:
        trade = t.rec.as_abi()
        if tampered:
            trade = (*trade[:3], trade[3] * 2, *trade[4:])
        proof = MerkleTree([x.leaf for x in self.m.records[t.batch]]).proof(t.position)
        return self.m.market.functions.refund_expired(trade, t.batch, t.position, proof)

    def dispute_call(self, t: Trade) -> Any:
        s = t.settled
        assert s is not None
        proof = MerkleTree([x.leaf for x in self.m.records[t.batch]]).proof(t.position)
        return self.m.market.functions.dispute(
            t.rec.as_abi(), t.batch, t.position, proof, s.gpu_seconds, s.digest, s.root, s.index, s.proof
        )

    def pay_again(self, t: Trade) -> None:
        """Every other way to pay a paid trade must revert."""
        completions = [self.completion(t, "all")]
        reason = self.settlement_reason(completions)
        assert reason is not None
        self.refuse(self.unsigned_settle_call(completions), "operator", reason)
        reason = self.refund_reason(t)
        assert reason is not None
        self.refuse(self.refund_call(t), "stranger", reason)
        if t.settled is not None:
            self.refuse(self.m.market.functions.settle_batch(*t.settled.args), "operator", "market: root settled")
            if t.status != SETTLED:
                buyer = self.name_of[t.rec.buyer]
                reason = self.dispute_reason(t, buyer)
                assert reason is not None
                self.refuse(self.dispute_call(t), buyer, reason)

    # ------------------------------------------------------------ buyers
    @rule(buyer=st.sampled_from(BUYERS), amount=st.sampled_from([0, 1, PRICE, 10**9]))
    def deposit(self, buyer: str, amount: int) -> None:
        reason = "market: zero amount" if amount == 0 else None
        if self.act(self.m.market.functions.deposit(amount), buyer, reason) is not None:
            self.free[buyer] += amount
            self.wallet[buyer] -= amount
            assert self.token_balance(buyer) == self.wallet[buyer]

    @rule(who=st.sampled_from(ACCOUNTS), share=st.sampled_from(["half", "all", "over"]))
    def withdraw(self, who: str, share: str) -> None:
        free = self.free[who]
        amount = {"half": free // 2, "all": free, "over": free + 1}[share]
        reason = None
        if amount == 0:
            reason = "market: zero amount"
        elif amount > free:
            reason = "market: low balance"
        if self.act(self.m.market.functions.withdraw(amount), who, reason) is not None:
            self.free[who] -= amount
            self.wallet[who] += amount
            assert self.token_balance(who) == self.wallet[who]

    # ------------------------------------------------------------ record
    @initialize(data=st.data())
    def first_record(self, data: st.DataObject) -> None:
        self.record(data)

    @precondition(lambda self: sum(t.status == OPEN for t in self.trades.values()) < MAX_OPEN)
    @rule(data=st.data())
    def record(self, data: st.DataObject) -> None:
        m = self.m
        orders, fills = [], []
        for _ in range(data.draw(st.integers(1, 2), label="orders")):
            gpus = data.draw(st.integers(1, 3), label="gpus")
            max_price = data.draw(st.sampled_from([PRICE, BIG_PRICE]), label="max price")
            o = m.order(
                data.draw(st.sampled_from(BUYERS), label="buyer"), gpus=gpus, max_price=max_price,
                order_id=next(self.ids),
                duration=data.draw(st.sampled_from([HOUR, 2 * HOUR]), label="duration"),
                deadline=self.now() + data.draw(DEADLINES, label="deadline in"),
            )
            orders.append(o)
            # one or two providers split the order's GPUs
            providers = [self.pick(data, PROVIDERS, "provider", self.active)]
            if gpus > 1 and data.draw(st.booleans(), label="two providers"):
                providers.append(self.pick(data, PROVIDERS, "provider", self.active))
            shares = [gpus] if len(providers) == 1 else [1, gpus - 1]
            for provider, share in zip(providers, shares, strict=True):
                price = data.draw(st.sampled_from([max_price, max_price // 2]), label="price")
                fills.append(m.fill(o, provider, gpus=share, price=price, trade_id=next(self.ids)))
        recorded = record_args(orders, fills).recorded
        need: dict[str, int] = {}
        for t in recorded:
            need[self.name_of[t.buyer]] = need.get(self.name_of[t.buyer], 0) + t.lock
        reason = None
        if not all(self.active(self.name_of[f.provider]) for f in fills):
            reason = "market: bad provider"
        elif any(amount > self.free[b] for b, amount in need.items()):
            reason = "market: low balance"
        batch = self.view("record_batches")
        receipt = self.act(self.record_call(orders, fills), "operator", reason)
        if receipt is None:
            return
        ev = self.event(receipt, "TradesRecorded")
        assert (ev["batch"], ev["trades"], ev["locked"]) == (batch, len(recorded), sum(need.values()))
        m.records[batch] = recorded
        for b, amount in need.items():
            self.free[b] -= amount
        for position, t in enumerate(recorded):
            self.trades[t.trade_id] = Trade(t, batch, position)
        self.statuses_written = True
        # an order locks once, and a trade id is recorded once
        provider = self.name_of[fills[0].provider]
        replay = m.fill(orders[0], provider, gpus=1, trade_id=next(self.ids))
        self.refuse(self.record_call(orders[:1], [replay]), "operator", "market: order used")
        fresh = m.order(BUYERS[0], order_id=next(self.ids))
        reused = m.fill(fresh, provider, trade_id=fills[0].trade_id)
        self.refuse(self.record_call([fresh], [reused]), "operator", "market: trade exists")

    # ------------------------------------------------------------ settle
    @precondition(lambda self: self.settlements < MAX_SETTLEMENTS
                  and any(self.settleable(i) for i in self.trades))
    @rule(data=st.data())
    def settle(self, data: st.DataObject) -> None:
        m = self.m
        open_ids = [i for i, t in self.trades.items() if t.status == OPEN]
        chosen = [self.pick(data, open_ids, "trade", self.settleable)]
        for _ in range(data.draw(st.integers(0, 2), label="more trades")):
            if others := [i for i in open_ids if i not in chosen]:
                chosen.append(self.pick(data, others, "trade", self.settleable))
        used = st.sampled_from(["none", "half", "all", "over"])
        completions = [self.completion(self.trades[i], data.draw(used, label="used")) for i in chosen]
        reason = self.settlement_reason(completions)
        if reason is not None:
            self.refuse(self.unsigned_settle_call(completions), "operator", reason)
            return
        s = m.settlement(completions)
        now = self.now()
        args = s.args(m.aggregate(s.message, [self.name_of[a] for a in s.signers]))
        receipt = self.send(m.market.functions.settle_batch(*args), "operator")
        self.settlements += 1
        assert self.view("settled_at", s.root) == now
        paid = refunded = 0
        for index, c in enumerate(s.completions):
            t, rec = self.trades[c.trade.trade_id], c.trade
            pay = rec.payment(c.gpu_seconds)
            self.free[self.name_of[rec.provider]] += pay
            self.free[self.name_of[rec.buyer]] += rec.lock - pay
            paid, refunded = paid + pay, refunded + rec.lock - pay
            t.status = SETTLED
            t.settled = Settled(s.root, index, s.tree.proof(index), c.gpu_seconds, c.digest, pay, now, args)
            self.paid_out(rec.trade_id, "settled")
        self.statuses_written = True
        ev = self.event(receipt, "BatchSettled")
        assert (ev["trades"], ev["paid"], ev["refunded"]) == (len(completions), paid, refunded)
        first = self.trades[chosen[0]]
        self.pay_again(first)
        self.refuse(self.dispute_call(first), "stranger", "market: not buyer")

    # ------------------------------------------------------------ refund
    @precondition(lambda self: any(self.refundable(i) for i in self.trades))
    @rule(data=st.data())
    def refund(self, data: st.DataObject) -> None:
        t = self.trades[self.pick(data, self.trades, "trade", self.refundable)]
        tampered = data.draw(st.booleans(), label="inflate the price")
        receipt = self.act(self.refund_call(t, tampered=tampered), "stranger",
                           self.refund_reason(t, tampered=tampered))
        if receipt is None:
            return
        ev = self.event(receipt, "TradeRefunded")
        assert (ev["trade_id"], ev["buyer"], ev["amount"]) == (t.rec.trade_id, t.rec.buyer, t.rec.lock)
        self.free[self.name_of[t.rec.buyer]] += t.rec.lock
        t.status = CLOSED
        self.statuses_written = True
        self.paid_out(ev["trade_id"], "refunded")
        self.pay_again(t)

    # ---------------------------------------------------------- disputes
    @precondition(lambda self: any(self.disputable(i) for i in self.trades))
    @rule(data=st.data())
    def dispute(self, data: st.DataObject) -> None:
        t = self.trades[self.pick(data, [i for i, t in self.trades.items() if t.settled], "trade",
                                  self.disputable)]
        assert t.settled is not None
        buyer, provider = self.name_of[t.rec.buyer], self.name_of[t.rec.provider]
        who = data.draw(st.sampled_from([buyer, buyer, "stranger"]), label="disputer")
        receipt = self.act(self.dispute_call(t), who, self.dispute_reason(t, who))
        if receipt is None:
            return
        # held from the provider's free balance first, then from its stake
        from_balance = min(self.free[provider], t.settled.paid)
        from_stake = min(self.stake[provider], t.settled.paid - from_balance)
        self.free[provider] -= from_balance
        self.stake[provider] -= from_stake
        self.standing(provider)
        self.holds[t.rec.trade_id] = Hold(buyer, provider, from_balance + from_stake, from_stake)
        t.status = CLOSED
        self.statuses_written = True
        ev = self.event(receipt, "DisputeOpened")
        assert (ev["held"], ev["from_stake"]) == (from_balance + from_stake, from_stake)
        self.pay_again(t)

    @precondition(lambda self: self.holds)
    @rule(data=st.data())
    def resolve(self, data: st.DataObject) -> None:
        trade_id = data.draw(st.sampled_from(sorted(self.holds)), label="dispute")
        h = self.holds[trade_id]
        pay_provider = data.draw(st.booleans(), label="provider was right")
        slash = data.draw(st.sampled_from([0, 10, 10 * MIN_STAKE]), label="slash")
        who = data.draw(st.sampled_from(["arbiter", "arbiter", "stranger"]), label="ruler")
        reason = None
        if who != "arbiter":
            reason = "market: not arbiter"
        elif pay_provider and slash:
            reason = "market: slash without fault"
        fn = self.m.market.functions.resolve_dispute
        receipt = self.act(fn(trade_id, pay_provider, slash), who, reason)
        if receipt is None:
            return
        slashed = restaked = 0
        if pay_provider:
            # what came from the stake goes back to it, unless the provider has left
            restaked = h.from_stake if self.state[h.provider] != 0 else 0
            self.stake[h.provider] += restaked
            self.free[h.provider] += h.held - restaked
        else:
            slashed = min(slash, self.stake[h.provider])
            self.stake[h.provider] -= slashed
            self.free[h.buyer] += h.held + slashed
        self.standing(h.provider)
        del self.holds[trade_id]
        ev = self.event(receipt, "DisputeResolved")
        assert (ev["provider_paid"], ev["amount"], ev["slashed"], ev["restaked"]) == (pay_provider, h.held, slashed, restaked)
        # a ruling pays once, either way
        for again in (True, False):
            self.refuse(fn(trade_id, again, 0), "arbiter", "market: no dispute")

    # ---------------------------------------------------------- providers
    @rule(provider=st.sampled_from(PROVIDERS), amount=st.sampled_from([1, MIN_STAKE]))
    def add_stake(self, provider: str, amount: int) -> None:
        reason = None
        if self.state[provider] == 0:
            reason = "market: not provider"
        elif self.state[provider] > 2:
            reason = "market: exiting"
        receipt = self.act(self.m.market.functions.add_stake(amount), provider, reason)
        if receipt is None:
            return
        self.stake[provider] += amount
        self.wallet[provider] -= amount
        self.standing(provider)
        assert self.event(receipt, "StakeAdded")["stake"] == self.stake[provider]

    # one provider leaves at most: the others keep the market trading
    @precondition(lambda self: all(self.state[p] in (1, 2) for p in PROVIDERS))
    @rule(provider=st.sampled_from(PROVIDERS))
    def request_exit(self, provider: str) -> None:
        now = self.now()
        receipt = self.send(self.m.market.functions.request_exit(), provider)
        self.state[provider] = now + EXIT_DELAY
        assert self.event(receipt, "ExitRequested")["exit_at"] == now + EXIT_DELAY
        # a leaving provider takes no new trades, cannot ask twice, nor leave early
        o = self.m.order(BUYERS[0], order_id=next(self.ids))
        self.refuse(self.record_call([o], [self.m.fill(o, provider, trade_id=next(self.ids))]),
                    "operator", "market: bad provider")
        self.refuse(self.m.market.functions.request_exit(), provider, "market: exiting")
        self.refuse(self.m.market.functions.exit(), provider, "market: too early")

    @precondition(lambda self: any(self.exit_due(p) for p in PROVIDERS))
    @rule(data=st.data())
    def exit(self, data: st.DataObject) -> None:
        provider = self.pick(data, PROVIDERS, "provider", self.exit_due)
        reason = None
        if self.state[provider] == 0:
            reason = "market: not provider"
        elif self.state[provider] in (1, 2):
            reason = "market: exit not requested"
        elif self.now() < self.state[provider]:
            reason = "market: too early"
        receipt = self.act(self.m.market.functions.exit(), provider, reason)
        if receipt is None:
            return
        assert self.event(receipt, "ProviderExited")["stake"] == self.stake[provider]
        self.wallet[provider] += self.stake[provider]
        self.stake[provider] = 0
        self.state[provider] = 0
        assert self.token_balance(provider) == self.wallet[provider]
        self.refuse(self.m.market.functions.exit(), provider, "market: not provider")
        # its key is gone: its open trades can only be refunded now
        for t in self.trades.values():
            if t.status == OPEN and self.name_of[t.rec.provider] == provider:
                completions = [self.completion(t, "all")]
                reason = self.settlement_reason(completions)
                assert reason is not None
                self.refuse(self.unsigned_settle_call(completions), "operator", reason)

    # --------------------------------------------------------------- time
    @rule(data=st.data())
    def travel(self, data: st.DataObject) -> None:
        """Jump to an edge that matters (the last second a trade can settle or
        the first it can be refunded, the last second of a dispute window or
        the first after it, the first second a provider can leave, or the
        one before), or ten minutes on."""
        before = self.now()
        edges = {before + 10 * 60}
        for t in self.trades.values():
            if t.status == OPEN:
                edges |= {t.rec.deadline + GRACE, t.rec.deadline + GRACE + 1}
            if t.status == SETTLED and t.settled is not None:
                edges |= {t.settled.at + WINDOW, t.settled.at + WINDOW + 1}
        edges |= {e for p in PROVIDERS if self.state[p] > 1 for e in (self.state[p] - 1, self.state[p])}
        target = data.draw(st.sampled_from(sorted(e for e in edges if e > before)), label="to")
        self.chain.time_travel(target)
        # the node agrees: the harness tracks the next block's time, anvil reports it as pending
        assert self.now() == int(self.m.w3.eth.get_block("pending")["timestamp"]) == target
        # a dispute window that closed on the way stays closed
        for t in self.trades.values():
            if t.status == SETTLED and t.settled and t.settled.at + WINDOW >= before:
                reason = self.dispute_reason(t, self.name_of[t.rec.buyer])
                if reason is not None:
                    self.refuse(self.dispute_call(t), self.name_of[t.rec.buyer], reason)

    # --------------------------------------------------------- invariants
    @invariant()
    def books_balance(self) -> None:
        m = self.m
        block = m.w3.eth.block_number
        if block == self.verified_block:
            return  # nothing was mined since the last check: nothing changed
        free = {n: self.view("balance_of", m.roles[n]) for n in ACCOUNTS}
        locked = sum(t.rec.lock for t in self.trades.values() if t.status == OPEN)
        staked = sum(self.stake.values())
        held = sum(h.held for h in self.holds.values())
        owed = sum(self.free.values()) + locked + staked + held
        assert self.view("balanceOf", m.market.address, contract=m.token) == owed
        # the market's own books, with no help from the model
        totals = [self.view("total_locked"), self.view("total_staked"), self.view("total_held")]
        assert sum(free.values()) + sum(totals) == owed
        # and every view the model predicts
        assert totals == [locked, staked, held]
        assert free == self.free
        for p in PROVIDERS:
            assert tuple(self.view("providers", m.roles[p]))[:2] == (self.state[p], self.stake[p]), p
        for trade_id, h in self.holds.items():
            d = self.view("disputes", trade_id)
            assert (to_checksum_address(d[0]), to_checksum_address(d[1]), d[2], d[3]) == (
                m.roles[h.buyer], m.roles[h.provider], h.held, h.from_stake)
        if self.statuses_written:
            self.check_statuses()
        self.verified_block = block

    @invariant()
    def no_trade_pays_twice(self) -> None:
        twice = {i: ways for i, ways in self.payouts.items() if len(ways) > 1}
        assert not twice, f"trades paid more than once: {twice}"

    def check_statuses(self) -> None:
        # every trade's, not only the ones the step meant to touch: statuses
        # share bitmap words
        for trade_id, t in self.trades.items():
            assert self.view("trade_status", trade_id) == t.status, f"trade {trade_id}"
        self.statuses_written = False


def test_random_sequences_keep_the_books_balanced_and_pay_each_trade_once(world: World) -> None:
    run_state_machine_as_test(lambda: MarketMachine(world), settings=SETTINGS)

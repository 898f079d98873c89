# pragma version 0.4.3
# @license Apache-2.0
"""
@title GridBid market: escrow and batched settlement of GPU-compute trades
@notice Buyers deposit a stablecoin; the operator records auction trades in
        batches, locking price x GPUs x duration from each buyer's balance;
        providers co-sign a Merkle root of completion receipts with BLS and
        the operator settles a whole batch with one aggregate pairing check.
        Money only leaves through `withdraw` and `exit` (pull payments), and
        both stay open while the market is paused.

        Buyer consent (why not one EIP-712 signature per trade): a buyer signs
        each *order* once as EIP-712 typed data (domain "GridBid", "1", chain
        id, this contract). `record_trades` takes the signed orders of the
        batch and the trades that fill them; it runs ecrecover once per order,
        not once per trade, checks every trade's price against the order's
        max price and the GPUs of all its trades against the order's GPUs,
        and marks the order id used in a bitmap. The order is therefore
        consumed by the batch that fills it: it cannot be replayed, nor filled
        twice, nor over-filled, and a trade can only lock what its buyer
        signed for: the same guarantee as a signature per trade, for one
        ecrecover per order and one bit of storage.

        Storage is tight because storage is the bill: a recorded trade costs
        two bits (its status in a bitmap keyed by the off-chain trade id); the
        trade itself is committed as a leaf of the batch's Merkle root, and
        settlement, refund and dispute present the trade again and prove it.
        Balances of the buyers and providers of a batch are summed in memory
        and written once per run of equal addresses.

        Disputes are backed by the provider's stake: settled payments are
        withdrawable at once; a buyer's dispute inside the window holds the
        disputed amount from the provider's balance, then its stake, for the
        arbiter to pay back or refund (and slash).
@dev    Hashing is mirrored in contracts/merkle.py and contracts/orders.py.
"""

from ethereum.ercs import IERC20
import bls12_381 as bls

# ---------------------------------------------------------------- limits
# Vyper copies array arguments into memory at their maximum size and memory
# is priced quadratically, so the bounds are as small as the batches allow.
MAX_TRADES: constant(uint256) = 512
MAX_ORDERS: constant(uint256) = 256
MAX_SIGNERS: constant(uint256) = 128
MAX_SEGMENTS: constant(uint256) = 16
MAX_FILLERS: constant(uint256) = 512
MAX_DEPTH: constant(uint256) = 16

# ------------------------------------------------------- trade statuses
UNKNOWN: constant(uint256) = 0
OPEN: constant(uint256) = 1
SETTLED: constant(uint256) = 2
CLOSED: constant(uint256) = 3

# bit 128 of a balance word marks the account as touched, so later writes
# are 2,900-gas updates instead of 20,000-gas fresh slots
TOUCHED: constant(uint256) = 1 << 128
AMOUNT_MASK: constant(uint256) = (1 << 128) - 1
U128: constant(uint256) = (1 << 128) - 1
U64: constant(uint256) = (1 << 64) - 1
U32: constant(uint256) = (1 << 32) - 1
U16: constant(uint256) = (1 << 16) - 1
S_MASK: constant(uint256) = (1 << 255) - 1

SECP256K1_N_HALF: constant(uint256) = 57896044618658097711785492504343953926418782139537452191302581570759080747168

ORDER_TYPEHASH: constant(bytes32) = keccak256(
    "Order(uint256 orderId,address buyer,uint256 maxPrice,uint256 gpus,uint256 duration,uint256 deadline)"
)
DOMAIN_TYPEHASH: constant(bytes32) = keccak256(
    "EIP712Domain(string name,string version,uint256 chainId,address verifyingContract)"
)
NAME_HASH: constant(bytes32) = keccak256("GridBid")
VERSION_HASH: constant(bytes32) = keccak256("1")
SETTLEMENT_TAG: constant(bytes32) = keccak256("GridBid.settlement.v1")

# ---------------------------------------------------------------- types
# Calldata and memory are the bill at scale, so the batch structs pack their
# small fields into words (contracts/batches.py builds them):
#   order terms: max_price << 128 | gpus << 96 | duration << 64 | deadline
#   trade terms: order index << 160 | price << 32 | gpus
#   receipt terms: price << 128 | gpus << 96 | duration << 64 | deadline
#   receipt place: gpu_seconds << 128 | signer index << 96 | position << 64 | batch
# The signature is EIP-2098 compact: vs = (v - 27) << 255 | s.
struct SignedOrder:
    order_id: uint256
    buyer: address
    terms: uint256
    r: bytes32
    vs: bytes32

struct TradeIn:
    trade_id: uint256
    provider: address
    terms: uint256

struct Trade:
    trade_id: uint256
    buyer: address
    provider: address
    price: uint256
    gpus: uint256
    duration: uint256
    deadline: uint256

struct Receipt:
    trade_id: uint256
    buyer: address
    terms: uint256
    place: uint256
    digest: bytes32

struct Coverage:
    batch: uint256
    size: uint256

struct Provider:
    state: uint256
    stake: uint256
    pk0: uint256
    pk1: uint256
    pk2: uint256

struct Dispute:
    buyer: address
    provider: address
    held: uint256
    from_stake: uint256

# --------------------------------------------------------------- events
event Deposited:
    buyer: indexed(address)
    amount: uint256

event Withdrawn:
    account: indexed(address)
    amount: uint256

event ProviderRegistered:
    provider: indexed(address)
    stake: uint256
    pubkey: Bytes[128]

event ExitRequested:
    provider: indexed(address)
    exit_at: uint256

event ProviderExited:
    provider: indexed(address)
    stake: uint256

event TradesRecorded:
    batch: indexed(uint256)
    root: bytes32
    trades: uint256
    locked: uint256

event BatchSettled:
    root: indexed(bytes32)
    trades: uint256
    paid: uint256
    refunded: uint256

event TradeRefunded:
    trade_id: indexed(uint256)
    buyer: indexed(address)
    amount: uint256

event DisputeOpened:
    trade_id: indexed(uint256)
    buyer: indexed(address)
    provider: indexed(address)
    held: uint256

event DisputeResolved:
    trade_id: indexed(uint256)
    provider_paid: bool
    amount: uint256
    slashed: uint256

event PausedSet:
    paused: bool

event OperatorChanged:
    operator: indexed(address)

event ArbiterChanged:
    arbiter: indexed(address)

# -------------------------------------------------------------- storage
token: public(immutable(IERC20))
min_stake: public(immutable(uint256))
grace_period: public(immutable(uint256))
dispute_window: public(immutable(uint256))
exit_delay: public(immutable(uint256))
_CACHED_CHAIN_ID: immutable(uint256)
_CACHED_DOMAIN: immutable(bytes32)

admin: public(address)
operator: public(address)
arbiter: public(address)
paused: public(bool)

_balances: HashMap[address, uint256]
providers: public(HashMap[address, Provider])
trade_status_words: HashMap[uint256, uint256]
order_used_words: HashMap[uint256, uint256]
record_roots: public(HashMap[uint256, bytes32])
record_batches: public(uint256)
settled_at: public(HashMap[bytes32, uint256])
disputes: public(HashMap[uint256, Dispute])
total_locked: public(uint256)
total_staked: public(uint256)
total_held: public(uint256)


@deploy
def __init__(
    _token: address,
    _admin: address,
    _operator: address,
    _arbiter: address,
    _min_stake: uint256,
    _grace_period: uint256,
    _dispute_window: uint256,
    _exit_delay: uint256,
):
    assert _token != empty(address), "market: zero token"
    assert _exit_delay >= _dispute_window, "market: exit delay below dispute window"
    token = IERC20(_token)
    min_stake = _min_stake
    grace_period = _grace_period
    dispute_window = _dispute_window
    exit_delay = _exit_delay
    _CACHED_CHAIN_ID = chain.id
    _CACHED_DOMAIN = self._build_domain()
    self.admin = _admin
    self.operator = _operator
    self.arbiter = _arbiter
    log OperatorChanged(operator=_operator)
    log ArbiterChanged(arbiter=_arbiter)


# ---------------------------------------------------------------- views
@external
@view
def balance_of(account: address) -> uint256:
    """
    @notice Free (withdrawable) balance of a buyer or provider.
    """
    return self._balances[account] & AMOUNT_MASK


@external
@view
def trade_status(trade_id: uint256) -> uint256:
    """
    @notice 0 unknown, 1 open (locked), 2 settled, 3 closed (refunded or disputed).
    """
    return (self.trade_status_words[trade_id >> 7] >> ((trade_id & 127) << 1)) & 3


@external
@view
def order_used(order_id: uint256) -> bool:
    """
    @notice Whether an order id has been consumed by a recorded batch.
    """
    return (self.order_used_words[order_id >> 8] >> (order_id & 255)) & 1 == 1


@external
@view
def domain_separator() -> bytes32:
    """
    @notice The EIP-712 domain separator of orders on this chain.
    """
    return self._domain()


@external
@view
def settlement_message(root: bytes32) -> bytes32:
    """
    @notice The 32 bytes providers sign with BLS for a completion root: it
            binds the root to this chain and this contract.
    """
    return self._settlement_message(root)


# ---------------------------------------------------------------- buyers
@external
@nonreentrant
def deposit(amount: uint256):
    """
    @notice Pull `amount` tokens from the caller (after `approve`) into its free balance.
    """
    assert not self.paused, "market: paused"
    assert amount > 0, "market: zero amount"
    self._credit(msg.sender, amount)
    log Deposited(buyer=msg.sender, amount=amount)
    assert extcall token.transferFrom(msg.sender, self, amount, default_return_value=True), "market: transfer failed"


@external
@nonreentrant
def withdraw(amount: uint256):
    """
    @notice Pay `amount` of the caller's free balance (a buyer's unlocked
            escrow or a provider's earnings) out to the caller. Open while paused.
    """
    assert amount > 0, "market: zero amount"
    word: uint256 = self._balances[msg.sender]
    assert word & AMOUNT_MASK >= amount, "market: low balance"
    self._balances[msg.sender] = word - amount
    log Withdrawn(account=msg.sender, amount=amount)
    assert extcall token.transfer(msg.sender, amount, default_return_value=True), "market: transfer failed"


# ------------------------------------------------------------- providers
@external
@nonreentrant
def register(pubkey: Bytes[128], pop: Bytes[256], stake: uint256):
    """
    @notice Join as a provider: pull `stake` (>= min_stake) and register a
            BLS public key (EIP-2537 G1) with its proof of possession (EIP-2537
            G2), verified here so no rogue key can cancel others in an aggregate.
    """
    assert not self.paused, "market: paused"
    assert self.providers[msg.sender].state == 0, "market: already registered"
    assert stake >= min_stake, "market: stake below minimum"
    assert len(pubkey) == 128 and len(pop) == 256, "market: bad key encoding"
    assert bls.pop_verify(pubkey, pop), "market: bad pop"
    x_hi: uint256 = convert(slice(pubkey, 0, 32), uint256)
    y_hi: uint256 = convert(slice(pubkey, 64, 32), uint256)
    self.providers[msg.sender] = Provider(
        state=1,
        stake=stake,
        pk0=(x_hi << 128) | y_hi,
        pk1=convert(slice(pubkey, 32, 32), uint256),
        pk2=convert(slice(pubkey, 96, 32), uint256),
    )
    # touch the balance word now so the first settlement updates a warm-able slot
    self._balances[msg.sender] |= TOUCHED
    self.total_staked += stake
    log ProviderRegistered(provider=msg.sender, stake=stake, pubkey=pubkey)
    if stake > 0:
        assert extcall token.transferFrom(msg.sender, self, stake, default_return_value=True), "market: transfer failed"


@external
def request_exit():
    """
    @notice Stop taking trades; the stake can leave after `exit_delay`
            (at least the dispute window), once disputes had their chance.
    """
    state: uint256 = self.providers[msg.sender].state
    assert state != 0, "market: not provider"
    assert state == 1, "market: exiting"
    exit_at: uint256 = block.timestamp + exit_delay
    self.providers[msg.sender].state = exit_at
    log ExitRequested(provider=msg.sender, exit_at=exit_at)


@external
@nonreentrant
def exit():
    """
    @notice After the exit delay, deregister and pay the remaining stake out.
            Earnings stay in the free balance for `withdraw`. Open while paused.
    """
    state: uint256 = self.providers[msg.sender].state
    assert state != 0, "market: not provider"
    assert state > 1, "market: exit not requested"
    assert block.timestamp >= state, "market: too early"
    stake: uint256 = self.providers[msg.sender].stake
    self.providers[msg.sender] = empty(Provider)
    self.total_staked -= stake
    log ProviderExited(provider=msg.sender, stake=stake)
    if stake > 0:
        assert extcall token.transfer(msg.sender, stake, default_return_value=True), "market: transfer failed"


# -------------------------------------------------------------- operator
@external
def record_trades(orders: DynArray[SignedOrder, MAX_ORDERS], trades: DynArray[TradeIn, MAX_TRADES]) -> uint256:
    """
    @notice Lock price x gpus x duration / 3600 from each trade's buyer, with
            the buyer's consent checked on chain: each trade fills one of the
            signed `orders` (index `order`), every order is signed by its
            buyer, unused, unexpired and filled by at least one trade, with
            prices <= its max price and GPUs <= its GPUs in total.
            Orders sorted by buyer and trades by order and id cost least.
    @return The record batch number; its Merkle root (contracts/merkle.py,
            trade leaves in `trades` order) is `record_roots(batch)`.
    """
    assert msg.sender == self.operator, "market: not operator"
    assert not self.paused, "market: paused"
    assert len(trades) > 0, "market: empty batch"
    domain: bytes32 = self._domain()

    # consent: one ecrecover per order, each order id used once
    filled: DynArray[uint256, MAX_ORDERS] = []
    locked: DynArray[uint256, MAX_ORDERS] = []
    word_key: uint256 = max_value(uint256)
    word: uint256 = 0
    for oi: uint256 in range(len(orders), bound=MAX_ORDERS):
        # index loops: a by-value loop over an argument copies it whole
        o: SignedOrder = orders[oi]
        assert block.timestamp < o.terms & U64, "market: order expired"
        vs: uint256 = convert(o.vs, uint256)
        struct_hash: bytes32 = keccak256(
            abi_encode(
                ORDER_TYPEHASH, o.order_id, o.buyer, o.terms >> 128, (o.terms >> 96) & U32, (o.terms >> 64) & U32, o.terms & U64
            )
        )
        signer: address = ecrecover(
            keccak256(concat(b"\x19\x01", domain, struct_hash)), 27 + (vs >> 255), o.r, vs & S_MASK
        )
        assert signer == o.buyer and signer != empty(address), "market: bad order signature"
        key: uint256 = o.order_id >> 8
        if key != word_key:
            if word_key != max_value(uint256):
                self.order_used_words[word_key] = word
            word_key = key
            word = self.order_used_words[key]
        bit: uint256 = 1 << (o.order_id & 255)
        assert word & bit == 0, "market: order used"
        word |= bit
        filled.append(0)
        locked.append(0)
    if word_key != max_value(uint256):
        self.order_used_words[word_key] = word

    # trades: status bits, fills, leaves
    leaves: DynArray[bytes32, MAX_TRADES] = []
    word_key = max_value(uint256)
    word = 0
    last_provider: address = empty(address)
    for ti: uint256 in range(len(trades), bound=MAX_TRADES):
        t: TradeIn = trades[ti]
        oi: uint256 = t.terms >> 160
        assert oi < len(orders), "market: unknown order"
        o: SignedOrder = orders[oi]
        price: uint256 = (t.terms >> 32) & U128
        gpus: uint256 = t.terms & U32
        duration: uint256 = (o.terms >> 64) & U32
        assert price <= o.terms >> 128, "market: price above order"
        assert gpus > 0, "market: zero gpus"
        if t.provider != last_provider:
            assert self.providers[t.provider].state == 1, "market: bad provider"
            last_provider = t.provider
        # price < 2**128, gpus and duration < 2**32, at most MAX_TRADES terms: no overflow
        filled[oi] = unsafe_add(filled[oi], gpus)
        locked[oi] = unsafe_add(locked[oi], unsafe_div(unsafe_mul(unsafe_mul(price, gpus), duration), 3600))

        key: uint256 = t.trade_id >> 7
        if key != word_key:
            if word_key != max_value(uint256):
                self.trade_status_words[word_key] = word
            word_key = key
            word = self.trade_status_words[key]
        offset: uint256 = (t.trade_id & 127) << 1
        assert (word >> offset) & 3 == UNKNOWN, "market: trade exists"
        word |= OPEN << offset

        leaves.append(keccak256(concat(b"\x02", abi_encode(t.trade_id, o.buyer, t.provider, price, gpus, duration, o.terms & U64))))
    self.trade_status_words[word_key] = word

    # debit buyers once per run of equal buyers
    total: uint256 = 0
    run_buyer: address = empty(address)
    run_amount: uint256 = 0
    for i: uint256 in range(len(orders), bound=MAX_ORDERS):
        assert filled[i] > 0, "market: order not filled"
        assert filled[i] <= (orders[i].terms >> 96) & U32, "market: order over-filled"
        buyer: address = orders[i].buyer
        if buyer != run_buyer:
            self._debit(run_buyer, run_amount)
            run_buyer = buyer
            run_amount = 0
        # each at most MAX_TRADES locks below 2**192: no overflow
        run_amount = unsafe_add(run_amount, locked[i])
        total = unsafe_add(total, locked[i])
    self._debit(run_buyer, run_amount)

    # Merkle root, in place (contracts/merkle.py): index-ordered pairs, an odd
    # last node pairs with zero
    n: uint256 = len(leaves)
    for _: uint256 in range(MAX_DEPTH):
        if n <= 1:
            break
        half: uint256 = (n + 1) >> 1
        for k: uint256 in range(half, bound=MAX_TRADES):
            right: bytes32 = empty(bytes32)
            j: uint256 = unsafe_add(k, k)
            if unsafe_add(j, 1) < n:
                right = leaves[unsafe_add(j, 1)]
            leaves[k] = keccak256(concat(b"\x01", leaves[j], right))
        n = half
    root: bytes32 = leaves[0]

    batch: uint256 = self.record_batches
    self.record_roots[batch] = root
    self.record_batches = batch + 1
    self.total_locked += total
    log TradesRecorded(batch=batch, root=root, trades=len(trades), locked=total)
    return batch


@external
def settle_batch(
    root: bytes32,
    receipts: DynArray[Receipt, MAX_TRADES],
    signers: DynArray[address, MAX_SIGNERS],
    aggregate_signature: Bytes[256],
    coverage: DynArray[Coverage, MAX_SEGMENTS],
    fillers: DynArray[bytes32, MAX_FILLERS],
):
    """
    @notice Settle completed trades. `root` is the Merkle root of the
            receipts' leaves (trade id, GPU-seconds, digest) in `receipts`
            order; every provider of the batch, and only they, are `signers`
            (strictly ascending), and `aggregate_signature` is their BLS
            aggregate over `settlement_message(root)`, checked against the sum
            of their registered keys. Each receipt pays its provider
            price x GPU-seconds / 3600 (at most the lock), returns the rest to
            the buyer and marks the trade settled.
    @dev    Trades are proven against their record roots without per-trade
            proofs: `coverage` lists each record batch touched (in order, with
            its size); receipts are sorted by (batch, position) and the
            leaves of that batch's trades not settled here are `fillers`, in
            position order. The contract rebuilds each record root.
    """
    assert msg.sender == self.operator, "market: not operator"
    assert not self.paused, "market: paused"
    n: uint256 = len(receipts)
    assert n > 0, "market: empty batch"
    assert len(signers) > 0, "market: no signers"
    assert self.settled_at[root] == 0, "market: root settled"

    # signers strictly ascending: no duplicate key in the aggregate
    previous: uint256 = 0
    for si: uint256 in range(len(signers), bound=MAX_SIGNERS):
        s: uint256 = convert(signers[si], uint256)
        assert s > previous, "market: unsorted signers"
        previous = s

    credits: DynArray[uint256, MAX_SIGNERS] = []
    for _: uint256 in range(len(signers), bound=MAX_SIGNERS):
        credits.append(0)
    seen: uint256 = 0
    receipt_leaves: DynArray[bytes32, MAX_TRADES] = []
    total_paid: uint256 = 0
    total_refunded: uint256 = 0
    run_buyer: address = empty(address)
    run_amount: uint256 = 0
    word_key: uint256 = max_value(uint256)
    word: uint256 = 0
    ri: uint256 = 0
    fi: uint256 = 0
    n_leaves: uint256 = 0

    # one pass per record batch touched, then a last pass for the completion root
    for ci: uint256 in range(len(coverage) + 1, bound=MAX_SEGMENTS + 1):
        leaves: DynArray[bytes32, MAX_TRADES] = []
        expected: bytes32 = root
        seg: Coverage = empty(Coverage)
        if ci < len(coverage):
            seg = coverage[ci]
            expected = self.record_roots[seg.batch]
        else:
            assert ri == n, "market: stray receipt"
            assert fi == len(fillers), "market: unused filler"
            leaves = receipt_leaves
        for pos: uint256 in range(seg.size, bound=MAX_TRADES):
            r: Receipt = empty(Receipt)
            if ri < n:
                r = receipts[ri]
            if ri < n and r.place & U64 == seg.batch and (r.place >> 64) & U32 == pos:
                ri = unsafe_add(ri, 1)
                signer: uint256 = (r.place >> 96) & U32
                assert signer < len(signers), "market: bad signer"
                price: uint256 = r.terms >> 128
                gpus: uint256 = (r.terms >> 96) & U32
                duration: uint256 = (r.terms >> 64) & U32
                deadline: uint256 = r.terms & U64
                gpu_seconds: uint256 = r.place >> 128
                leaves.append(keccak256(concat(b"\x02", abi_encode(r.trade_id, r.buyer, signers[signer], price, gpus, duration, deadline))))
                receipt_leaves.append(keccak256(concat(b"\x00", abi_encode(r.trade_id, gpu_seconds, r.digest))))
                assert block.timestamp <= deadline + grace_period, "market: trade expired"
                seen |= 1 << signer

                key: uint256 = r.trade_id >> 7
                if key != word_key:
                    if word_key != max_value(uint256):
                        self.trade_status_words[word_key] = word
                    word_key = key
                    word = self.trade_status_words[key]
                offset: uint256 = (r.trade_id & 127) << 1
                assert (word >> offset) & 3 == OPEN, "market: trade not open"
                word ^= (OPEN ^ SETTLED) << offset

                # price < 2**128; gpus, duration < 2**32; gpu_seconds < 2**128: no overflow
                lock: uint256 = unsafe_div(unsafe_mul(unsafe_mul(price, gpus), duration), 3600)
                paid: uint256 = min(lock, unsafe_div(unsafe_mul(price, gpu_seconds), 3600))
                credits[signer] = unsafe_add(credits[signer], paid)
                total_paid = unsafe_add(total_paid, paid)
                if r.buyer != run_buyer:
                    self._credit(run_buyer, run_amount)
                    run_buyer = r.buyer
                    run_amount = 0
                run_amount = unsafe_add(run_amount, unsafe_sub(lock, paid))
                total_refunded = unsafe_add(total_refunded, unsafe_sub(lock, paid))
            else:
                assert fi < len(fillers), "market: no filler"
                leaves.append(fillers[fi])
                fi = unsafe_add(fi, 1)
        # rebuild the root in place (contracts/merkle.py)
        m: uint256 = len(leaves)
        assert m > 0, "market: unknown trade"
        for _: uint256 in range(MAX_DEPTH):
            if m <= 1:
                break
            half: uint256 = (m + 1) >> 1
            for k: uint256 in range(half, bound=MAX_TRADES):
                right: bytes32 = empty(bytes32)
                j: uint256 = unsafe_add(k, k)
                if unsafe_add(j, 1) < m:
                    right = leaves[unsafe_add(j, 1)]
                leaves[k] = keccak256(concat(b"\x01", leaves[j], right))
            m = half
        if ci < len(coverage):
            assert leaves[0] == expected, "market: unknown trade"
        else:
            assert leaves[0] == expected, "market: root mismatch"
    assert seen == (1 << len(signers)) - 1, "market: idle signer"
    self.trade_status_words[word_key] = word
    self._credit(run_buyer, run_amount)

    # one aggregate BLS check for the whole batch
    agg: Bytes[128] = b""
    for i: uint256 in range(len(signers), bound=MAX_SIGNERS):
        p: address = signers[i]
        pk0: uint256 = self.providers[p].pk0
        assert pk0 != 0, "market: unknown signer"
        pk: Bytes[128] = concat(
            convert(pk0 >> 128, bytes32),
            convert(self.providers[p].pk1, bytes32),
            convert(pk0 & AMOUNT_MASK, bytes32),
            convert(self.providers[p].pk2, bytes32),
        )
        if i == 0:
            agg = pk
        else:
            agg = bls.g1_add(agg, pk)
        self._credit(p, credits[i])
    message: bytes32 = self._settlement_message(root)
    assert bls.verify(agg, concat(message, b""), aggregate_signature), "market: bad signature"

    self.settled_at[root] = block.timestamp
    self.total_locked -= total_paid + total_refunded
    log BatchSettled(root=root, trades=n, paid=total_paid, refunded=total_refunded)


# ----------------------------------------------------------------- anyone
@external
def refund_expired(trade: Trade, batch: uint256, position: uint256, proof: DynArray[bytes32, MAX_DEPTH]):
    """
    @notice After a trade's deadline plus the grace period, with no
            settlement, anyone can return its lock to the buyer, proving the
            trade against its record root. Open while paused.
    """
    assert block.timestamp > trade.deadline + grace_period, "market: not expired"
    self._prove(
        self._trade_leaf(trade.trade_id, trade.buyer, trade.provider, trade.price, trade.gpus, trade.duration, trade.deadline),
        proof,
        self.record_roots[batch],
        position,
        "market: unknown trade",
    )
    self._set_status(trade.trade_id, OPEN, CLOSED, "market: trade not open")
    lock: uint256 = trade.price * trade.gpus * trade.duration // 3600
    self.total_locked -= lock
    self._credit(trade.buyer, lock)
    log TradeRefunded(trade_id=trade.trade_id, buyer=trade.buyer, amount=lock)


# ----------------------------------------------------------------- disputes
@external
def dispute(
    trade: Trade,
    batch: uint256,
    position: uint256,
    record_proof: DynArray[bytes32, MAX_DEPTH],
    gpu_seconds: uint256,
    digest: bytes32,
    root: bytes32,
    index: uint256,
    receipt_proof: DynArray[bytes32, MAX_DEPTH],
):
    """
    @notice A buyer contests a settled trade inside the dispute window: the
            amount paid for it is held (from the provider's balance, then its
            stake) until the arbiter decides. The trade and its receipt are
            proven against the record root and the settled completion root.
    """
    assert msg.sender == trade.buyer, "market: not buyer"
    settled: uint256 = self.settled_at[root]
    assert settled != 0, "market: root not settled"
    assert block.timestamp <= settled + dispute_window, "market: window closed"
    self._prove(
        self._trade_leaf(trade.trade_id, trade.buyer, trade.provider, trade.price, trade.gpus, trade.duration, trade.deadline),
        record_proof,
        self.record_roots[batch],
        position,
        "market: unknown trade",
    )
    self._prove(
        keccak256(concat(b"\x00", abi_encode(trade.trade_id, gpu_seconds, digest))),
        receipt_proof,
        root,
        index,
        "market: not in root",
    )
    self._set_status(trade.trade_id, SETTLED, CLOSED, "market: trade not settled")
    lock: uint256 = trade.price * trade.gpus * trade.duration // 3600
    paid: uint256 = min(lock, trade.price * gpu_seconds // 3600)

    word: uint256 = self._balances[trade.provider]
    from_balance: uint256 = min(word & AMOUNT_MASK, paid)
    self._balances[trade.provider] = word - from_balance
    from_stake: uint256 = min(self.providers[trade.provider].stake, paid - from_balance)
    if from_stake > 0:
        self.providers[trade.provider].stake -= from_stake
        self.total_staked -= from_stake
    held: uint256 = from_balance + from_stake
    self.disputes[trade.trade_id] = Dispute(
        buyer=trade.buyer, provider=trade.provider, held=held, from_stake=from_stake
    )
    self.total_held += held
    log DisputeOpened(trade_id=trade.trade_id, buyer=trade.buyer, provider=trade.provider, held=held)


@external
def resolve_dispute(trade_id: uint256, pay_provider: bool, slash: uint256):
    """
    @notice Arbiter's ruling. `pay_provider`: the held amount goes back to
            the provider. Otherwise it goes to the buyer, and the provider,
            found at fault, is slashed up to `slash` from its stake, also to
            the buyer.
    """
    assert msg.sender == self.arbiter, "market: not arbiter"
    d: Dispute = self.disputes[trade_id]
    assert d.buyer != empty(address), "market: no dispute"
    self.disputes[trade_id] = empty(Dispute)
    self.total_held -= d.held
    slashed: uint256 = 0
    if pay_provider:
        assert slash == 0, "market: slash without fault"
        # the provider was right: what was held (balance and stake) becomes free balance
        self._credit(d.provider, d.held)
    else:
        slashed = min(slash, self.providers[d.provider].stake)
        if slashed > 0:
            self.providers[d.provider].stake -= slashed
            self.total_staked -= slashed
        self._credit(d.buyer, d.held + slashed)
    log DisputeResolved(trade_id=trade_id, provider_paid=pay_provider, amount=d.held, slashed=slashed)


# ------------------------------------------------------------------ admin
@external
def set_paused(paused: bool):
    """
    @notice Emergency stop of deposits, registrations, recording and
            settlement. Withdrawals, exits, refunds and disputes stay open.
    """
    assert msg.sender == self.admin, "market: not admin"
    self.paused = paused
    log PausedSet(paused=paused)


@external
def set_operator(operator: address):
    """
    @notice Rotate the operator key.
    """
    assert msg.sender == self.admin, "market: not admin"
    assert operator != empty(address), "market: zero address"
    self.operator = operator
    log OperatorChanged(operator=operator)


@external
def set_arbiter(arbiter: address):
    """
    @notice Rotate the arbiter key.
    """
    assert msg.sender == self.admin, "market: not admin"
    assert arbiter != empty(address), "market: zero address"
    self.arbiter = arbiter
    log ArbiterChanged(arbiter=arbiter)


# --------------------------------------------------------------- internals
@internal
def _credit(account: address, amount: uint256):
    if account == empty(address):
        return
    word: uint256 = self._balances[account] | TOUCHED
    assert (word & AMOUNT_MASK) + amount <= AMOUNT_MASK, "market: balance overflow"
    self._balances[account] = word + amount


@internal
def _debit(account: address, amount: uint256):
    if account == empty(address):
        return
    word: uint256 = self._balances[account]
    assert word & AMOUNT_MASK >= amount, "market: low balance"
    self._balances[account] = word - amount


@internal
def _set_status(trade_id: uint256, expected: uint256, new: uint256, reason: String[32]):
    key: uint256 = trade_id >> 7
    offset: uint256 = (trade_id & 127) << 1
    word: uint256 = self.trade_status_words[key]
    assert (word >> offset) & 3 == expected, reason
    self.trade_status_words[key] = word ^ ((expected ^ new) << offset)


@internal
@pure
def _trade_leaf(
    trade_id: uint256, buyer: address, provider: address, price: uint256, gpus: uint256, duration: uint256, deadline: uint256
) -> bytes32:
    return keccak256(concat(b"\x02", abi_encode(trade_id, buyer, provider, price, gpus, duration, deadline)))


@internal
@pure
def _prove(leaf: bytes32, proof: DynArray[bytes32, MAX_DEPTH], root: bytes32, index: uint256, reason: String[32]):
    assert index >> len(proof) == 0, reason
    node: bytes32 = leaf
    i: uint256 = index
    for sibling: bytes32 in proof:
        if i & 1 == 1:
            node = keccak256(concat(b"\x01", sibling, node))
        else:
            node = keccak256(concat(b"\x01", node, sibling))
        i >>= 1
    assert root != empty(bytes32) and node == root, reason


@internal
@view
def _build_domain() -> bytes32:
    return keccak256(abi_encode(DOMAIN_TYPEHASH, NAME_HASH, VERSION_HASH, chain.id, self))


@internal
@view
def _domain() -> bytes32:
    if chain.id == _CACHED_CHAIN_ID:
        return _CACHED_DOMAIN
    return self._build_domain()


@internal
@view
def _settlement_message(root: bytes32) -> bytes32:
    return keccak256(abi_encode(SETTLEMENT_TAG, chain.id, self, root))

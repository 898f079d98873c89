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
        and written once per buyer, once per provider. A provider's key tag,
        state and settled earnings share one slot, so settling a provider
        reads and writes one slot; its keys come in calldata, checked
        against the tag. BLS verification lives in a separate stateless
        contract (BlsVerifier.vy) so this one stays under the size limit.

        Disputes are backed by the provider's stake: settled payments are
        withdrawable at once; a buyer's dispute inside the window holds the
        disputed amount from the provider's earnings and balance, then its
        stake, for the arbiter to pay back or refund (and slash). A provider
        whose exit is due within one dispute window is no longer settled.
@dev    Hashing is mirrored in contracts/merkle.py and contracts/orders.py.
"""

from ethereum.ercs import IERC20
import bls12_381 as bls

interface BlsVerifier:
    def verify(pubkey: Bytes[128], message: bytes32, signature: Bytes[256]) -> bool: view
    def pop_verify(pubkey: Bytes[128], proof: Bytes[256]) -> bool: view

# ---------------------------------------------------------------- limits
# Vyper copies array arguments into memory at their maximum size and memory
# is priced quadratically, so the bounds are as small as the batches allow.
MAX_TRADES: constant(uint256) = 128
MAX_ORDERS: constant(uint256) = 128
MAX_SIGNERS: constant(uint256) = 64
MAX_BUYERS: constant(uint256) = 128
MAX_SEGMENTS: constant(uint256) = 16
MAX_FILLERS: constant(uint256) = 256
MAX_DEPTH: constant(uint256) = 16

# ---------------------------------------------------- provider states
# (any larger state is the time a requested exit is due)
ACTIVE: constant(uint256) = 1
SUSPENDED: constant(uint256) = 2  # stake below min_stake: no new trades, no settlement

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
U40: constant(uint256) = (1 << 40) - 1
TAG_SHIFT: constant(uint256) = 104
U32: constant(uint256) = (1 << 32) - 1
U16: constant(uint256) = (1 << 16) - 1
S_MASK: constant(uint256) = (1 << 255) - 1
ADDRESS_MASK: constant(uint256) = (1 << 160) - 1

# an arbiter's slash takes at most this multiple of what the disputed trade paid
# (a 3.6-token trade can cost its provider 7.2 tokens of stake, not all of it)
MAX_SLASH_MULTIPLE: constant(uint256) = 2

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
# Calldata and memory are the bill at scale (Vyper copies array arguments
# into memory at their maximum size, and memory is priced quadratically), so
# the batch arguments pack their small fields into words and name buyers and
# providers once per batch, by index (contracts/batches.py builds them):
#   order terms: max_price << 128 | gpus << 96 | duration << 64 | deadline
#   trade: order index << 240 | provider index << 224 | trade_id << 160 | price << 32 | gpus
#   receipt terms: price << 128 | gpus << 96 | duration << 64 | deadline
#   receipt place: gpu_seconds << 192 | trade_id << 128 | batch << 64 | position << 32
#                  | signer index << 16 | buyer index
# The signature is EIP-2098 compact: vs = (v - 27) << 255 | s.
struct SignedOrder:
    order_id: uint256
    buyer: address
    terms: uint256
    r: bytes32
    vs: bytes32

struct Trade:
    trade_id: uint256
    buyer: address
    provider: address
    price: uint256
    gpus: uint256
    duration: uint256
    deadline: uint256

struct Receipt:
    terms: uint256
    place: uint256
    digest: bytes32

# A provider of a settlement with its registered BLS key, EIP-2537 G1 packed
# in three words: pk0 = x[0:32] << 128 | y[0:32] (each the 16 bytes after the
# padding), pk1 = x[32:64], pk2 = y[32:64]. The contract keeps only a hash.
struct Signer:
    account: address
    pk0: uint256
    pk1: uint256
    pk2: uint256

struct Coverage:
    batch: uint256
    size: uint256

# ident = key tag << 104 | state << 64 | earned: one slot holds everything
# settlement reads and writes of a signer. The key tag is the top 152 bits of
# keccak256(pk0, pk1, pk2); state is 0 (none), 1 (active), 2 (suspended:
# stake below min_stake) or the time its exit is due; earned is what settlements paid it and it has not withdrawn
# (its part of the free balance; past 2**64 it spills into the balance word).
struct Provider:
    ident: uint256
    stake: uint256

struct Dispute:
    buyer: address
    provider: address
    held: uint256
    from_stake: uint256
    paid: uint256  # what settlement paid for the trade: the slash is bounded by a multiple of it

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

event StakeAdded:
    provider: indexed(address)
    amount: uint256
    stake: uint256

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
    from_stake: uint256

event DisputeResolved:
    trade_id: indexed(uint256)
    provider_paid: bool
    amount: uint256
    slashed: uint256
    restaked: uint256

event PausedSet:
    paused: bool

event OperatorChanged:
    operator: indexed(address)

event ArbiterChanged:
    arbiter: indexed(address)

# -------------------------------------------------------------- storage
token: public(immutable(IERC20))
bls_verifier: public(immutable(BlsVerifier))
min_stake: public(immutable(uint256))
grace_period: public(immutable(uint256))
dispute_window: public(immutable(uint256))
exit_delay: public(immutable(uint256))
_CACHED_CHAIN_ID: immutable(uint256)
_CACHED_DOMAIN: immutable(bytes32)

admin: public(address)
arbiter: public(address)
# the operator and the pause flag share a slot (paused << 160 | operator), and so
# do the record batch count and the total locked (batches << 128 | locked): both
# record_trades and settle_batch read the first, record_trades writes the second,
# so each of them is one cold read (and one write) instead of two
_control: uint256
_batches_locked: uint256

_balances: HashMap[address, uint256]
_providers: HashMap[address, Provider]
trade_status_words: HashMap[uint256, uint256]
order_used_words: HashMap[uint256, uint256]
record_roots: public(HashMap[uint256, bytes32])
settled_at: public(HashMap[bytes32, uint256])
disputes: public(HashMap[uint256, Dispute])
total_staked: public(uint256)
total_held: public(uint256)


@deploy
def __init__(
    _token: address,
    _bls_verifier: address,
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
    assert _exit_delay < 1 << 32, "market: exit delay too long"
    assert _bls_verifier.is_contract, "market: no BLS verifier"
    token = IERC20(_token)
    bls_verifier = BlsVerifier(_bls_verifier)
    min_stake = _min_stake
    grace_period = _grace_period
    dispute_window = _dispute_window
    exit_delay = _exit_delay
    _CACHED_CHAIN_ID = chain.id
    _CACHED_DOMAIN = self._build_domain()
    self.admin = _admin
    self._control = convert(_operator, uint256)
    self.arbiter = _arbiter
    log OperatorChanged(operator=_operator)
    log ArbiterChanged(arbiter=_arbiter)


# ---------------------------------------------------------------- views
@external
@view
def operator() -> address:
    """
    @notice The account that records and settles batches.
    """
    return convert(self._control & ADDRESS_MASK, address)


@external
@view
def paused() -> bool:
    """
    @notice Whether deposits, registration, staking, recording and settlement
            are stopped (withdrawals, exits, refunds and disputes stay open).
    """
    return self._control >> 160 != 0


@external
@view
def record_batches() -> uint256:
    """
    @notice How many record batches there are; the next one gets this number.
    """
    return self._batches_locked >> 128


@external
@view
def total_locked() -> uint256:
    """
    @notice The sum of all open trades' locks.
    """
    return self._batches_locked & U128


@external
@view
def balance_of(account: address) -> uint256:
    """
    @notice Free (withdrawable) balance of a buyer or provider.
    """
    return (self._balances[account] & AMOUNT_MASK) + (self._providers[account].ident & U64)


@external
@view
def providers(account: address) -> (uint256, uint256, uint256):
    """
    @notice A provider's state (0 none, 1 active, 2 suspended below the
            minimum stake, else when its exit is due),
            stake, and the top 152 bits of keccak256 of its packed BLS key.
    """
    p: Provider = self._providers[account]
    return (p.ident >> 64) & U40, p.stake, p.ident >> TAG_SHIFT


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
    @notice Pull `amount` tokens from the caller (after `approve`) into its
            free balance. What is credited (and logged) is what the market's
            token balance grew by, so a token that takes a fee on transfer
            credits what arrived, never what was asked for.
    """
    assert self._control >> 160 == 0, "market: paused"
    assert amount > 0, "market: zero amount"
    received: uint256 = self._pull(amount)
    self._credit(msg.sender, received)
    log Deposited(buyer=msg.sender, amount=received)


@external
@nonreentrant
def withdraw(amount: uint256):
    """
    @notice Pay `amount` of the caller's free balance (a buyer's unlocked
            escrow or a provider's earnings) out to the caller. Open while paused.
    """
    assert amount > 0, "market: zero amount"
    # a provider's settled earnings first, then the balance word
    ident: uint256 = self._providers[msg.sender].ident
    from_earned: uint256 = min(ident & U64, amount)
    if from_earned > 0:
        self._providers[msg.sender].ident = ident - from_earned
    self._debit(msg.sender, amount - from_earned)
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
    assert self._control >> 160 == 0, "market: paused"
    assert self._providers[msg.sender].ident == 0, "market: already registered"
    assert stake >= min_stake, "market: stake below minimum"
    assert len(pubkey) == 128 and len(pop) == 256, "market: bad key encoding"
    assert staticcall bls_verifier.pop_verify(pubkey, pop), "market: bad pop"
    received: uint256 = 0
    if stake > 0:
        received = self._pull(stake)
    assert received >= min_stake, "market: stake received below minimum"
    self._providers[msg.sender] = Provider(
        ident=self._key_hash(
            (convert(slice(pubkey, 0, 32), uint256) << 128) | convert(slice(pubkey, 64, 32), uint256),
            convert(slice(pubkey, 32, 32), uint256),
            convert(slice(pubkey, 96, 32), uint256),
        ) | 1 << 64,
        stake=received,
    )
    self.total_staked += received
    log ProviderRegistered(provider=msg.sender, stake=received, pubkey=pubkey)


@external
@nonreentrant
def add_stake(amount: uint256):
    """
    @notice Top up the caller's stake (after `approve`). A provider suspended
            because disputes took its stake below `min_stake` is active again
            once the stake reaches it.
    """
    assert self._control >> 160 == 0, "market: paused"
    assert amount > 0, "market: zero amount"
    p: Provider = self._providers[msg.sender]
    assert p.ident != 0, "market: not provider"
    assert (p.ident >> 64) & U40 <= SUSPENDED, "market: exiting"
    received: uint256 = self._pull(amount)
    stake: uint256 = p.stake + received
    self._providers[msg.sender] = Provider(ident=self._standing(p.ident, stake), stake=stake)
    self.total_staked += received
    log StakeAdded(provider=msg.sender, amount=received, stake=stake)


@external
def request_exit():
    """
    @notice Stop taking trades; the stake can leave after `exit_delay`
            (at least the dispute window), once disputes had their chance.
    """
    ident: uint256 = self._providers[msg.sender].ident
    assert ident != 0, "market: not provider"
    state: uint256 = (ident >> 64) & U40
    assert state <= SUSPENDED, "market: exiting"
    exit_at: uint256 = block.timestamp + exit_delay
    self._providers[msg.sender].ident = ident - (state << 64) + (exit_at << 64)
    log ExitRequested(provider=msg.sender, exit_at=exit_at)


@external
@nonreentrant
def exit():
    """
    @notice After the exit delay, deregister and pay the remaining stake out.
            Earnings stay in the free balance for `withdraw`. Open while paused.
    """
    p: Provider = self._providers[msg.sender]
    assert p.ident != 0, "market: not provider"
    state: uint256 = (p.ident >> 64) & U40
    assert state > SUSPENDED, "market: exit not requested"
    assert block.timestamp >= state, "market: too early"
    stake: uint256 = p.stake
    self._providers[msg.sender] = empty(Provider)
    self._credit(msg.sender, p.ident & U64)
    self.total_staked -= stake
    log ProviderExited(provider=msg.sender, stake=stake)
    if stake > 0:
        assert extcall token.transfer(msg.sender, stake, default_return_value=True), "market: transfer failed"


# -------------------------------------------------------------- operator
@external
def record_trades(
    orders: DynArray[SignedOrder, MAX_ORDERS],
    providers: DynArray[address, MAX_SIGNERS],
    trades: DynArray[uint256, MAX_TRADES],
) -> uint256:
    """
    @notice Lock price x gpus x duration / 3600 from each trade's buyer, with
            the buyer's consent checked on chain: each trade fills one of the
            signed `orders` (by index), every order is signed by its buyer,
            unused, unexpired and filled by at least one trade, with prices
            <= its max price and GPUs <= its GPUs in total. Each trade names
            its provider by index in `providers`, every one of them active.
            Orders sorted by buyer cost least.
    @return The record batch number; its Merkle root (contracts/merkle.py,
            trade leaves in `trades` order) is `record_roots(batch)`.
    """
    control: uint256 = self._control
    assert msg.sender == convert(control & ADDRESS_MASK, address), "market: not operator"
    assert control >> 160 == 0, "market: paused"
    assert len(trades) > 0, "market: empty batch"
    domain: bytes32 = self._domain()

    for pi: uint256 in range(len(providers), bound=MAX_SIGNERS):
        assert (self._providers[providers[pi]].ident >> 64) & U40 == ACTIVE, "market: bad provider"

    # consent: one ecrecover per order, each order id used once
    fills: DynArray[uint256, MAX_ORDERS] = []  # per order: locked << 64 | GPUs filled
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
        fills.append(0)
    if word_key != max_value(uint256):
        self.order_used_words[word_key] = word

    # trades: status bits, fills, leaves
    leaves: DynArray[bytes32, MAX_TRADES] = []
    word_key = max_value(uint256)
    word = 0
    for ti: uint256 in range(len(trades), bound=MAX_TRADES):
        t: uint256 = trades[ti]
        oi: uint256 = t >> 240
        assert oi < len(orders), "market: unknown order"
        pi: uint256 = (t >> 224) & U16
        assert pi < len(providers), "market: unknown provider"
        trade_id: uint256 = (t >> 160) & U64
        price: uint256 = (t >> 32) & U128
        gpus: uint256 = t & U32
        terms: uint256 = orders[oi].terms
        duration: uint256 = (terms >> 64) & U32
        assert price <= terms >> 128, "market: price above order"
        assert gpus > 0, "market: zero gpus"
        # price < 2**128, gpus and duration < 2**32, at most MAX_TRADES terms: no overflow
        fills[oi] = unsafe_add(fills[oi], unsafe_add(unsafe_div(unsafe_mul(unsafe_mul(price, gpus), duration), 3600) << 64, gpus))

        key: uint256 = trade_id >> 7
        if key != word_key:
            if word_key != max_value(uint256):
                self.trade_status_words[word_key] = word
            word_key = key
            word = self.trade_status_words[key]
        offset: uint256 = (trade_id & 127) << 1
        assert (word >> offset) & 3 == UNKNOWN, "market: trade exists"
        word |= OPEN << offset

        leaves.append(keccak256(concat(b"\x02", abi_encode(trade_id, orders[oi].buyer, providers[pi], price, gpus, duration, terms & U64))))
    self.trade_status_words[word_key] = word

    # debit buyers once per run of equal buyers
    total: uint256 = 0
    run_buyer: address = empty(address)
    run_amount: uint256 = 0
    for i: uint256 in range(len(orders), bound=MAX_ORDERS):
        filled: uint256 = fills[i] & U64
        assert filled > 0, "market: order not filled"
        assert filled <= (orders[i].terms >> 96) & U32, "market: order over-filled"
        buyer: address = orders[i].buyer
        if buyer != run_buyer:
            self._debit(run_buyer, run_amount)
            run_buyer = buyer
            run_amount = 0
        # each at most MAX_TRADES locks below 2**192: no overflow
        run_amount = unsafe_add(run_amount, fills[i] >> 64)
        total = unsafe_add(total, fills[i] >> 64)
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

    batches_locked: uint256 = self._batches_locked
    batch: uint256 = batches_locked >> 128
    self.record_roots[batch] = root
    assert (batches_locked & U128) + total <= U128, "market: locked overflow"
    self._batches_locked = batches_locked + (1 << 128) + total
    log TradesRecorded(batch=batch, root=root, trades=len(trades), locked=total)
    return batch


@external
def settle_batch(
    root: bytes32,
    receipts: DynArray[Receipt, MAX_TRADES],
    buyers: DynArray[address, MAX_BUYERS],
    signers: DynArray[Signer, MAX_SIGNERS],
    aggregate_signature: Bytes[256],
    coverage: DynArray[Coverage, MAX_SEGMENTS],
    fillers: DynArray[bytes32, MAX_FILLERS],
):
    """
    @notice Settle completed trades. `root` is the Merkle root of the
            receipts' leaves (trade id, GPU-seconds, digest) in `receipts`
            order; every provider of the batch, and only they, are `signers`
            (strictly ascending by address, each with its registered key),
            and `aggregate_signature` is their BLS aggregate over
            `settlement_message(root)`, checked against the sum of their keys.
            A provider whose exit is due within the dispute window can't be
            settled: buyers could no longer reach its stake. Each receipt pays
            its provider price x GPU-seconds / 3600 (at most the lock), returns
            the rest to its buyer (by index in `buyers`) and marks the trade
            settled.
    @dev    Trades are proven against their record roots without per-trade
            proofs: `coverage` lists each record batch touched (in order, with
            its size); receipts are sorted by (batch, position) and the
            leaves of that batch's trades not settled here are `fillers`, in
            position order. The contract rebuilds each record root.
    """
    control: uint256 = self._control
    assert msg.sender == convert(control & ADDRESS_MASK, address), "market: not operator"
    assert control >> 160 == 0, "market: paused"
    n: uint256 = len(receipts)
    assert n > 0, "market: empty batch"
    assert len(signers) > 0, "market: no signers"
    assert self.settled_at[root] == 0, "market: root settled"

    credits: DynArray[uint256, MAX_SIGNERS] = []
    for _: uint256 in range(len(signers), bound=MAX_SIGNERS):
        credits.append(0)
    refunds: DynArray[uint256, MAX_BUYERS] = []
    for _: uint256 in range(len(buyers), bound=MAX_BUYERS):
        refunds.append(0)
    seen: uint256 = 0
    total_paid: uint256 = 0
    total_refunded: uint256 = 0
    word_key: uint256 = max_value(uint256)
    word: uint256 = 0
    ri: uint256 = 0
    fi: uint256 = 0
    leaves: DynArray[bytes32, MAX_TRADES] = []

    # pass 0 rebuilds the completion root, then one pass per record batch touched
    for ci: uint256 in range(len(coverage) + 1, bound=MAX_SEGMENTS + 1):
        leaves = []
        expected: bytes32 = root
        if ci == 0:
            for i: uint256 in range(n, bound=MAX_TRADES):
                place: uint256 = receipts[i].place
                leaves.append(keccak256(concat(b"\x00", convert((place >> 128) & U64, bytes32), convert(place >> 192, bytes32), receipts[i].digest)))
        else:
            seg: Coverage = coverage[unsafe_sub(ci, 1)]
            expected = self.record_roots[seg.batch]
            for pos: uint256 in range(seg.size, bound=MAX_TRADES):
                r: Receipt = empty(Receipt)
                if ri < n:
                    r = receipts[ri]
                if ri < n and (r.place >> 64) & U64 == seg.batch and (r.place >> 32) & U32 == pos:
                    ri = unsafe_add(ri, 1)
                    si: uint256 = (r.place >> 16) & U16
                    assert si < len(signers), "market: bad signer"
                    bi: uint256 = r.place & U16
                    assert bi < len(buyers), "market: bad buyer"
                    trade_id: uint256 = (r.place >> 128) & U64
                    price: uint256 = r.terms >> 128
                    gpus: uint256 = (r.terms >> 96) & U32
                    duration: uint256 = (r.terms >> 64) & U32
                    deadline: uint256 = r.terms & U64
                    leaves.append(keccak256(concat(b"\x02", abi_encode(trade_id, buyers[bi], signers[si].account, price, gpus, duration, deadline))))
                    assert block.timestamp <= deadline + grace_period, "market: trade expired"
                    seen |= 1 << si

                    key: uint256 = trade_id >> 7
                    if key != word_key:
                        if word_key != max_value(uint256):
                            self.trade_status_words[word_key] = word
                        word_key = key
                        word = self.trade_status_words[key]
                    offset: uint256 = (trade_id & 127) << 1
                    assert (word >> offset) & 3 == OPEN, "market: trade not open"
                    word ^= (OPEN ^ SETTLED) << offset

                    # price < 2**128; gpus, duration < 2**32; gpu_seconds < 2**64: no overflow
                    lock: uint256 = unsafe_div(unsafe_mul(unsafe_mul(price, gpus), duration), 3600)
                    paid: uint256 = min(lock, unsafe_div(unsafe_mul(price, r.place >> 192), 3600))
                    credits[si] = unsafe_add(credits[si], paid)
                    refunds[bi] = unsafe_add(refunds[bi], unsafe_sub(lock, paid))
                    total_paid = unsafe_add(total_paid, paid)
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
        if ci == 0:
            assert leaves[0] == expected, "market: root mismatch"
        else:
            assert leaves[0] == expected, "market: unknown trade"
    assert ri == n, "market: stray receipt"
    assert fi == len(fillers), "market: unused filler"
    assert seen == (1 << len(signers)) - 1, "market: idle signer"
    self.trade_status_words[word_key] = word
    for i: uint256 in range(len(buyers), bound=MAX_BUYERS):
        self._credit(buyers[i], refunds[i])
        total_refunded = unsafe_add(total_refunded, refunds[i])

    # one aggregate BLS check for the whole batch, against the registered keys
    agg: Bytes[128] = b""
    previous: uint256 = 0
    for i: uint256 in range(len(signers), bound=MAX_SIGNERS):
        s: Signer = signers[i]
        # strictly ascending: no key counted twice in the aggregate
        assert convert(s.account, uint256) > previous, "market: unsorted signers"
        previous = convert(s.account, uint256)
        ident: uint256 = self._providers[s.account].ident
        assert ident >> TAG_SHIFT << TAG_SHIFT == self._key_hash(s.pk0, s.pk1, s.pk2), "market: unknown signer"
        state: uint256 = (ident >> 64) & U40
        assert state != SUSPENDED, "market: provider suspended"
        assert state == ACTIVE or block.timestamp + dispute_window < state, "market: provider exiting"
        # its pay joins its earnings in the same slot; past 2**64 they move to the balance word
        earned: uint256 = (ident & U64) + credits[i]
        if earned > U64:
            self._credit(s.account, earned)
            earned = 0
        self._providers[s.account].ident = ident ^ (ident & U64) | earned
        pk: Bytes[128] = concat(
            convert(s.pk0 >> 128, bytes32),
            convert(s.pk1, bytes32),
            convert(s.pk0 & AMOUNT_MASK, bytes32),
            convert(s.pk2, bytes32),
        )
        if i == 0:
            agg = pk
        else:
            agg = bls.g1_add(agg, pk)
    assert staticcall bls_verifier.verify(agg, self._settlement_message(root), aggregate_signature), "market: bad signature"

    self.settled_at[root] = block.timestamp
    self._unlock(total_paid + total_refunded)
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
    self._unlock(lock)
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

    # held from the provider's earnings, then its balance word, then its stake
    p: Provider = self._providers[trade.provider]
    from_earned: uint256 = min(p.ident & U64, paid)
    word: uint256 = self._balances[trade.provider]
    from_balance: uint256 = min(word & AMOUNT_MASK, paid - from_earned)
    self._balances[trade.provider] = word - from_balance
    from_stake: uint256 = min(p.stake, paid - from_earned - from_balance)
    self._providers[trade.provider] = Provider(
        ident=self._standing(p.ident - from_earned, p.stake - from_stake), stake=p.stake - from_stake
    )
    self.total_staked -= from_stake
    held: uint256 = from_earned + from_balance + from_stake
    self.disputes[trade.trade_id] = Dispute(
        buyer=trade.buyer, provider=trade.provider, held=held, from_stake=from_stake, paid=paid
    )
    self.total_held += held
    log DisputeOpened(trade_id=trade.trade_id, buyer=trade.buyer, provider=trade.provider, held=held, from_stake=from_stake)


@external
def resolve_dispute(trade_id: uint256, pay_provider: bool, slash: uint256):
    """
    @notice Arbiter's ruling. `pay_provider`: what was held goes back to
            the provider, to its stake what came from its stake (to its free
            balance if it has exited since). Otherwise it goes to the buyer,
            and the provider, found at fault, is slashed up to `slash` from
            its stake, also to the buyer. A stake that falls below min_stake
            suspends the provider until `add_stake`.
            `slash` may be at most MAX_SLASH_MULTIPLE (2) times what the
            trade paid: one small trade can't take a provider's whole stake.
            (A stake smaller than the slash gives what it has.)
    """
    assert msg.sender == self.arbiter, "market: not arbiter"
    d: Dispute = self.disputes[trade_id]
    assert d.buyer != empty(address), "market: no dispute"
    self.disputes[trade_id] = empty(Dispute)
    self.total_held -= d.held
    p: Provider = self._providers[d.provider]
    slashed: uint256 = 0
    restaked: uint256 = 0
    if pay_provider:
        assert slash == 0, "market: slash without fault"
        if p.ident != 0:
            restaked = d.from_stake
        self._credit(d.provider, d.held - restaked)
    else:
        assert slash <= d.paid * MAX_SLASH_MULTIPLE, "market: slash above 2x the trade's pay"
        slashed = min(slash, p.stake)
        self._credit(d.buyer, d.held + slashed)
    if p.ident != 0:
        stake: uint256 = p.stake + restaked - slashed
        self._providers[d.provider] = Provider(ident=self._standing(p.ident, stake), stake=stake)
        self.total_staked = self.total_staked + restaked - slashed
    log DisputeResolved(trade_id=trade_id, provider_paid=pay_provider, amount=d.held, slashed=slashed, restaked=restaked)


# ------------------------------------------------------------------ admin
@external
def set_paused(paused: bool):
    """
    @notice Emergency stop of deposits, registrations, recording and
            settlement. Withdrawals, exits, refunds and disputes stay open.
    """
    assert msg.sender == self.admin, "market: not admin"
    self._control = (self._control & ADDRESS_MASK) | (convert(paused, uint256) << 160)
    log PausedSet(paused=paused)


@external
def set_operator(operator: address):
    """
    @notice Rotate the operator key.
    """
    assert msg.sender == self.admin, "market: not admin"
    assert operator != empty(address), "market: zero address"
    self._control = (self._control & (1 << 160)) | convert(operator, uint256)
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
def _pull(amount: uint256) -> uint256:
    """
    @notice transferFrom the caller and return what the market's balance grew
            by (a fee-on-transfer token delivers less than `amount`). Callers
            are @nonreentrant and write their state after this returns, from
            the measured amount.
    """
    before: uint256 = staticcall token.balanceOf(self)
    assert extcall token.transferFrom(msg.sender, self, amount, default_return_value=True), "market: transfer failed"
    received: uint256 = staticcall token.balanceOf(self) - before
    assert received > 0, "market: nothing received"
    return received


@internal
def _unlock(amount: uint256):
    batches_locked: uint256 = self._batches_locked
    assert batches_locked & U128 >= amount, "market: unlock above total locked"
    self._batches_locked = batches_locked - amount


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
@view
def _standing(ident: uint256, stake: uint256) -> uint256:
    # active <-> suspended as the stake crosses min_stake; an exiting provider stays exiting
    state: uint256 = (ident >> 64) & U40
    if (state == ACTIVE and stake < min_stake) or (state == SUSPENDED and stake >= min_stake):
        return ident ^ ((ACTIVE ^ SUSPENDED) << 64)
    return ident


@internal
@pure
def _key_hash(pk0: uint256, pk1: uint256, pk2: uint256) -> uint256:
    # the key tag: the top 152 bits of the key's hash, in place above state and earnings
    return convert(keccak256(abi_encode(pk0, pk1, pk2)), uint256) >> TAG_SHIFT << TAG_SHIFT


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

# pragma version 0.4.3
# @license Apache-2.0
"""
@title Naive reference escrow (benchmark baseline, not for production)
@notice Opens and closes one trade at a time: each trade pulls its lock from
        the buyer into its own storage record, and its release pushes the
        payment to the provider and the rest back to the buyer.
"""
from ethereum.ercs import IERC20

struct Escrow:
    buyer: address
    provider: address
    amount: uint256
    open: bool

event Opened:
    trade_id: indexed(uint256)
    amount: uint256

event Released:
    trade_id: indexed(uint256)
    paid: uint256

token: public(immutable(IERC20))
operator: public(immutable(address))
escrows: public(HashMap[uint256, Escrow])


@deploy
def __init__(_token: address, _operator: address):
    token = IERC20(_token)
    operator = _operator


@external
def open(trade_id: uint256, provider: address, amount: uint256):
    """
    @notice The buyer deposits and locks one trade's price.
    """
    assert not self.escrows[trade_id].open, "naive: exists"
    self.escrows[trade_id] = Escrow(buyer=msg.sender, provider=provider, amount=amount, open=True)
    log Opened(trade_id=trade_id, amount=amount)
    assert extcall token.transferFrom(msg.sender, self, amount)


@external
def release(trade_id: uint256, paid: uint256):
    """
    @notice The operator releases one trade: pays the provider, refunds the buyer.
    """
    assert msg.sender == operator, "naive: not operator"
    e: Escrow = self.escrows[trade_id]
    assert e.open and paid <= e.amount, "naive: bad release"
    self.escrows[trade_id] = empty(Escrow)
    log Released(trade_id=trade_id, paid=paid)
    assert extcall token.transfer(e.provider, paid)
    if e.amount > paid:
        assert extcall token.transfer(e.buyer, e.amount - paid)

# pragma version 0.4.3
# @license Apache-2.0
"""
@title GridBid test stablecoin
@notice An ERC-20 with 6 decimals and a minter, for dev chains and tests.
        Production markets take any ERC-20 by address.
"""
from ethereum.ercs import IERC20

implements: IERC20

event Transfer:
    sender: indexed(address)
    receiver: indexed(address)
    value: uint256

event Approval:
    owner: indexed(address)
    spender: indexed(address)
    value: uint256

event MinterChanged:
    minter: indexed(address)

name: public(constant(String[32])) = "GridBid Test USD"
symbol: public(constant(String[8])) = "tUSD"
decimals: public(constant(uint8)) = 6

balanceOf: public(HashMap[address, uint256])
allowance: public(HashMap[address, HashMap[address, uint256]])
totalSupply: public(uint256)
minter: public(address)


@deploy
def __init__():
    self.minter = msg.sender
    log MinterChanged(minter=msg.sender)


@external
def transfer(receiver: address, amount: uint256) -> bool:
    """
    @notice Move `amount` from the caller to `receiver`.
    """
    self._transfer(msg.sender, receiver, amount)
    return True


@external
def transferFrom(owner: address, receiver: address, amount: uint256) -> bool:
    """
    @notice Move `amount` from `owner` to `receiver` within the caller's allowance.
    """
    allowed: uint256 = self.allowance[owner][msg.sender]
    if allowed != max_value(uint256):
        assert allowed >= amount, "token: allowance exceeded"
        self.allowance[owner][msg.sender] = allowed - amount
    self._transfer(owner, receiver, amount)
    return True


@external
def approve(spender: address, amount: uint256) -> bool:
    """
    @notice Let `spender` move up to `amount` of the caller's tokens.
    """
    self.allowance[msg.sender][spender] = amount
    log Approval(owner=msg.sender, spender=spender, value=amount)
    return True


@external
def mint(receiver: address, amount: uint256):
    """
    @notice Create `amount` tokens for `receiver` (minter only).
    """
    assert msg.sender == self.minter, "token: not minter"
    assert receiver != empty(address), "token: zero address"
    self.totalSupply += amount
    self.balanceOf[receiver] += amount
    log Transfer(sender=empty(address), receiver=receiver, value=amount)


@external
def set_minter(minter: address):
    """
    @notice Hand the minter role to `minter` (minter only).
    """
    assert msg.sender == self.minter, "token: not minter"
    self.minter = minter
    log MinterChanged(minter=minter)


@internal
def _transfer(owner: address, receiver: address, amount: uint256):
    assert receiver != empty(address), "token: zero address"
    balance: uint256 = self.balanceOf[owner]
    assert balance >= amount, "token: balance exceeded"
    self.balanceOf[owner] = balance - amount
    self.balanceOf[receiver] += amount
    log Transfer(sender=owner, receiver=receiver, value=amount)

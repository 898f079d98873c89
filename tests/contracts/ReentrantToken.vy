# pragma version 0.4.3
# @license Apache-2.0
"""
@title A malicious ERC-20 that calls back into the market during transfers
@notice Armed, every transfer and transferFrom re-enters the market: `withdraw`
        (mode 1) or `deposit` (mode 2) for the same amount. Disarmed (mode 0) it
        is an honest token, the control case: what fails armed fails because of
        the market's reentrancy lock, not for any other reason.
"""

interface Market:
    def withdraw(amount: uint256): nonpayable
    def deposit(amount: uint256): nonpayable

market: public(address)
mode: public(uint256)
balanceOf: public(HashMap[address, uint256])
allowance: public(HashMap[address, HashMap[address, uint256]])


@external
def set_market(market: address):
    self.market = market


@external
def arm(mode: uint256):
    self.mode = mode


@external
def mint(receiver: address, amount: uint256):
    self.balanceOf[receiver] += amount


@external
def approve(spender: address, amount: uint256) -> bool:
    self.allowance[msg.sender][spender] = amount
    return True


@internal
def _reenter(amount: uint256):
    if self.mode == 1:
        extcall Market(self.market).withdraw(amount)
    elif self.mode == 2:
        extcall Market(self.market).deposit(amount)


@external
def transferFrom(owner: address, receiver: address, amount: uint256) -> bool:
    self.balanceOf[owner] -= amount
    self.balanceOf[receiver] += amount
    self._reenter(amount)
    return True


@external
def transfer(receiver: address, amount: uint256) -> bool:
    self.balanceOf[msg.sender] -= amount
    self.balanceOf[receiver] += amount
    self._reenter(amount)
    return True

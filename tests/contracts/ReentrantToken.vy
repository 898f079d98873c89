# pragma version 0.4.3
# @license Apache-2.0
"""
@title A malicious ERC-20 that calls back into the market during transfers
"""

interface Market:
    def withdraw(amount: uint256): nonpayable

market: public(address)
balanceOf: public(HashMap[address, uint256])


@external
def set_market(market: address):
    self.market = market


@external
def mint(receiver: address, amount: uint256):
    self.balanceOf[receiver] += amount


@external
def transferFrom(owner: address, receiver: address, amount: uint256) -> bool:
    self.balanceOf[owner] -= amount
    self.balanceOf[receiver] += amount
    # re-enter: try to pull the deposit straight back out
    extcall Market(self.market).withdraw(amount)
    return True


@external
def transfer(receiver: address, amount: uint256) -> bool:
    self.balanceOf[msg.sender] -= amount
    self.balanceOf[receiver] += amount
    extcall Market(self.market).withdraw(amount)
    return True

# pragma version 0.4.3
# @license Apache-2.0
"""
@title An ERC-20 that takes a fee on every transfer (1%, burned)
@notice Tokens like this deliver less than the amount a transfer names; the
        market must credit what arrived, not what was asked.
"""

FEE_BPS: constant(uint256) = 100

balanceOf: public(HashMap[address, uint256])
allowance: public(HashMap[address, HashMap[address, uint256]])
totalSupply: public(uint256)


@external
def mint(receiver: address, amount: uint256):
    self.balanceOf[receiver] += amount
    self.totalSupply += amount


@external
def approve(spender: address, amount: uint256) -> bool:
    self.allowance[msg.sender][spender] = amount
    return True


@internal
def _move(owner: address, receiver: address, amount: uint256):
    fee: uint256 = amount * FEE_BPS // 10_000
    self.balanceOf[owner] -= amount
    self.balanceOf[receiver] += amount - fee
    self.totalSupply -= fee


@external
def transferFrom(owner: address, receiver: address, amount: uint256) -> bool:
    self.allowance[owner][msg.sender] -= amount
    self._move(owner, receiver, amount)
    return True


@external
def transfer(receiver: address, amount: uint256) -> bool:
    self._move(msg.sender, receiver, amount)
    return True

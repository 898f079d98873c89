# pragma version 0.4.3
# @license Apache-2.0
"""
@title GridBid BLS verifier: the bls12_381 module as a stateless contract
@notice GridBidMarket calls this contract for its two BLS checks (a batch's
        aggregate signature, a provider's proof of possession) instead of
        carrying hash-to-curve in its own code: the market stays under the
        EIP-170 size limit with room for its rules, for a cold call (about
        2,600 gas) once per settlement. It holds no state and no money; one
        deployment serves any number of markets.
"""

import bls12_381 as bls


@external
@view
def verify(pubkey: Bytes[128], message: bytes32, signature: Bytes[256]) -> bool:
    """
    @notice Whether `signature` (EIP-2537 G2) signs the 32-byte `message`
            under `pubkey` (EIP-2537 G1, possibly an aggregate of keys),
            with the signing DST of the proof-of-possession ciphersuite.
    """
    return bls.verify(pubkey, concat(message, b""), signature)


@external
@view
def pop_verify(pubkey: Bytes[128], proof: Bytes[256]) -> bool:
    """
    @notice Whether `proof` is a valid proof of possession of `pubkey`.
    """
    return bls.pop_verify(pubkey, proof)

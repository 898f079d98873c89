# pragma version 0.4.3
# @license Apache-2.0
"""
@title Test harness exposing the bls12_381 module
"""
import bls12_381 as bls


@external
@view
def hash_to_g2(message: Bytes[1024], dst: Bytes[255]) -> Bytes[256]:
    return bls.hash_to_g2(message, dst)


@external
@pure
def expand_message_xmd(message: Bytes[1024], dst: Bytes[255]) -> Bytes[256]:
    return bls.expand_message_xmd(message, dst)


@external
@view
def verify(pubkey: Bytes[128], message: Bytes[1024], signature: Bytes[256]) -> bool:
    return bls.verify(pubkey, message, signature)


@external
@view
def pop_verify(pubkey: Bytes[128], proof: Bytes[256]) -> bool:
    return bls.pop_verify(pubkey, proof)


@external
@pure
def compress_g1(pubkey: Bytes[128]) -> Bytes[48]:
    return bls.compress_g1(pubkey)


@external
@view
def aggregate_verify(pubkeys: DynArray[Bytes[128], 16], message: Bytes[1024], signature: Bytes[256]) -> bool:
    agg: Bytes[128] = pubkeys[0]
    for i: uint256 in range(1, 16):
        if i >= len(pubkeys):
            break
        agg = bls.g1_add(agg, pubkeys[i])
    return bls.verify(agg, message, signature)

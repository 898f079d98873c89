# pragma version 0.4.3
# @license Apache-2.0
"""
@title BLS12-381 signatures with the EIP-2537 precompiles
@notice Ethereum's standard BLS ciphersuite: public keys in G1, signatures in
        G2, messages hashed to G2 per RFC 9380 (BLS12381G2_XMD:SHA-256_SSWU_RO_),
        proof of possession against rogue keys. Points use the EIP-2537
        encoding: an Fp element is 64 bytes (16 zero bytes, then 48), a G1
        point is x || y (128 bytes), a G2 point is x.c0 || x.c1 || y.c0 || y.c1
        (256 bytes). `contracts/bls.py` converts py-ecc's compressed points.
@dev Every precompile call gets a bounded gas stipend, so a malformed point
     costs a few thousand gas and a clear revert instead of eating the
     transaction's gas.
"""

SIG_DST: constant(Bytes[43]) = b"BLS_SIG_BLS12381G2_XMD:SHA-256_SSWU_RO_POP_"
POP_DST: constant(Bytes[43]) = b"BLS_POP_BLS12381G2_XMD:SHA-256_SSWU_RO_POP_"

MAX_MESSAGE: constant(uint256) = 1024
MAX_DST: constant(uint256) = 255

MODEXP: constant(address) = 0x0000000000000000000000000000000000000005
G1ADD: constant(address) = 0x000000000000000000000000000000000000000b
G2ADD: constant(address) = 0x000000000000000000000000000000000000000d
PAIRING: constant(address) = 0x000000000000000000000000000000000000000F
MAP_FP2_TO_G2: constant(address) = 0x0000000000000000000000000000000000000011

# the base field modulus p, 48 bytes big-endian
P_BYTES: constant(Bytes[48]) = x"1a0111ea397fe69a4b1ba7b6434bacd764774b84f38512bf6730d2a0f6b0f6241eabfffeb153ffffb9feffffffffaaab"
# (p - 1) / 2 split at 256 bits: y above it is "lexicographically largest"
HALF_P_HI: constant(uint256) = 17282741772707453034394598013407712875
HALF_P_LO: constant(uint256) = 80617075055843030690312053732876818007934237714091801549733396136033114903893

# -G1 (the negated generator), EIP-2537 encoded
NEG_G1: constant(Bytes[128]) = x"0000000000000000000000000000000017f1d3a73197d7942695638c4fa9ac0fc3688c4f9774b905a14e3a3f171bac586c55e83ff97a1aeffb3af00adb22c6bb00000000000000000000000000000000114d1d6855d545a8aa7d76c8cf2e21f267816aef1db507c96655b9d5caac42364e6f38ba0ecb751bad54dcd6b939c2ca"

# gas stipends, above the EIP-2537 / EIP-2565 prices (Prague)
MODEXP_GAS: constant(uint256) = 5_000
ADD_GAS: constant(uint256) = 2_000
MAP_GAS: constant(uint256) = 30_000
PAIRING_2_GAS: constant(uint256) = 110_000


@internal
@view
def _to_field(chunk: Bytes[64]) -> Bytes[64]:
    # hash_to_field: a 64-byte big-endian integer reduced mod p (MODEXP with e = 1),
    # returned as a padded 64-byte EIP-2537 field element
    ok: bool = False
    out: Bytes[48] = b""
    ok, out = raw_call(
        MODEXP,
        concat(
            convert(64, bytes32), convert(1, bytes32), convert(48, bytes32), chunk, b"\x01", P_BYTES
        ),
        max_outsize=48,
        gas=MODEXP_GAS,
        is_static_call=True,
        revert_on_failure=False,
    )
    assert ok and len(out) == 48, "bls: modexp failed"
    return concat(empty(bytes16), out)


@internal
@view
def _map_to_g2(c0: Bytes[64], c1: Bytes[64]) -> Bytes[256]:
    ok: bool = False
    out: Bytes[256] = b""
    ok, out = raw_call(
        MAP_FP2_TO_G2,
        concat(c0, c1),
        max_outsize=256,
        gas=MAP_GAS,
        is_static_call=True,
        revert_on_failure=False,
    )
    assert ok and len(out) == 256, "bls: map to G2 failed"
    return out


@internal
@view
def g2_add(a: Bytes[256], b: Bytes[256]) -> Bytes[256]:
    ok: bool = False
    out: Bytes[256] = b""
    ok, out = raw_call(
        G2ADD, concat(a, b), max_outsize=256, gas=ADD_GAS, is_static_call=True, revert_on_failure=False
    )
    assert ok and len(out) == 256, "bls: bad G2 point"
    return out


@internal
@view
def g1_add(a: Bytes[128], b: Bytes[128]) -> Bytes[128]:
    """
    @notice Sum of two G1 points (no subgroup check: callers add only keys
            that passed a proof of possession).
    """
    ok: bool = False
    out: Bytes[128] = b""
    ok, out = raw_call(
        G1ADD, concat(a, b), max_outsize=128, gas=ADD_GAS, is_static_call=True, revert_on_failure=False
    )
    assert ok and len(out) == 128, "bls: bad G1 point"
    return out


@internal
@pure
def g1_is_infinity(point: Bytes[128]) -> bool:
    """
    @notice Whether an EIP-2537 G1 point is the point at infinity (128 zero
            bytes). `point == empty(Bytes[128])` would compare it with the
            empty string, which 128 zero bytes are not.
    """
    assert len(point) == 128, "bls: bad G1 encoding"
    return (
        convert(extract32(point, 0), uint256)
        | convert(extract32(point, 32), uint256)
        | convert(extract32(point, 64), uint256)
        | convert(extract32(point, 96), uint256)
    ) == 0


@internal
@pure
def g2_is_infinity(point: Bytes[256]) -> bool:
    """
    @notice Whether an EIP-2537 G2 point is the point at infinity (256 zero bytes).
    """
    assert len(point) == 256, "bls: bad G2 encoding"
    acc: uint256 = 0
    for i: uint256 in range(8):
        acc |= convert(extract32(point, i * 32), uint256)
    return acc == 0


@internal
@pure
def expand_message_xmd(message: Bytes[MAX_MESSAGE], dst: Bytes[MAX_DST]) -> Bytes[256]:
    """
    @notice RFC 9380 expand_message_xmd with SHA-256, 256 output bytes
            (two Fp2 elements, 64 bytes per Fp coordinate).
    """
    dst_prime: Bytes[256] = concat(dst, convert(convert(len(dst), uint8), bytes1))
    b0: bytes32 = sha256(concat(empty(bytes32), empty(bytes32), message, b"\x01\x00\x00", dst_prime))
    b: bytes32[8] = empty(bytes32[8])
    b[0] = sha256(concat(b0, b"\x01", dst_prime))
    for i: uint256 in range(1, 8):
        b[i] = sha256(
            concat(
                convert(convert(b0, uint256) ^ convert(b[i - 1], uint256), bytes32),
                convert(convert(i + 1, uint8), bytes1),
                dst_prime,
            )
        )
    out: Bytes[256] = concat(b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7])
    return out


@internal
@view
def hash_to_g2(message: Bytes[MAX_MESSAGE], dst: Bytes[MAX_DST]) -> Bytes[256]:
    """
    @notice RFC 9380 hash_to_curve for G2: hash_to_field (count 2), two
            MAP_FP2_TO_G2 (which clear the cofactor) and one G2ADD.
    """
    u: Bytes[256] = self.expand_message_xmd(message, dst)
    q0: Bytes[256] = self._map_to_g2(self._to_field(slice(u, 0, 64)), self._to_field(slice(u, 64, 64)))
    q1: Bytes[256] = self._map_to_g2(self._to_field(slice(u, 128, 64)), self._to_field(slice(u, 192, 64)))
    return self.g2_add(q0, q1)


@internal
@view
def pairing_check(p1: Bytes[128], q1: Bytes[256], p2: Bytes[128], q2: Bytes[256]) -> bool:
    """
    @notice e(p1, q1) * e(p2, q2) == 1. The precompile checks that every
            point is on its curve and in its subgroup; a bad point reverts.
    """
    ok: bool = False
    out: Bytes[32] = b""
    ok, out = raw_call(
        PAIRING,
        concat(p1, q1, p2, q2),
        max_outsize=32,
        gas=PAIRING_2_GAS,
        is_static_call=True,
        revert_on_failure=False,
    )
    assert ok and len(out) == 32, "bls: invalid point"
    return convert(out, uint256) == 1


@internal
@view
def core_verify(
    pubkey: Bytes[128], message: Bytes[MAX_MESSAGE], signature: Bytes[256], dst: Bytes[MAX_DST]
) -> bool:
    """
    @notice CoreVerify: e(pk, H(m)) == e(G1, sig), checked as
            e(pk, H(m)) * e(-G1, sig) == 1. The point at infinity (EIP-2537's
            all-zero encoding) is refused as a key (a provider's, or the sum
            of a batch's keys, which pk and -pk under two accounts cancel) and
            as a signature or proof: e(O, H(m)) * e(-G1, O) == 1 for every
            message, so an infinity key with an infinity signature would
            verify anything.
    """
    assert not self.g1_is_infinity(pubkey), "bls: key at infinity"
    assert not self.g2_is_infinity(signature), "bls: signature at infinity"
    return self.pairing_check(pubkey, self.hash_to_g2(message, dst), NEG_G1, signature)


@internal
@view
def verify(pubkey: Bytes[128], message: Bytes[MAX_MESSAGE], signature: Bytes[256]) -> bool:
    """
    @notice Verify a signature (or an aggregate over keys summed with g1_add)
            under the proof-of-possession ciphersuite's signing DST.
    """
    return self.core_verify(pubkey, message, signature, SIG_DST)


@internal
@pure
def compress_g1(pubkey: Bytes[128]) -> Bytes[48]:
    """
    @notice The 48-byte compressed form of an EIP-2537 G1 point (ZCash
            flags: compressed, not infinity, sign of y), the message a
            proof of possession signs.
    """
    x_hi: uint256 = convert(slice(pubkey, 0, 32), uint256)
    x_lo: bytes32 = extract32(pubkey, 32)
    y_hi: uint256 = convert(slice(pubkey, 64, 32), uint256)
    y_lo: uint256 = convert(slice(pubkey, 96, 32), uint256)
    flags: uint256 = 128  # 0x80: compressed
    if y_hi > HALF_P_HI or (y_hi == HALF_P_HI and y_lo > HALF_P_LO):
        flags = 160  # 0xa0: compressed, y is the larger root
    head: bytes32 = convert(x_hi | (flags << 120), bytes32)
    return concat(slice(head, 16, 16), x_lo)


@internal
@view
def pop_verify(pubkey: Bytes[128], proof: Bytes[256]) -> bool:
    """
    @notice Proof of possession: the key's signature of its own compressed
            encoding under POP_DST. Binding the compressed encoding to the
            very point being registered is what stops a rogue key from
            reusing someone else's proof.
    """
    return self.core_verify(pubkey, self.compress_g1(pubkey), proof, POP_DST)

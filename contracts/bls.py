"""BLS signatures for GridBid: Ethereum's standard ciphersuite, via py-ecc.

Public keys live in G1 (48 bytes compressed), signatures in G2 (96 bytes
compressed), with proof of possession against rogue keys
(``BLS_SIG_BLS12381G2_XMD:SHA-256_SSWU_RO_POP_``). The same keys are checked
on chain by ``bls12_381.vy`` through the EIP-2537 precompiles, which take
uncompressed, padded points: ``g1_to_eip2537`` and ``g2_to_eip2537`` convert.

Every function raises ``ValueError`` with a clear message on malformed input
(wrong length, not on the curve, not in the subgroup, zero key); the
``verify`` family returns ``False`` for a well-formed but wrong signature.

py-ecc is slow (sign ~0.2 s, verify ~0.5 s): keep it off request paths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from contracts import pyecc  # noqa: F401 - before py_ecc itself: it restores the recursion limit py_ecc raises

# isort: split
from py_ecc.bls import G2ProofOfPossession as _Suite
from py_ecc.bls.g2_primitives import pubkey_to_G1, signature_to_G2, subgroup_check
from py_ecc.bls.hash_to_curve import hash_to_G2
from py_ecc.optimized_bls12_381 import curve_order, is_inf, normalize

__all__ = [
    "DST",
    "POP_DST",
    "PUBKEY_LENGTH",
    "SIGNATURE_LENGTH",
    "aggregate",
    "fast_aggregate_verify",
    "g1_to_eip2537",
    "g2_to_eip2537",
    "hash_to_g2_eip2537",
    "keygen",
    "pop_prove",
    "pop_verify",
    "public_key",
    "sign",
    "verify",
]

DST = b"BLS_SIG_BLS12381G2_XMD:SHA-256_SSWU_RO_POP_"
POP_DST = b"BLS_POP_BLS12381G2_XMD:SHA-256_SSWU_RO_POP_"
PUBKEY_LENGTH = 48
SIGNATURE_LENGTH = 96
EIP2537_G1_LENGTH = 128
EIP2537_G2_LENGTH = 256


def _bytes(value: object, name: str, length: int | None = None) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise ValueError(f"bls: {name} must be bytes, got {type(value).__name__}")
    data = bytes(value)
    if length is not None and len(data) != length:
        raise ValueError(f"bls: {name} must be {length} bytes, got {len(data)}")
    return data


def _secret(sk: object) -> int:
    if not isinstance(sk, int) or isinstance(sk, bool) or not 0 < sk < curve_order:
        raise ValueError("bls: secret key must be an integer in [1, curve_order)")
    return sk


def _g1(pk: object) -> tuple:  # type: ignore[type-arg]
    data = _bytes(pk, "public key", PUBKEY_LENGTH)
    try:
        point = pubkey_to_G1(data)
    except Exception as exc:  # py-ecc raises ValueError/AssertionError/ValidationError
        raise ValueError(f"bls: public key is not a valid compressed G1 point ({exc})") from exc
    if is_inf(point):
        raise ValueError("bls: public key is the point at infinity")
    if not subgroup_check(point):
        raise ValueError("bls: public key is not in the G1 subgroup")
    return point


def _g2(sig: object) -> tuple:  # type: ignore[type-arg]
    data = _bytes(sig, "signature", SIGNATURE_LENGTH)
    try:
        point = signature_to_G2(data)
    except Exception as exc:
        raise ValueError(f"bls: signature is not a valid compressed G2 point ({exc})") from exc
    if not subgroup_check(point):
        raise ValueError("bls: signature is not in the G2 subgroup")
    return point


def keygen(seed: bytes) -> int:
    """Derive a secret key from at least 32 bytes of seed (IETF KeyGen)."""
    data = _bytes(seed, "seed")
    if len(data) < 32:
        raise ValueError("bls: seed must be at least 32 bytes")
    return int(_Suite.KeyGen(data))


def public_key(sk: int) -> bytes:
    """The 48-byte compressed G1 public key of ``sk``."""
    return bytes(_Suite.SkToPk(_secret(sk)))


def sign(sk: int, message: bytes) -> bytes:
    """A 96-byte compressed G2 signature of ``message`` under DST."""
    return bytes(_Suite.Sign(_secret(sk), _bytes(message, "message")))


def verify(pk: bytes, message: bytes, sig: bytes) -> bool:
    """True when ``sig`` is ``pk``'s signature of ``message``; ValueError if malformed."""
    _g1(pk)
    _g2(sig)
    return bool(_Suite.Verify(bytes(pk), _bytes(message, "message"), bytes(sig)))


def pop_prove(sk: int) -> bytes:
    """Proof of possession: a signature of the public key itself under POP_DST."""
    return bytes(_Suite.PopProve(_secret(sk)))


def pop_verify(pk: bytes, proof: bytes) -> bool:
    """True when ``proof`` proves possession of ``pk``'s secret key."""
    _g1(pk)
    _g2(proof)
    return bool(_Suite.PopVerify(bytes(pk), bytes(proof)))


def aggregate(sigs: Sequence[bytes]) -> bytes:
    """Sum of signatures (G2 addition); at least one."""
    if len(sigs) == 0:
        raise ValueError("bls: nothing to aggregate")
    for sig in sigs:
        _g2(sig)
    return bytes(_Suite.Aggregate([bytes(s) for s in sigs]))


def fast_aggregate_verify(pks: Sequence[bytes], message: bytes, sig: bytes) -> bool:
    """True when ``sig`` aggregates every key's signature of the same ``message``.

    Sound only for keys whose proof of possession was checked (the contract
    checks it at registration).
    """
    if len(pks) == 0:
        raise ValueError("bls: no public keys")
    for pk in pks:
        _g1(pk)
    _g2(sig)
    return bool(
        _Suite.FastAggregateVerify(
            [bytes(pk) for pk in pks], _bytes(message, "message"), bytes(sig)
        )
    )


def _fp(value: int) -> bytes:
    # EIP-2537 field element: 64 bytes big-endian, the top 16 always zero.
    return value.to_bytes(64, "big")


def _g1_point_to_eip2537(point: tuple) -> bytes:  # type: ignore[type-arg]
    if is_inf(point):
        return bytes(EIP2537_G1_LENGTH)
    x, y = normalize(point)
    return _fp(x.n) + _fp(y.n)


def _g2_point_to_eip2537(point: tuple) -> bytes:  # type: ignore[type-arg]
    if is_inf(point):
        return bytes(EIP2537_G2_LENGTH)
    x, y = normalize(point)
    # Fp2 element c0 + c1*u is encoded c0 then c1.
    return _fp(x.coeffs[0]) + _fp(x.coeffs[1]) + _fp(y.coeffs[0]) + _fp(y.coeffs[1])


def g1_to_eip2537(pk48: bytes) -> bytes:
    """48-byte compressed G1 key -> 128-byte uncompressed padded EIP-2537 encoding."""
    return _g1_point_to_eip2537(_g1(pk48))


def g2_to_eip2537(sig96: bytes) -> bytes:
    """96-byte compressed G2 signature -> 256-byte uncompressed padded EIP-2537 encoding."""
    return _g2_point_to_eip2537(_g2(sig96))


def hash_to_g2_eip2537(message: bytes, dst: bytes = DST) -> bytes:
    """RFC 9380 hash_to_curve (BLS12381G2_XMD:SHA-256_SSWU_RO_) in EIP-2537 encoding."""
    import hashlib

    return _g2_point_to_eip2537(
        hash_to_G2(_bytes(message, "message"), _bytes(dst, "dst"), hashlib.sha256)
    )


@dataclass(frozen=True)
class BlsKey:
    secret: int
    public_key: bytes
    proof_of_possession: bytes

    def sign(self, message: bytes) -> bytes:
        return sign(self.secret, message)

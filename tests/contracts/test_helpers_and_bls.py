"""contracts/bls.py, merkle.py, orders.py, and the bls12_381 module against py-ecc (the
module on anvil, through tests/contracts/BlsHarness.vy)."""

from __future__ import annotations

import hashlib

import pytest
from eth_account import Account
from eth_account.messages import encode_typed_data
from eth_utils import keccak
from py_ecc.bls.hash import expand_message_xmd

from contracts import bls
from contracts.merkle import MerkleTree, receipt_leaf, verify_proof
from contracts.orders import Order, order_digest, recover_order_signer, sign_order, typed_data
from tests.contracts.deployers import deploy_harness

RFC9380_G2_DST = b"QUUX-V01-CS02-with-BLS12381G2_XMD:SHA-256_SSWU_RO_"


@pytest.mark.parametrize("n", [1, 2, 3, 7, 8, 33])
def test_every_merkle_proof_verifies_at_its_index_only(n):
    leaves = [receipt_leaf(i, i * 60, hashlib.sha256(bytes([i])).digest()) for i in range(n)]
    tree = MerkleTree(leaves)
    for i, leaf in enumerate(leaves):
        proof = tree.proof(i)
        assert verify_proof(leaf, proof, tree.root, i)
        assert not verify_proof(leaf, proof, tree.root, i + (1 << len(proof)))
        if n > 1:
            assert not verify_proof(leaf, proof, tree.root, (i + 1) % n)


def test_order_digest_matches_eth_account_typed_data():
    buyer = Account.create()
    order = Order(7, buyer.address, 10, 2, 3600, 2**40)
    market = "0x" + "ab" * 20
    signable = encode_typed_data(full_message=typed_data(order, chain_id=5, market=market))
    assert keccak(b"\x19" + signable.version + signable.header + signable.body) == order_digest(
        order, chain_id=5, market=market
    )
    signed = sign_order(buyer.key, order, chain_id=5, market=market)
    assert recover_order_signer(signed, chain_id=5, market=market) == buyer.address
    with pytest.raises(ValueError):
        sign_order(Account.create().key, order, chain_id=5, market=market)


def test_bls_helpers_reject_malformed_input():
    with pytest.raises(ValueError, match="48 bytes"):
        bls.g1_to_eip2537(b"\x00" * 47)
    with pytest.raises(ValueError, match="public key"):
        bls.verify(b"\xc0" + b"\x00" * 47, b"m", b"\x00" * 96)
    with pytest.raises(ValueError, match="seed"):
        bls.keygen(b"short")
    with pytest.raises(ValueError, match="secret key"):
        bls.sign(0, b"m")
    with pytest.raises(ValueError):
        bls.aggregate([])


@pytest.fixture(scope="module")
def harness(w3, roles, tmp_path_factory):
    return deploy_harness(w3, "BlsHarness", deployer=roles["admin"], build_dir=tmp_path_factory.mktemp("build"))


@pytest.mark.anvil
@pytest.mark.parametrize("msg", [b"", b"abc", b"q128_" + b"q" * 128])
def test_expand_message_xmd_matches_rfc9380_reference(harness, msg):
    assert harness.functions.expand_message_xmd(msg, RFC9380_G2_DST).call() == expand_message_xmd(
        msg, RFC9380_G2_DST, 256, hashlib.sha256
    )


@pytest.mark.anvil
def test_hash_to_g2_matches_py_ecc_on_rfc9380_suite(harness):
    # py-ecc's hash_to_G2 is itself checked against the RFC 9380 vectors upstream
    assert harness.functions.hash_to_g2(b"abc", RFC9380_G2_DST).call() == bls.hash_to_g2_eip2537(
        b"abc", RFC9380_G2_DST
    )


@pytest.mark.anvil
def test_on_chain_verify_accepts_py_ecc_signatures_and_compresses_keys(harness):
    sk = bls.keygen(b"\x05" * 32)
    pk = bls.public_key(sk)
    pk_eip = bls.g1_to_eip2537(pk)
    assert harness.functions.compress_g1(pk_eip).call() == pk
    msg = b"\x42" * 32
    sig = bls.g2_to_eip2537(bls.sign(sk, msg))
    assert harness.functions.verify(pk_eip, msg, sig).call() is True
    assert harness.functions.verify(pk_eip, b"\x43" * 32, sig).call() is False

"""Receipts, the outputs Merkle root, and co-signing a settlement root."""

from __future__ import annotations

import dataclasses

import pytest

from contracts import bls
from contracts.bls import BlsKey
from contracts.merkle import MerkleTree, receipt_leaf
from contracts.receipts import (
    CosignRefused,
    OutputFile,
    Receipt,
    ReceiptError,
    cosign,
    output_manifest,
    outputs_root,
    receipt_from_body,
    receipt_sign,
    receipt_verify,
    spec_hash,
    spec_message,
    spec_signer,
)

MARKET = "0x" + "11" * 20


@pytest.fixture(scope="module")
def key() -> BlsKey:
    sk = bls.keygen(b"\x07" * 32)
    return BlsKey(sk, bls.public_key(sk), b"")


def receipt(**kw) -> Receipt:
    base = dict(trade_id=42, job_spec_hash=spec_hash({"command": ["echo", "hi"]}), started_at=1000, ended_at=1600, gpu_seconds=2400, exit_code=0, outputs_root="ab" * 32, outcome="completed")
    return Receipt(**{**base, **kw})


def test_spec_hash_ignores_key_order_but_not_values():
    assert spec_hash({"a": 1, "b": [1, 2]}) == spec_hash({"b": [1, 2], "a": 1})
    assert spec_hash({"a": 1}) != spec_hash({"a": 2})


def test_outputs_root_commits_to_every_file_path_and_content(tmp_path):
    (tmp_path / "sub").mkdir()
    (tmp_path / "a.txt").write_text("alpha")
    (tmp_path / "sub" / "b.bin").write_bytes(b"\x00\x01")
    files = output_manifest(tmp_path)
    assert [f.path for f in files] == ["a.txt", "sub/b.bin"] and files[0].size == 5
    root = outputs_root(files)
    (tmp_path / "a.txt").write_text("alphA")
    assert outputs_root(output_manifest(tmp_path)) != root
    renamed = [dataclasses.replace(files[0], path="c.txt"), files[1]]
    assert outputs_root(renamed) != root
    assert outputs_root([]) != outputs_root([OutputFile("x", 0, "00" * 32)])


def test_receipt_round_trips_through_its_json_body():
    r = receipt(checkpoint={"sha256": "cd" * 32, "size": 10})
    assert receipt_from_body(r.body()) == dataclasses.replace(r, checkpoint=r.body()["checkpoint"])
    assert receipt_from_body(r.body()).digest() == r.digest()


@pytest.mark.parametrize("change", [{"gpu_seconds": -1}, {"outcome": "great"}, {"job_spec_hash": "XYZ"}, {"ended_at": 10}])
def test_malformed_receipt_bodies_are_refused(change):
    with pytest.raises(ReceiptError):
        receipt_from_body({**receipt().body(), **change})


def test_signed_receipt_verifies_and_a_changed_one_does_not(key):
    r = receipt()
    sig = receipt_sign(r, key)
    assert receipt_verify(r, sig, key.public_key.hex())
    assert not receipt_verify(dataclasses.replace(r, gpu_seconds=9999), sig, key.public_key.hex())
    assert not receipt_verify(r, "00" * 96, key.public_key.hex())


def test_cosign_signs_a_root_that_holds_our_receipt(key):
    ours = receipt()
    leaves = [receipt_leaf(1, 10, b"\x01" * 32), ours.leaf(), receipt_leaf(3, 30, b"\x03" * 32)]
    tree = MerkleTree(leaves)
    sig = cosign(receipt=ours, root=tree.root, proof=tree.proof(1), index=1, chain_id=31337, market=MARKET, bls_key=key)
    from contracts.merkle import settlement_message

    assert bls.verify(key.public_key, settlement_message(tree.root, 31337, MARKET), sig)


def test_cosign_refuses_a_root_whose_leaf_for_our_trade_differs(key):
    ours = receipt()
    inflated = receipt_leaf(ours.trade_id, ours.gpu_seconds - 600, ours.digest())  # the batch under-pays us
    tree = MerkleTree([receipt_leaf(1, 10, b"\x01" * 32), inflated])
    with pytest.raises(CosignRefused, match="trade 42"):
        cosign(receipt=ours, root=tree.root, proof=tree.proof(1), index=1, chain_id=1, market=MARKET, bls_key=key)
    # nor can a proof for another index pass for ours
    tree2 = MerkleTree([ours.leaf(), receipt_leaf(2, 1, b"\x02" * 32)])
    with pytest.raises(CosignRefused):
        cosign(receipt=ours, root=tree2.root, proof=tree2.proof(1), index=1, chain_id=1, market=MARKET, bls_key=key)


def test_buyer_signature_over_a_spec_recovers_the_buyer():
    from eth_account import Account
    from eth_account.messages import encode_defunct

    buyer = Account.create()
    spec = {"command": ["python", "train.py"], "env": {"EPOCHS": "3"}}
    sig = buyer.sign_message(encode_defunct(text=spec_message(spec_hash(spec)))).signature.hex()
    assert spec_signer(spec, sig) == buyer.address
    assert spec_signer({**spec, "env": {"EPOCHS": "300"}}, sig) != buyer.address

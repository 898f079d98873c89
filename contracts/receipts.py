"""Job specs, completion receipts, the output-files Merkle root, and co-signing a settlement
root.

Pure functions shared by the agent (which signs) and the server (which checks):
no Django, no network. A receipt is canonical JSON (sorted keys, no spaces,
UTF-8); its digest is the SHA-256 of that JSON; the provider's BLS key signs
`RECEIPT_TAG || digest`. The settlement tree (contracts.merkle) commits to
`receipt_leaf(trade_id, gpu_seconds, digest)`, so a provider co-signs a batch
root only after checking that its own leaf, built from its own receipt, is in it.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from contracts.merkle import receipt_leaf, settlement_message, verify_proof

RECEIPT_TAG = b"GridBid.receipt.v1"
SPEC_TAG = "GridBid job spec v1: "
OUTPUT_LEAF_PREFIX = b"\x00"
OUTPUT_NODE_PREFIX = b"\x01"
EMPTY_OUTPUTS_ROOT = hashlib.sha256(b"GridBid.outputs.empty").hexdigest()
# a preempted job's checkpoint, where its spec names no store of the buyer's (issue 31): its
# agent uploads it to the market as an output of this name, and the receipt's checkpoint
# `url` is ``checkpoint_url``: "market:" and the path its buyer downloads it at, which an
# agent resolves against its own market URL (and fetches with its own token)
CHECKPOINT_OUTPUT = ".gridbid-checkpoint.tar"
MARKET_SCHEME = "market:"


def checkpoint_url(job_id: int) -> str:
    return f"{MARKET_SCHEME}/api/v1/jobs/{job_id}/outputs/{CHECKPOINT_OUTPUT}"


class ReceiptError(ValueError):
    pass


def canonical_json(value: Any) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def spec_hash(spec: Mapping[str, Any]) -> str:
    """SHA-256 of the job spec's canonical JSON, hex: what the buyer signs and the receipt names."""
    return hashlib.sha256(canonical_json(dict(spec))).hexdigest()


def spec_message(spec_hash_hex: str) -> str:
    """The text a buyer signs (EIP-191) to vouch for a job spec."""
    return SPEC_TAG + spec_hash_hex


def spec_signer(spec: Mapping[str, Any], signature: str) -> str:
    """The address that signed the spec; ValueError if the signature is malformed."""
    from eth_account import Account
    from eth_account.messages import encode_defunct

    return str(Account.recover_message(encode_defunct(text=spec_message(spec_hash(spec))), signature=signature))


# --- outputs -------------------------------------------------------------------------
@dataclass(frozen=True)
class OutputFile:
    path: str  # relative, '/'-separated
    size: int
    sha256: str


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def output_manifest(root: Path) -> list[OutputFile]:
    """Every regular file under `root`, sorted by path; symlinks are not followed."""
    out = []
    if not root.is_dir():
        return out
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in filenames:
            p = Path(dirpath) / name
            if p.is_symlink() or not p.is_file():
                continue
            out.append(OutputFile(p.relative_to(root).as_posix(), p.stat().st_size, file_sha256(p)))
    return sorted(out, key=lambda f: f.path)


def output_leaf(f: OutputFile) -> bytes:
    return hashlib.sha256(OUTPUT_LEAF_PREFIX + f.path.encode() + b"\x00" + f.size.to_bytes(8, "big") + bytes.fromhex(f.sha256)).digest()


def outputs_root(files: Sequence[OutputFile]) -> str:
    """SHA-256 Merkle root over the files (path, size, digest), index-ordered, hex."""
    if not files:
        return EMPTY_OUTPUTS_ROOT
    level = [output_leaf(f) for f in sorted(files, key=lambda f: f.path)]
    while len(level) > 1:
        if len(level) % 2:
            level.append(bytes(32))
        level = [hashlib.sha256(OUTPUT_NODE_PREFIX + level[i] + level[i + 1]).digest() for i in range(0, len(level), 2)]
    return level[0].hex()


# --- receipts -----------------------------------------------------------------------
RECEIPT_FIELDS = ("version", "trade_id", "job_spec_hash", "started_at", "ended_at", "gpu_seconds", "exit_code", "outputs_root", "outcome", "checkpoint")


@dataclass(frozen=True)
class Receipt:
    trade_id: int
    job_spec_hash: str
    started_at: int  # unix seconds
    ended_at: int
    gpu_seconds: int  # metered by the agent: wall time x GPUs
    exit_code: int | None
    outputs_root: str
    outcome: str  # completed, failed, preempted
    checkpoint: Mapping[str, Any] | None = None
    version: int = 1

    def body(self) -> dict[str, Any]:
        d = asdict(self)
        d["checkpoint"] = dict(self.checkpoint) if self.checkpoint else None
        return d

    def digest(self) -> bytes:
        return hashlib.sha256(canonical_json(self.body())).digest()

    def signing_message(self) -> bytes:
        return RECEIPT_TAG + self.digest()

    def leaf(self) -> bytes:
        return receipt_leaf(self.trade_id, self.gpu_seconds, self.digest())


def receipt_from_body(body: Mapping[str, Any]) -> Receipt:
    if not isinstance(body, Mapping) or set(body) != set(RECEIPT_FIELDS):
        missing = sorted(set(RECEIPT_FIELDS) - set(body or {}))
        extra = sorted(set(body or {}) - set(RECEIPT_FIELDS))
        raise ReceiptError(f"receipt fields wrong (missing {missing}, unexpected {extra})")
    if body["version"] != 1:
        raise ReceiptError(f"unknown receipt version {body['version']!r}")
    ints = ("trade_id", "started_at", "ended_at", "gpu_seconds")
    if any(not isinstance(body[k], int) or isinstance(body[k], bool) or body[k] < 0 for k in ints):
        raise ReceiptError(f"{', '.join(ints)} must be non-negative integers")
    if body["ended_at"] < body["started_at"]:
        raise ReceiptError("ended_at is before started_at")
    for k in ("job_spec_hash", "outputs_root"):
        v = body[k]
        if not isinstance(v, str) or len(v) != 64 or any(c not in "0123456789abcdef" for c in v):
            raise ReceiptError(f"{k} must be 64 lower-case hex digits")
    if body["outcome"] not in ("completed", "failed", "preempted"):
        raise ReceiptError("outcome must be completed, failed or preempted")
    if body["exit_code"] is not None and not isinstance(body["exit_code"], int):
        raise ReceiptError("exit_code must be an integer or null")
    if body["checkpoint"] is not None and not isinstance(body["checkpoint"], Mapping):
        raise ReceiptError("checkpoint must be an object or null")
    return Receipt(**{k: body[k] for k in RECEIPT_FIELDS})


def receipt_sign(receipt: Receipt, bls_key: Any) -> str:
    return bls_key.sign(receipt.signing_message()).hex()


def receipt_verify(receipt: Receipt, signature_hex: str, public_key_hex: str) -> bool:
    """True when the provider's key signed this receipt; False for any malformed input."""
    # lazy: py_ecc takes a second to load, and only checking a signature needs it
    from contracts import bls

    try:
        return bls.verify(bytes.fromhex(public_key_hex), receipt.signing_message(), bytes.fromhex(signature_hex))
    except ValueError:
        return False


# --- co-signing a settlement batch -----------------------------------------------------
class CosignRefused(Exception):
    pass


def cosign(*, receipt: Receipt, root: bytes, proof: Sequence[bytes], index: int, chain_id: int, market: str, bls_key: Any) -> bytes:
    """Check our own leaf is in the batch at `index`, then sign the settlement message.

    The leaf is rebuilt from our own receipt, so a root that commits to other
    GPU-seconds or another digest for our trade fails the proof and is refused.
    """
    if len(root) != 32 or any(len(p) != 32 for p in proof):
        raise CosignRefused("root and proof nodes must be 32 bytes")
    if not verify_proof(receipt.leaf(), list(proof), root, index):
        raise CosignRefused(f"the batch root does not contain our receipt for trade {receipt.trade_id} at index {index}")
    return bytes(bls_key.sign(settlement_message(root, chain_id, market)))


def job_ports(spec: Mapping[str, Any]) -> list[int]:
    """The container ports a job spec publishes: its `ports`, and 22 for `ssh`."""
    ports = [int(p) for p in spec.get("ports") or []]
    if spec.get("ssh") and 22 not in ports:
        ports.insert(0, 22)
    return ports

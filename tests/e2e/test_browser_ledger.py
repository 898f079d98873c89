"""The trade page's proof check in a real Chromium: the vendored keccak-256 and the Merkle
fold agree with contracts/merkle.py, and a tampered receipt is shown as not verified."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from eth_utils import keccak

from contracts.merkle import MerkleTree, receipt_leaf
from tests.conftest import service_missing

pytestmark = [pytest.mark.browser]

STATIC = Path(__file__).resolve().parents[2] / "ledger" / "static" / "ledger"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def page() -> Iterator[Any]:
    if not os.path.exists(CHROMIUM):
        service_missing("Chromium is not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-dev-shm-usage"])
        yield browser.new_page()
        browser.close()


def _html(data: dict[str, Any]) -> str:
    scripts = "".join(f"<script>{(STATIC / name).read_text()}</script>" for name in ("keccak.js", "proof.js"))
    return (f'<!doctype html><html><head><meta charset="utf-8">{scripts}</head><body>'
            f'<strong id="proof-status"></strong><code id="proof-computed-root"></code>'
            f'<script id="proof-data" type="application/json">{json.dumps(data)}</script></body></html>')


def _batch() -> tuple[list[tuple[int, int, bytes]], MerkleTree]:
    receipts = [(100 + i, 3600 * (i + 1), keccak(bytes([i])) ) for i in range(5)]
    return receipts, MerkleTree([receipt_leaf(t, gs, d) for t, gs, d in receipts])


def _inputs(receipts: list[tuple[int, int, bytes]], tree: MerkleTree, index: int) -> dict[str, Any]:
    trade, gs, digest = receipts[index]
    return {"trade": trade, "gpu_seconds": gs, "digest": "0x" + digest.hex(), "leaf": "0x" + tree.leaves[index].hex(),
            "proof": ["0x" + p.hex() for p in tree.proof(index)], "index": index, "root": "0x" + tree.root.hex()}


def test_keccak_in_the_browser_matches_eth_utils(page: Any) -> None:
    page.set_content(_html({}))
    samples = ["", "00", "ab" * 135, "cd" * 136, "ef" * 137, bytes(range(256)).hex() * 2]
    got = page.evaluate("xs => xs.map(h => GridBidKeccak.toHex(GridBidKeccak.keccak256(GridBidKeccak.fromHex(h))))", samples)
    assert got == ["0x" + keccak(bytes.fromhex(h)).hex() for h in samples]


def test_every_receipt_of_a_batch_verifies_in_the_browser(page: Any) -> None:
    receipts, tree = _batch()
    for index in range(len(receipts)):
        page.set_content(_html(_inputs(receipts, tree, index)))
        page.wait_for_function("document.getElementById('proof-status').dataset.verified !== undefined")
        assert page.text_content("#proof-status") == "proof verified ✓"
        assert page.text_content("#proof-computed-root") == "0x" + tree.root.hex()


@pytest.mark.parametrize("tamper,why", [
    ({"gpu_seconds": 1}, "is not the one listed"),
    ({"leaf": None, "gpu_seconds": 1}, "not the settlement root"),
    ({"index": 2}, "not the settlement root"),
    ({"index": 64}, "does not fit"),
])
def test_a_tampered_receipt_or_proof_is_shown_as_not_verified(page: Any, tamper: dict[str, Any], why: str) -> None:
    receipts, tree = _batch()
    data = {**_inputs(receipts, tree, 1), **tamper}
    page.set_content(_html(data))
    page.wait_for_function("document.getElementById('proof-status').dataset.verified !== undefined")
    status = page.text_content("#proof-status")
    assert status.startswith("proof NOT verified") and why in status

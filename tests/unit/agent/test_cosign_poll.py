"""The daemon answers the market's co-signature requests: it signs a settlement root whose
proof holds its own receipt for the trade, and refuses (saying why) any other."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from contracts import bls
from contracts.bls import BlsKey
from contracts.merkle import MerkleTree, receipt_leaf, settlement_message
from contracts.receipts import EMPTY_OUTPUTS_ROOT, Receipt
from providers.agent.client import Rejected
from providers.agent.config import AgentConfig
from providers.agent.daemon import Agent
from providers.agent.inventory import declared_inventory
from providers.agent.state import State

MARKET = "0x5FbDB2315678afecb367f053371D33aA2a4B0c5A"
TRADE = 7


class CosignMarket:
    def __init__(self, requests: list[dict[str, Any]]) -> None:
        self.requests = requests
        self.answers: list[tuple[int, dict[str, Any]]] = []
        self.reject_answers = False

    def cosigns(self) -> list[dict[str, Any]]:
        return list(self.requests)

    def cosign_answer(self, cosign_id: int, **body: Any) -> dict[str, Any]:
        if self.reject_answers:
            raise Rejected("batch settled already", status=409)
        self.answers.append((cosign_id, body))
        return {"id": cosign_id, "state": "signed" if body.get("signature") else "refused"}


@pytest.fixture(scope="module")
def key() -> BlsKey:
    sk = bls.keygen(b"\x0b" * 32)
    return BlsKey(sk, bls.public_key(sk), b"")


def _agent(home: Path, market: CosignMarket, key: BlsKey, receipt: Receipt) -> Agent:
    config = AgentConfig(market_url="http://market.invalid", token="gb_x", machine_name="m", machine_id=1)
    inv = declared_inventory({"host": "t", "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "index": 0}]})
    agent = Agent(home=home, config=config, client=market, state=State(home / "state.sqlite3"), inventory=inv, bls_key=key)  # type: ignore[arg-type]
    agent.state.job_accept(trade_id=receipt.trade_id, job_id=1, spec={"command": ["true"]}, spec_hash="00" * 32, gpus=[0], duration_s=60, runtime="process", resume=None)
    agent.state.job_update(receipt.trade_id, state="finished", receipt=receipt.body(), signature="")
    return agent


def _receipt(gpu_seconds: int = 3600) -> Receipt:
    return Receipt(trade_id=TRADE, job_spec_hash="00" * 32, started_at=1, ended_at=3601, gpu_seconds=gpu_seconds, exit_code=0,
                   outputs_root=EMPTY_OUTPUTS_ROOT, outcome="completed")


def _request(receipt: Receipt, *, claimed_gpu_seconds: int | None = None, cosign_id: int = 1) -> dict[str, Any]:
    """A batch of three receipts, ours at index 1, as the market would send it."""
    gs = receipt.gpu_seconds if claimed_gpu_seconds is None else claimed_gpu_seconds
    ours = receipt_leaf(TRADE, gs, receipt.digest())
    leaves = [receipt_leaf(3, 10, b"\x01" * 32), ours, receipt_leaf(9, 20, b"\x02" * 32)]
    tree = MerkleTree(leaves)
    return {"id": cosign_id, "trade": TRADE, "root": "0x" + tree.root.hex(), "index": 1, "proof": ["0x" + p.hex() for p in tree.proof(1)],
            "chain_id": 31337, "market": MARKET, "signed": False,
            "receipt": {"trade": TRADE, "gpu_seconds": gs, "digest": "0x" + receipt.digest().hex(), "leaf": "0x" + ours.hex()}}


def test_a_root_holding_our_receipt_is_signed_over_the_settlement_message(tmp_path, key):
    receipt = _receipt()
    req = _request(receipt)
    market = CosignMarket([req])
    agent = _agent(tmp_path, market, key, receipt)
    assert agent.cosigns_poll() == {1: "signed"}
    ((cid, body),) = market.answers
    message = settlement_message(bytes.fromhex(req["root"][2:]), 31337, MARKET)
    assert cid == 1 and bls.verify(key.public_key, message, bytes.fromhex(body["signature"]))
    assert agent.cosigns_poll() == {} and len(market.answers) == 1, "answered once"


def test_a_root_that_claims_other_gpu_seconds_for_our_trade_is_refused_with_the_reason(tmp_path, key, capsys):
    receipt = _receipt()
    market = CosignMarket([_request(receipt, claimed_gpu_seconds=7200)])
    agent = _agent(tmp_path, market, key, receipt)
    assert agent.cosigns_poll() == {1: "refused"}
    ((_, body),) = market.answers
    assert "signature" not in body
    assert "differs from our receipt" in body["refuse"] and "7200" in body["refuse"] and "3600" in body["refuse"]
    assert "refused to co-sign" in capsys.readouterr().out


def test_a_proof_that_does_not_reach_the_root_is_refused_even_when_the_leaf_matches(tmp_path, key):
    receipt = _receipt()
    req = _request(receipt)
    req["root"] = "0x" + "ee" * 32
    market = CosignMarket([req])
    agent = _agent(tmp_path, market, key, receipt)
    assert agent.cosigns_poll() == {1: "refused"}
    assert "does not contain our receipt" in market.answers[0][1]["refuse"]


def test_a_request_for_a_trade_we_hold_no_receipt_for_is_refused(tmp_path, key):
    receipt = _receipt()
    req = {**_request(receipt), "trade": 99}
    market = CosignMarket([req])
    agent = _agent(tmp_path, market, key, receipt)
    assert agent.cosigns_poll() == {1: "refused"}
    assert "no receipt of ours for trade 99" in market.answers[0][1]["refuse"]


def test_a_market_that_rejects_our_answer_does_not_stop_the_agent(tmp_path, key):
    receipt = _receipt()
    market = CosignMarket([_request(receipt)])
    market.reject_answers = True
    agent = _agent(tmp_path, market, key, receipt)
    assert agent.cosigns_poll() == {1: "rejected"}
    assert agent.cosigns_poll() == {}


def test_the_loop_polls_cosigns_with_assignments(tmp_path, key):
    receipt = _receipt()
    market = CosignMarket([_request(receipt)])
    agent = _agent(tmp_path, market, key, receipt)
    market.assignments = lambda machine_id: []  # type: ignore[attr-defined]
    market.heartbeat = lambda machine_id, body: {}  # type: ignore[attr-defined]
    agent.tick(now=1000.0)
    assert [cid for cid, _ in market.answers] == [1]

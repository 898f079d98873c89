"""The agent's queue of output uploads against an in-memory market: after the receipt, one
file at a time, bounded retries with backoff on transient failures, none on a refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

from contracts import bls
from contracts.bls import BlsKey
from contracts.receipts import spec_hash
from providers.agent.client import Rejected, Transient
from tests.agent_loop import tick_until
from tests.unit.agent.test_daemon import FakeMarket, assignment, make_agent, signed_spec

WRITES_TWO = "import os; os.makedirs('outputs/sub'); open('outputs/a.txt', 'w').write('alpha'); open('outputs/sub/b.txt', 'w').write('beta')"


@pytest.fixture(scope="module")
def key() -> BlsKey:
    sk = bls.keygen(b"\x0a" * 32)
    return BlsKey(sk, bls.public_key(sk), b"")


class StoringMarket(FakeMarket):
    def __init__(self, failures: list[Exception] | None = None) -> None:
        super().__init__()
        self.failures = list(failures or [])
        self.stored: dict[str, bytes] = {}
        self.receipt_first = True

    def job_output_upload(self, job_id: int, machine_id: int, path: str, file: Path) -> dict:
        self.receipt_first = self.receipt_first and bool(self.receipts)
        if self.failures:
            raise self.failures.pop(0)
        self.stored[path] = file.read_bytes()
        return {"path": path}


def test_outputs_are_uploaded_after_the_receipt_and_transient_failures_are_retried(tmp_path, key):
    market = StoringMarket([Transient("market answered 503"), Rejected("no receipt yet", status=409)])
    agent = make_agent(tmp_path, market, key, upload_retry_s=0.05)
    market.assignments_list = [assignment(1, WRITES_TWO)]
    tick_until(agent, lambda: len(agent.state.uploads(1)) == 2 and not agent.state.uploads_pending(1))
    assert market.stored == {"a.txt": b"alpha", "sub/b.txt": b"beta"} and market.receipt_first
    rows = agent.state.uploads(1)
    assert {u["state"] for u in rows} == {"done"} and sum(u["attempts"] for u in rows) == 4, "two failed tries, then each file once"


def test_an_upload_that_keeps_failing_is_given_up_after_upload_attempts(tmp_path, key, capsys):
    market = StoringMarket([Transient("market answered 502")] * 10)
    agent = make_agent(tmp_path, market, key, upload_retry_s=0.01, upload_attempts=3)
    market.assignments_list = [assignment(2, "open('outputs/a.txt', 'w').write('alpha')")]
    tick_until(agent, lambda: agent.state.uploads(2) and agent.state.uploads(2)[0]["state"] == "failed")
    (row,) = agent.state.uploads(2)
    assert row["attempts"] == 3 and "502" in row["error"] and len(market.failures) == 7
    assert "giving up after 3 tries" in capsys.readouterr().out


def test_a_file_the_market_refuses_is_not_tried_again(tmp_path, key):
    market = StoringMarket([Rejected("does not match the receipt", status=400), Transient("never reached")])
    agent = make_agent(tmp_path, market, key, upload_retry_s=0.01)
    market.assignments_list = [assignment(3, "open('outputs/a.txt', 'w').write('alpha')")]
    tick_until(agent, lambda: agent.state.uploads(3) and agent.state.uploads(3)[0]["state"] == "failed")
    assert agent.state.uploads(3)[0]["attempts"] == 1 and len(market.failures) == 1


def test_a_job_with_its_own_upload_url_queues_nothing_for_the_market(tmp_path, key):
    market = StoringMarket()
    agent = make_agent(tmp_path, market, key)
    a = assignment(4, "open('outputs/a.txt', 'w').write('alpha')")
    spec = {**a["job_spec"], "upload_url": "ftp://store.invalid/outputs"}  # a store the agent cannot use: kept on the machine
    market.assignments_list = [{**a, "job_spec": spec, "spec_hash": spec_hash(spec), "spec_signature": signed_spec(spec)}]
    tick_until(agent, lambda: market.receipts, timeout=30)
    for _ in range(3):
        agent.tick()
    assert agent.state.uploads(4) == [] and market.stored == {}


"""The daemon against an in-memory market: assignments, refusals, runs, preemption, resume, restart."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import pytest

from contracts import bls
from contracts.bls import BlsKey
from contracts.receipts import (
    output_manifest,
    outputs_root,
    receipt_from_body,
    receipt_verify,
    spec_hash,
    spec_message,
)
from providers.agent.client import AuthFailed, Rejected, Transient
from providers.agent.config import AgentConfig
from providers.agent.daemon import Agent, Stop
from providers.agent.inventory import declared_inventory
from providers.agent.state import State
from tests.agent_loop import tick_until

PY = sys.executable
MACHINE = 11


class FakeMarket:
    def __init__(self) -> None:
        self.assignments_list: list[dict] = []
        self.events: list[tuple[int, dict]] = []
        self.receipts: list[tuple[int, dict]] = []
        self.heartbeats: list[dict] = []
        self.offline: list[int] = []
        self.fail_next: Exception | None = None

    def _maybe_fail(self) -> None:
        if self.fail_next is not None:
            exc, self.fail_next = self.fail_next, None
            raise exc

    def me(self):
        self._maybe_fail()
        return {"username": "p", "role": "provider"}

    def heartbeat(self, machine_id, body):
        self._maybe_fail()
        self.heartbeats.append(body)
        return {}

    def machine_offline(self, machine_id):
        self._maybe_fail()
        self.offline.append(machine_id)
        return {"machine": machine_id, "state": "offline", "paused_offers": 0}

    def assignments(self, machine_id):
        self._maybe_fail()
        return list(self.assignments_list)

    def job_event(self, job_id, body):
        self._maybe_fail()
        self.events.append((job_id, body))
        return {}

    def job_receipt(self, job_id, body):
        self._maybe_fail()
        self.receipts.append((job_id, body))
        return {}

    def offers(self, machine_id):
        return []

    def kinds(self, job_id: int) -> list[str]:
        return [b["event"] for j, b in self.events if j == job_id]


@pytest.fixture(scope="module")
def key() -> BlsKey:
    sk = bls.keygen(b"\x09" * 32)
    return BlsKey(sk, bls.public_key(sk), b"")


INVENTORY = declared_inventory({"host": "test", "gpus": [{"name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559, "index": i} for i in range(4)]})


def make_agent(home: Path, market: FakeMarket, key: BlsKey, **cfg) -> Agent:
    config = AgentConfig(market_url="http://market.invalid", token="gb_x", machine_name="m", machine_id=MACHINE, grace_s=3, heartbeat_s=0.2, poll_s=0.2, **cfg)
    return Agent(home=home, config=config, client=market, state=State(home / "state.sqlite3"), inventory=INVENTORY, bls_key=key)  # type: ignore[arg-type]


BUYER_KEY = "0x" + "42" * 32  # the buyer whose signature over each spec the agent checks


def signed_spec(spec: dict) -> str:
    from eth_account import Account
    from eth_account.messages import encode_defunct

    from contracts.receipts import spec_message

    return "0x" + Account.from_key(BUYER_KEY).sign_message(encode_defunct(text=spec_message(spec_hash(spec)))).signature.hex().removeprefix("0x")


def assignment(trade: int, code: str, *, job: int | None = None, gpus=(0, 1), **kw) -> dict:
    from eth_account import Account

    spec = {"command": [PY, "-c", code], "output_dir": "outputs"}
    base = {"job": job or trade + 100, "trade": trade, "machine": MACHINE, "state": "assigned", "trade_state": "recorded", "gpus": list(gpus), "duration_s": 600, "job_spec": spec, "spec_hash": spec_hash(spec), "preempt": False,
            "spec_signature": signed_spec(spec), "buyer_address": Account.from_key(BUYER_KEY).address}
    return {**base, **kw}


def run_until(agent: Agent, done, timeout: float = 15.0) -> None:
    tick_until(agent, done, timeout)


def test_a_job_runs_and_is_reported_with_a_signed_receipt(tmp_path, key):
    market = FakeMarket()
    agent = make_agent(tmp_path, market, key)
    market.assignments_list = [assignment(1, "open('outputs/result.txt', 'w').write('42')")]
    run_until(agent, lambda: market.receipts)
    assert market.kinds(101) == ["started", "completed"]
    (job_id, body), = market.receipts
    r = receipt_from_body(body["receipt"])
    assert (r.trade_id, r.exit_code, r.outcome) == (1, 0, "completed")
    assert receipt_verify(r, body["signature"], key.public_key.hex())
    out = tmp_path / "jobs/1/work/outputs"
    assert (out / "result.txt").read_text() == "42"
    assert r.outputs_root == outputs_root(output_manifest(out)) and body["outputs"][0]["path"] == "result.txt"
    assert market.heartbeats and len(market.heartbeats[0]["gpus"]) == 4


def test_a_duplicate_assignment_starts_nothing_new(tmp_path, key):
    market = FakeMarket()
    agent = make_agent(tmp_path, market, key)
    a = assignment(2, "open('/dev/null','w')")
    assert agent.assign(a) == "accepted"
    assert agent.assign(a) == "duplicate"
    assert agent.assign({**a, "job": 999}) == "duplicate"


@pytest.mark.parametrize("change,why", [
    ({"machine": 12}, "not this machine"),
    ({"spec_hash": "00" * 32}, "does not match its hash"),
    ({"gpus": [0, 9]}, "do not exist"),
    ({"spec_signature": "0x" + "11" * 65, "buyer_address": "0x" + "22" * 20}, "signature"),
    ({"state": "running"}, "not run twice"),
])
def test_assignments_that_must_not_run_here_are_refused_and_reported(tmp_path, key, change, why):
    market = FakeMarket()
    agent = make_agent(tmp_path, market, key)
    assert agent.assign(assignment(3, "pass", **change)) == "refused"
    agent.flush()
    assert market.kinds(103) == ["failed"] and why in market.events[0][1]["reason"]
    assert not (tmp_path / "jobs/3").exists()


def test_a_buyer_signed_spec_is_accepted_and_an_unsigned_one_refused_when_required(tmp_path, key):
    from eth_account import Account
    from eth_account.messages import encode_defunct

    buyer = Account.create()
    market = FakeMarket()
    agent = make_agent(tmp_path, market, key)  # required by default
    a = assignment(4, "pass", spec_signature=None)
    assert agent.assign(a) == "refused"
    other = assignment(6, "pass", buyer_address=Account.create().address)
    assert agent.assign(other) == "refused", "signed, but not by the trade's buyer"
    signed = assignment(5, "pass", buyer_address=buyer.address)
    signed["spec_signature"] = buyer.sign_message(encode_defunct(text=spec_message(signed["spec_hash"]))).signature.hex()
    assert agent.assign(signed) == "accepted"


def test_a_trade_not_yet_recorded_is_neither_run_nor_refused(tmp_path, key):
    agent = make_agent(tmp_path, FakeMarket(), key)
    assert agent.assign(assignment(6, "pass", trade_state="pending")) == "waiting"
    assert agent.state.job(6) is None


def test_busy_gpus_are_not_given_to_a_second_job(tmp_path, key):
    market = FakeMarket()
    agent = make_agent(tmp_path, market, key)
    market.assignments_list = [assignment(7, "import time; time.sleep(30)")]
    run_until(agent, lambda: 7 in agent.running)
    assert agent.assign(assignment(8, "pass", gpus=[1, 2])) == "refused"
    agent.running[7].kill("cancelled")


CHECKPOINTING_JOB = (
    "import os, signal, sys, time\n"
    "resume = os.environ.get('GRIDBID_RESUME_FROM')\n"
    "start = int(open(os.path.join(resume, 'step')).read()) if resume else 0\n"
    "step = start\n"
    "def save(*_):\n"
    "    open(os.path.join(os.environ['GRIDBID_CHECKPOINT_DIR'], 'step'), 'w').write(str(step))\n"
    "    sys.exit(0)\n"
    "signal.signal(signal.SIGTERM, save)\n"
    "open('outputs/resumed_from', 'w').write(str(start))\n"
    "while step < start + 3 if resume else True:\n"
    "    step += 1\n"
    "    time.sleep(0.05)\n"
    "open('outputs/final', 'w').write(str(step))\n"
)


def test_preempted_job_checkpoints_and_resumes_on_another_agent(tmp_path, key):
    market = FakeMarket()
    a1 = make_agent(tmp_path / "a1", market, key)
    market.assignments_list = [assignment(9, CHECKPOINTING_JOB, job=50)]
    run_until(a1, lambda: (tmp_path / "a1/jobs/9/work/outputs/resumed_from").exists())
    time.sleep(0.3)
    market.assignments_list = [assignment(9, CHECKPOINTING_JOB, job=50, preempt=True)]
    run_until(a1, lambda: market.receipts)
    assert market.kinds(50) == ["started", "checkpointed", "preempted"]
    r = receipt_from_body(market.receipts[0][1]["receipt"])
    assert r.outcome == "preempted" and r.checkpoint["size"] > 0
    saved = int((tmp_path / "a1/jobs/9/work/checkpoint/step").read_text())
    assert saved > 0
    # the market re-matches it to another machine, which resumes from the checkpoint
    market2 = FakeMarket()
    a2 = make_agent(tmp_path / "a2", market2, key)
    # no store named: the market keeps it (a1 uploads it as an output), and the receipt says so
    assert r.checkpoint["url"] == "market:/api/v1/jobs/50/outputs/.gridbid-checkpoint.tar"
    assert [u["path"] for u in a1.state.uploads(9)][:1] == [".gridbid-checkpoint.tar"], "queued first"
    kept = (tmp_path / "a1/checkpoints/trade-9.tar").as_uri()  # standing in for the market's copy
    market2.assignments_list = [assignment(10, CHECKPOINTING_JOB, job=51, resume_from={**r.checkpoint, "url": kept})]
    run_until(a2, lambda: market2.receipts)
    out = tmp_path / "a2/jobs/10/work/outputs"
    assert int((out / "resumed_from").read_text()) == saved
    assert int((out / "final").read_text()) == saved + 3
    assert receipt_from_body(market2.receipts[0][1]["receipt"]).outcome == "completed"


def test_after_a_restart_the_agent_reattaches_to_a_running_job_and_runs_nothing_twice(tmp_path, key):
    market = FakeMarket()
    code = "import time; open('outputs/runs', 'a').write('x'); time.sleep(3.0)"
    agent = make_agent(tmp_path, market, key)
    market.assignments_list = [assignment(12, code)]
    run_until(agent, lambda: 12 in agent.running)
    agent.state.close()  # the agent dies; the job's process group lives on
    market2 = FakeMarket()
    market2.assignments_list = [assignment(12, code)]
    again = make_agent(tmp_path, market2, key)
    again.recover()
    assert 12 in again.running and again.running[12].popen is None
    run_until(again, lambda: market2.receipts)
    assert (tmp_path / "jobs/12/work/outputs/runs").read_text() == "x"
    assert receipt_from_body(market2.receipts[0][1]["receipt"]).exit_code == 0


def test_a_job_that_ended_while_the_agent_was_down_is_reported_with_its_exit_code(tmp_path, key):
    market = FakeMarket()
    agent = make_agent(tmp_path, market, key)
    go = tmp_path / "go"
    # The job waits for the test's word, so the agent cannot reap it before it goes down.
    code = f"import os, time\nwhile not os.path.exists({str(go)!r}): time.sleep(0.01)\nraise SystemExit(4)"
    market.assignments_list = [assignment(13, code)]
    run_until(agent, lambda: 13 in agent.running)
    agent.state.close()
    go.touch()
    agent.running[13].popen.wait(10)
    market2 = FakeMarket()
    again = make_agent(tmp_path, market2, key)
    again.recover()
    again.flush()
    r = receipt_from_body(market2.receipts[0][1]["receipt"])
    assert (r.outcome, r.exit_code) == ("failed", 4)
    assert market2.kinds(113) == ["failed"]


def test_reports_wait_out_a_market_outage_and_a_refused_report_is_dropped(tmp_path, key):
    market = FakeMarket()
    agent = make_agent(tmp_path, market, key)
    agent.state.report(trade_id=1, job_id=1, kind="event", body={"event": "started"})
    agent.state.report(trade_id=1, job_id=1, kind="event", body={"event": "completed"})
    market.fail_next = Transient("market answered 503")
    with pytest.raises(Transient):
        agent.flush()
    assert len(agent.state.pending_reports()) == 2
    market.fail_next = Rejected("conflict", status=409)
    agent.flush()
    assert agent.state.pending_reports() == [] and market.kinds(1) == ["completed"]


def test_bad_credentials_stop_the_daemon_with_one_clear_message(tmp_path, key):
    market = FakeMarket()
    agent = make_agent(tmp_path, market, key)
    market.fail_next = AuthFailed("the market refused our credentials (401): Unknown token.", status=401)
    with pytest.raises(Stop, match="Unknown token.*provide"):
        agent.run_forever(threading.Event())


def test_transport_errors_back_off_and_retry(tmp_path, key, monkeypatch):
    from providers.agent import daemon

    monkeypatch.setattr(daemon, "backoff_delays", lambda *a: iter([0.01] * 100))
    market = FakeMarket()
    agent = make_agent(tmp_path, market, key)
    market.fail_next = Transient("cannot reach the market")
    stop = threading.Event()
    threading.Timer(0.5, stop.set).start()
    agent.run_forever(stop, tick_s=0.05)
    assert market.heartbeats  # it connected after the failure and carried on


def test_a_stopped_daemon_tells_the_market_its_machine_is_going_offline(tmp_path, key):
    market = FakeMarket()
    agent = make_agent(tmp_path, market, key)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    agent.run_forever(stop, tick_s=0.05)
    assert market.heartbeats and market.offline == [agent.machine_id]


def test_a_daemon_stopping_while_the_market_is_away_still_stops(tmp_path, key):
    market = FakeMarket()
    agent = make_agent(tmp_path, market, key)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    original = market.machine_offline

    def away(machine_id):
        market.fail_next = Transient("cannot reach the market")
        return original(machine_id)

    market.machine_offline = away
    agent.run_forever(stop, tick_s=0.05)  # returns: the machine goes offline by its silence instead
    assert market.offline == []


def test_the_agent_cosigns_only_a_root_holding_its_own_receipt(tmp_path, key):
    from contracts.merkle import MerkleTree, receipt_leaf, settlement_message
    from contracts.receipts import CosignRefused

    market = FakeMarket()
    agent = make_agent(tmp_path, market, key)
    market.assignments_list = [assignment(20, "pass")]
    run_until(agent, lambda: market.receipts)
    mine = receipt_from_body(agent.state.job(20)["receipt"])
    other = receipt_leaf(21, 50, b"\x02" * 32)
    tree = MerkleTree([other, mine.leaf()])
    market_addr = "0x" + "ab" * 20
    req = {"trade": 20, "root": tree.root.hex(), "proof": [p.hex() for p in tree.proof(1)], "index": 1, "chain_id": 31337, "market": market_addr}
    sig = bytes.fromhex(agent.cosign_request(req))
    assert bls.verify(key.public_key, settlement_message(tree.root, 31337, market_addr), sig)
    cheat = MerkleTree([other, receipt_leaf(20, mine.gpu_seconds // 2, mine.digest())])
    with pytest.raises(CosignRefused):
        agent.cosign_request({**req, "root": cheat.root.hex(), "proof": [p.hex() for p in cheat.proof(1)]})
    with pytest.raises(CosignRefused, match="no receipt"):
        agent.cosign_request({**req, "trade": 99})


def test_inputs_are_fetched_before_the_start_and_a_bad_digest_fails_the_job(tmp_path, key):
    import hashlib

    data = tmp_path / "weights.bin"
    data.write_bytes(b"w" * 1000)
    market = FakeMarket()
    agent = make_agent(tmp_path / "home", market, key)
    good = assignment(30, "import os; open('outputs/n', 'w').write(str(os.path.getsize('inputs/w.bin')))")
    good["job_spec"]["inputs"] = [{"url": data.as_uri(), "sha256": hashlib.sha256(b"w" * 1000).hexdigest(), "path": "w.bin"}]
    good["spec_hash"], good["spec_signature"] = spec_hash(good["job_spec"]), signed_spec(good["job_spec"])
    bad = assignment(31, "open('outputs/ran', 'w')")
    bad["job_spec"]["inputs"] = [{"url": data.as_uri(), "sha256": "0" * 64}]
    bad["spec_hash"], bad["spec_signature"] = spec_hash(bad["job_spec"]), signed_spec(bad["job_spec"])
    market.assignments_list = [good, bad]
    run_until(agent, lambda: len(market.receipts) == 2)
    assert (tmp_path / "home/jobs/30/work/outputs/n").read_text() == "1000"
    assert market.kinds(131) == ["failed"]
    assert any("sha256" in body["reason"] for job, body in market.events if job == 131)
    assert not (tmp_path / "home/jobs/31/work/outputs/ran").exists()


def test_a_resume_url_of_the_market_that_points_elsewhere_is_not_fetched_with_our_token(tmp_path, key):
    # review: 'market:' + '@evil.example/x' glued to the market URL is a request to evil.example
    # carrying this agent's bearer token; only this one shape of path is fetched
    market = FakeMarket()
    agent = make_agent(tmp_path / "home", market, key)
    market.assignments_list = [assignment(32, "open('outputs/ran', 'w')", job=132, resume_from={"url": "market:@evil.example/x", "sha256": "ab" * 32, "size": 3, "trade": 9})]
    run_until(agent, lambda: market.receipts)
    assert market.kinds(132) == ["failed"]
    assert any("not a checkpoint kept by the market" in body["reason"] for job, body in market.events if job == 132)
    assert not (tmp_path / "home/jobs/32/work/outputs/ran").exists()

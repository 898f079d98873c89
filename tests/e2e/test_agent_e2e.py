"""A real `gridbid up` server (SQLite, in-process Celery clearing rounds every 2 s) and real
`gridbid-agent` subprocesses on declared inventories: init, detect, register, price set, heartbeats;
then a buyer's bid is matched by a round and run by the winning agent, whose signed receipt the
market verifies and the buyer sees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.conftest import running_server
from tests.e2e.funds import (
    TOKENS,
    buyer_view,
    chain_rpc,
    escrow_deposit,
    fund,
    funded_buyer,
    make_tokens,
    token_balance,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
SERVER_ENV: dict[str, str] = {}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(tmp_path_factory.mktemp("market"), demo=False) as (base, env):
        SERVER_ENV.clear()
        SERVER_ENV.update(env)
        yield base


def agent_env(home: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GRIDBID_AGENT_HOME": str(home), "PYTHONPATH": str(ROOT), "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}


def agent(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "providers.agent", *args], cwd=ROOT, env=agent_env(home), capture_output=True, text=True, timeout=timeout)


def flat(text: str) -> str:
    """Output with rich's line wrapping undone."""
    return " ".join(text.split())


def join_market(server: str, tmp_path: Path, name: str, token: str, *, region: str, price: str, gpu: tuple[str, int, str] = ("NVIDIA H100 80GB HBM3", 81559, "H100-SXM-80GB"),
                states: str = "pending,recorded", chain: bool = False, fund: Callable[[Path], None] | None = None,
                cuda: str = "", machine: dict[str, Any] | None = None, count: int = 2, links: list[dict[str, Any]] | None = None) -> tuple[Path, int]:
    """A provider with a machine of `count` GPUs (2; linked as `links` say, its driver
    supporting `cuda`, its host as `machine` declares), registered (on chain too with `chain`,
    after `fund` gives its address tokens and gas) and priced; returns (agent home, machine id)."""
    gpu_name, memory_mib, model = gpu
    inventory = tmp_path / f"{name}.json"
    inventory.write_text(json.dumps({"host": name, "gpus": [{"index": i, "name": gpu_name, "memory_mib": memory_mib} for i in range(count)],
                                     **({"links": links} if links else {}),
                                     **({"cuda_version": cuda, "driver_version": "550.54.15"} if cuda else {}), **({"machine": machine} if machine else {})}))
    home = tmp_path / name
    r = agent(home, "init", "--market", server, "--token", token, "--machine-name", name, "--region", region, "--inventory", str(inventory),
              "--kdf-iterations", "2", "--accept-trade-states", states, "--runtime", "process")
    assert r.returncode == 0, f"init: {r.stderr}{r.stdout}"
    if fund is not None:
        fund(home)
    r = agent(home, "register", *(() if chain else ("--no-chain",)))
    assert r.returncode == 0, f"register: {r.stderr}{r.stdout}"
    machine_id = int(r.stdout.split("as #")[1].split()[0])
    if chain:
        assert "Registered on chain 31337" in r.stdout and "staked 100 tokens" in r.stdout, r.stdout
    r = agent(home, "price", "set", model, "--fixed", price)
    assert r.returncode == 0, f"price: {r.stderr}{r.stdout}"
    return home, machine_id


def test_an_agent_joins_the_market_and_its_offers_appear(server, tmp_path):
    token = make_tokens(SERVER_ENV, rackowner=("provider", ("read", "provide")))["rackowner"]
    inventory = tmp_path / "inventory.json"
    # two NVLink pairs, PCIe between them (issue 38): the agent registers each GPU's NVLink domain
    inventory.write_text(json.dumps({"host": "rack1", "driver_version": "550.54.15", "cuda_version": "12.4", "gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559} for i in range(4)],
                                     "links": [{"a": 0, "b": 1, "kind": "nvlink"}, {"a": 2, "b": 3, "kind": "nvlink"}, {"a": 1, "b": 2, "kind": "pcie-host"}]}))
    home = tmp_path / "agent"

    r = agent(home, "init", "--market", server, "--token", token, "--machine-name", "rack1", "--region", "eu-west", "--inventory", str(inventory), "--kdf-iterations", "2")
    assert r.returncode == 0, r.stderr + r.stdout
    assert "token valid" in r.stdout
    assert oct((home / "keys" / "bls.json").stat().st_mode)[-3:] == "600"

    r = agent(home, "detect")
    assert r.returncode == 0, r.stderr
    assert "H100-SXM-80GB" in r.stdout and "catalogue model H100-SXM-80GB" in r.stdout

    r = agent(home, "register")
    # the machine is registered; staking on chain needs tokens the new address does not have
    assert r.returncode == 1, r.stderr + r.stdout
    machine_id = int(r.stdout.split("as #")[1].split()[0])
    assert "Not enough tokens for the stake" in flat(r.stderr) and "holds 0 of token" in flat(r.stderr) and "Traceback" not in r.stderr
    assert "run `gridbid-agent faucet` for test tokens and gas" in flat(r.stderr), "the dev chain's faucet is named"

    r = agent(home, "price", "set", "H100-SXM-80GB", "--floor", "2.00", "--premium", "1.00")
    assert r.returncode == 0, r.stderr + r.stdout

    offers = httpx.get(f"{server}/api/v1/offers/", params={"machine": machine_id}).json()["results"]
    assert [(o["gpu_model"], o["gpus"], o["price"], o["region"]) for o in offers] == [("H100-SXM-80GB", 4, 2_000_000, "eu-west")]

    auth = {"Authorization": f"Bearer {token}"}
    me = httpx.get(f"{server}/api/v1/providers/me/", headers=auth).json()
    assert len(me["bls_public_key"]) == 96 and me["chain_address"].startswith("0x")

    r = agent(home, "run", "--max-seconds", "4", timeout=30)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "connected to" in r.stdout
    # it heartbeated while it ran; stopping, it took its machine offline at once, so no round
    # matches a buyer to it until it runs again
    assert f"the market has machine {machine_id} offline; 1 open offer paused" in r.stdout, r.stdout
    machine = httpx.get(f"{server}/api/v1/machines/{machine_id}/", headers=auth).json()
    assert machine["state"] == "offline" and machine["last_heartbeat"]
    assert [g["nvlink_group"] for g in machine["gpus"]] == [0, 0, 2, 2] and machine["interconnect"] == "pcie"


def test_a_bid_that_needs_nvlink_is_booked_on_one_nvlink_pair_and_its_job_sees_those_gpus(server, tmp_path):
    # issue 38: a real agent reads its topology from the inventory file (GPUs 0+2 and 1+3 share
    # NVLink, PCIe between the pairs); a 1-GPU job takes one GPU of a pair, and a 2-GPU bid that
    # needs NVLink is booked on the other pair whole, not on the first two GPUs free (1 and 2,
    # across PCIe), and its job is shown exactly those GPUs
    tokens = make_tokens(SERVER_ENV, linked=("provider", ("read", "provide")), trainer2=("buyer", ("read", "trade")))
    links = [{"a": 0, "b": 2, "kind": "nvlink"}, {"a": 1, "b": 3, "kind": "nvlink"}, {"a": 0, "b": 1, "kind": "pcie-host"}]
    # A100 machines, so no bid of the other tests can land here
    home, machine = join_market(server, tmp_path, "linked", tokens["linked"], region="eu-west", price="1.20", gpu=("NVIDIA A100-SXM4-80GB", 81920, "A100-SXM-80GB"),
                                count=4, links=links)
    auth = {"Authorization": f"Bearer {tokens['linked']}"}
    gpus = httpx.get(f"{server}/api/v1/machines/{machine}/", headers=auth).json()["gpus"]
    assert [g["nvlink_group"] for g in gpus] == [0, 1, 0, 1], gpus
    daemon = start_daemon(home, seconds=110)
    server_log = Path(SERVER_ENV["GRIDBID_DATA_DIR"]) / "server.log"
    logs = lambda: (home / "daemon.log").read_text()[-3000:] + "\n" + server_log.read_text()[-3000:]  # noqa: E731
    shows = "import os, time; print('visible', os.environ['CUDA_VISIBLE_DEVICES'], flush=True); time.sleep({})"
    try:
        buyer = {"Authorization": f"Bearer {tokens['trainer2']}"}
        escrow_deposit(server, SERVER_ENV, "trainer2", buyer, 2 * TOKENS)
        bid = {"gpu_models": ["A100-SXM-80GB"], "max_price": 2_000_000, "duration_s": 120}
        r = httpx.post(f"{server}/api/v1/bids/", headers=buyer, json={**bid, "job_spec": {"command": [sys.executable, "-c", shows.format(100)]}, "gpus": 1})
        assert r.status_code == 201, r.text

        def running(besides: int | None) -> Any:
            jobs = [j for j in httpx.get(f"{server}/api/v1/jobs/", headers=buyer).json()["results"] if j["id"] != besides]
            return jobs and "visible" in (jobs[0]["log_tail"] or "") and jobs[0]

        first = wait_for("the 1-GPU job running", lambda: running(None), seconds=40, logs=logs)
        single = int(first["log_tail"].split("visible ")[1].split()[0])
        r = httpx.post(f"{server}/api/v1/bids/", headers=buyer, json={**bid, "job_spec": {"command": [sys.executable, "-c", shows.format(1)]}, "gpus": 2,
                                                                     "interconnect": "nvlink"})
        assert r.status_code == 201, r.text
        assert r.json()["interconnect"] == "nvlink"
        second = wait_for("the NVLink pair's job running", lambda: running(first["id"]), seconds=40, logs=logs)
        seen = sorted(int(g) for g in second["log_tail"].split("visible ")[1].split()[0].split(","))
        other = [g["index"] for g in gpus if g["nvlink_group"] != gpus[single]["nvlink_group"]]
        assert seen == other, f"the 1-GPU job holds GPU {single}; the pair was booked on {seen}, not the other NVLink pair {other}"
        first = httpx.get(f"{server}/api/v1/jobs/{first['id']}/", headers=buyer).json()
        assert first["state"] == "running", "the two jobs ran side by side"
    finally:
        stop_daemons([daemon])


def test_a_fresh_agent_gets_test_tokens_from_the_faucet_then_registers_on_chain(server, tmp_path):
    token = make_tokens(SERVER_ENV, newcomer=("provider", ("read", "provide")))["newcomer"]
    said: dict[str, str] = {}

    def faucet(home: Path) -> None:
        r = agent(home, "faucet")
        assert r.returncode == 0, r.stderr + r.stdout
        said["faucet"] = flat(r.stdout)

    home, _ = join_market(server, tmp_path, "newcomer", token, region="eu-west", price="2.00", chain=True, fund=faucet)
    assert "sending 1000 test tokens and gas" in said["faucet"] and "holds 1000 tokens" in said["faucet"], said["faucet"]
    assert "Now run `gridbid-agent register`" in said["faucet"]
    r = agent(home, "faucet")
    assert r.returncode == 1 and "less than an hour ago" in flat(r.stderr) and "Traceback" not in r.stderr, r.stderr + r.stdout
    # the stake shows once the market's listener has confirmed the Registered event
    r = wait_for("the stake in the agent's earnings", lambda: (out := agent(home, "earnings")).returncode == 0 and "stake 100 " in flat(out.stdout) and out, seconds=30)
    assert "Traceback" not in r.stderr


def test_a_bad_token_stops_the_agent_with_one_clear_message(server, tmp_path):
    r = agent(tmp_path / "a", "init", "--market", server, "--token", "gb_deadbeef_nope", "--kdf-iterations", "2")
    assert r.returncode != 0
    assert "Unknown token" in r.stderr and "Traceback" not in r.stderr


def test_a_matched_bid_runs_on_the_winning_agent_and_the_buyer_sees_the_receipt(server, tmp_path):
    tokens = make_tokens(SERVER_ENV, cheap=("provider", ("read", "provide")), dear=("provider", ("read", "provide")), trainer=("buyer", ("read", "trade")))
    cheap, cheap_machine = join_market(server, tmp_path, "cheap", tokens["cheap"], region="eu-west", price="1.50")
    dear, _ = join_market(server, tmp_path, "dear", tokens["dear"], region="us-east", price="2.50")
    daemons = []
    for home in (cheap, dear):
        log = open(home / "daemon.log", "w")  # noqa: SIM115 - closed below
        daemons.append((subprocess.Popen([sys.executable, "-m", "providers.agent", "run", "--poll-seconds", "0.5", "--heartbeat-seconds", "1", "--max-seconds", "50"], cwd=ROOT, env=agent_env(home), stdout=log, stderr=subprocess.STDOUT, start_new_session=True), log))
    try:
        buyer = {"Authorization": f"Bearer {tokens['trainer']}"}
        escrow_deposit(server, SERVER_ENV, "trainer", buyer, 1 * TOKENS)
        spec = {"command": [sys.executable, "-c", "import os; print('training done, loss 0.042', flush=True); open(os.environ['GRIDBID_OUTPUT_DIR'] + '/result.txt', 'w').write('42')"]}
        r = httpx.post(f"{server}/api/v1/bids/", headers=buyer, json={"job_spec": spec, "gpus": 1, "gpu_models": ["H100-SXM-80GB"], "max_price": 3_000_000, "duration_s": 60})
        assert r.status_code == 201, r.text
        deadline = time.monotonic() + 40
        job = None
        while time.monotonic() < deadline:
            jobs = httpx.get(f"{server}/api/v1/jobs/", headers=buyer).json()["results"]
            if jobs and "receipt" in jobs[0]["checkpoint"]:
                job = jobs[0]
                break
            time.sleep(0.5)
        assert job is not None, "no receipt in time:\n" + "\n".join((h / "daemon.log").read_text()[-2000:] for h in (cheap, dear))
        assert job["state"] == "completed" and job["exit_code"] == 0 and job["machine"] == cheap_machine
        receipt = job["checkpoint"]["receipt"]
        assert receipt["body"]["outcome"] == "completed" and receipt["outputs"][0]["path"] == "result.txt"
        assert "training done, loss 0.042" in job["log_tail"], "the buyer sees the end of the job's output"
        trade = httpx.get(f"{server}/api/v1/trades/{job['trade']}/", headers=buyer).json()
        assert trade["price"] <= 3_000_000
        assert (cheap / "jobs" / str(job["trade"]) / "work" / "outputs" / "result.txt").read_text() == "42"
    finally:
        stop_daemons(daemons)


# --- on the market's dev chain -------------------------------------------------------------
def start_daemon(home: Path, seconds: int = 150) -> tuple[subprocess.Popen[bytes], Any]:
    log = open(home / "daemon.log", "w")  # noqa: SIM115 - closed by stop_daemons
    proc = subprocess.Popen([sys.executable, "-m", "providers.agent", "run", "--poll-seconds", "0.5", "--heartbeat-seconds", "1", "--max-seconds", str(seconds)],
                            cwd=ROOT, env=agent_env(home), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log


def agent_funding(rpc: Any, chain: dict[str, Any]) -> Any:
    """`join_market`'s `fund`: gas and 150 test tokens for the agent's own address, from its keystore."""
    def funds(home: Path) -> None:
        fund(rpc, chain, json.loads((home / "keys" / "eth-keystore.json").read_text())["address"], 150 * TOKENS)

    return funds


def stop_daemons(daemons: list[tuple[subprocess.Popen[bytes], Any]]) -> None:
    for proc, log in daemons:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.mark.timeout(240)
def test_two_agents_stake_on_chain_run_a_job_cosign_its_settlement_and_withdraw_the_earnings(server, tmp_path):
    rpc, chain = chain_rpc(server)
    tokens = make_tokens(SERVER_ENV, north=("provider", ("read", "provide")), south=("provider", ("read", "provide")))

    funds = agent_funding(rpc, chain)

    # L40S machines, so no bid of the other tests (H100) can land here
    l40s = ("NVIDIA L40S", 46068, "L40S-48GB")
    north, north_machine = join_market(server, tmp_path, "north", tokens["north"], region="eu-west", price="1.50", gpu=l40s, states="recorded", chain=True, fund=funds)
    south, _ = join_market(server, tmp_path, "south", tokens["south"], region="us-east", price="2.50", gpu=l40s, states="recorded", chain=True, fund=funds)
    again = agent(north, "register")
    assert again.returncode == 0 and "Already registered on chain 31337" in flat(again.stdout) and "nothing to do" in again.stdout, again.stderr + again.stdout
    provider = {"Authorization": f"Bearer {tokens['north']}"}
    address = httpx.get(f"{server}/api/v1/providers/me/", headers=provider).json()["chain_address"]
    assert token_balance(rpc, chain, address) == 50 * TOKENS  # 100 staked

    buyer = funded_buyer(server, SERVER_ENV, "chainbuyer", 20 * TOKENS)
    daemons = [start_daemon(home) for home in (north, south)]
    server_log = Path(SERVER_ENV["GRIDBID_DATA_DIR"]) / "server.log"
    logs = lambda: "\n".join((h / "daemon.log").read_text()[-3000:] for h in (north, south)) + "\n" + server_log.read_text()[-3000:]  # noqa: E731
    try:
        spec = {"command": [sys.executable, "-c", "import os, time; time.sleep(2); open(os.environ['GRIDBID_OUTPUT_DIR'] + '/result.txt', 'w').write('42')"]}
        r = httpx.post(f"{server}/api/v1/bids/", headers=buyer, json={"job_spec": spec, "gpus": 1, "gpu_models": ["L40S-48GB"], "max_price": 3_000_000, "duration_s": 60})
        assert r.status_code == 201, r.text

        def settled() -> Any:
            jobs = httpx.get(f"{server}/api/v1/jobs/", headers=buyer).json()["results"]
            if not jobs:
                return None
            trade = httpx.get(f"{server}/api/v1/trades/{jobs[0]['trade']}/", headers=buyer).json()
            return (jobs[0], trade) if trade["state"] == "settled" else None

        job, trade = wait_for("the trade settled on chain", settled, seconds=150, logs=logs)
        assert job["state"] == "completed" and job["machine"] == north_machine and job["exit_code"] == 0
        proof = httpx.get(f"{server}/api/v1/ledger/trades/{trade['id']}/", headers=buyer).json()
        settlement = proof["settlement"]
        assert settlement["tx"]["tx_hash"] and settlement["verified"] and settlement["cosigned"] == settlement["cosigners"] == 1, proof

        earnings = wait_for("the payment in the provider's earnings", lambda: (e := httpx.get(f"{server}/api/v1/ledger/earnings/", headers=provider).json())["free"] > 0 and e, seconds=20)
        paid = earnings["free"]
        assert earnings["paid"] == paid and earnings["stake"] == 100 * TOKENS and earnings["address"] == address
        assert job["gpu_seconds"] >= 2 and paid == trade["price"] * job["gpu_seconds"] // 3600  # pro rata: the job ran ~2 s of its 60

        r = agent(north, "earnings")
        assert r.returncode == 0, r.stderr
        from providers.agent.chain import tokens as fmt

        assert f"paid {fmt(paid)} (settled {fmt(paid)}" in flat(r.stdout) and f"free to withdraw {fmt(paid)}" in flat(r.stdout), r.stdout

        r = agent(north, "withdraw", "--amount", "1000")
        assert r.returncode == 2 and "more than the free balance" in flat(r.stderr), r.stderr
        before = token_balance(rpc, chain, address)
        r = agent(north, "withdraw")
        assert r.returncode == 0, r.stderr + r.stdout
        assert f"Withdrew {fmt(paid)} tokens" in flat(r.stdout) and address in r.stdout
        assert token_balance(rpc, chain, address) == before + paid
        r = agent(north, "withdraw")
        assert r.returncode == 0 and "Nothing to withdraw" in r.stdout
        wait_for("the withdrawal in the journal", lambda: httpx.get(f"{server}/api/v1/ledger/earnings/", headers=provider).json()["free"] == 0, seconds=20)
    finally:
        stop_daemons(daemons)


CHECKPOINTING_JOB = """
import json, os, signal, sys, time
out, ckpt = os.environ["GRIDBID_OUTPUT_DIR"], os.environ["GRIDBID_CHECKPOINT_DIR"]
step = 0
resume = os.environ.get("GRIDBID_RESUME_FROM")
if resume and os.path.exists(os.path.join(resume, "state.json")):
    with open(os.path.join(resume, "state.json")) as f:
        step = json.load(f)["step"]
    with open(os.path.join(out, "resumed_at_step.txt"), "w") as f:
        f.write(str(step))
def stop(*_):
    with open(os.path.join(ckpt, "state.json"), "w") as f:
        json.dump({"step": step}, f)
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
while step < 600:
    step += 1
    with open(os.path.join(out, "progress.txt"), "w") as f:
        f.write(str(step))
    time.sleep(0.1)
"""


@pytest.fixture
def store(tmp_path: Path) -> Iterator[tuple[str, Path]]:
    """A plain HTTP object store on 127.0.0.1: PUT writes a file, GET reads it back."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    root = tmp_path / "store"
    root.mkdir()

    class Handler(BaseHTTPRequestHandler):
        def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
            target = root / self.path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(201)
            self.end_headers()

        def do_GET(self) -> None:  # noqa: N802
            target = root / self.path.lstrip("/")
            if not target.is_file():
                self.send_response(404)
                self.end_headers()
                return
            data = target.read_bytes()
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/jobs", root / "jobs"
    finally:
        httpd.shutdown()


@pytest.mark.timeout(200)
def test_an_operator_preempts_a_running_job_which_checkpoints_and_resumes_on_another_machine(server, tmp_path, store):
    import hashlib
    import tarfile

    tokens = make_tokens(SERVER_ENV, spotty=("provider", ("read", "provide")), spotbuyer=("buyer", ("read", "trade")), watch=("operator", ("read", "operate")))
    # A10 machines, so no other test's bid lands here; the provider is not on chain, so the trade runs pending
    home, machine = join_market(server, tmp_path, "spotty", tokens["spotty"], region="eu-west", price="1.00", gpu=("NVIDIA A10", 23028, "A10-24GB"))
    # this agent's offer is withdrawn before the preemption (below), so the GPUs it frees
    # cannot take the rest of the job back; its pricing loop must not publish it again meanwhile
    import tomllib

    import tomli_w

    config = tomllib.loads((home / "agent.toml").read_text())
    (home / "agent.toml").write_text(tomli_w.dumps({**config, "offer_sync_s": 3600.0}))
    buyer = {"Authorization": f"Bearer {tokens['spotbuyer']}"}
    operator = {"Authorization": f"Bearer {tokens['watch']}"}
    escrow_deposit(server, SERVER_ENV, "spotbuyer", buyer, 2 * TOKENS)
    daemons = [start_daemon(home, seconds=90)]
    logs = lambda: (home / "daemon.log").read_text()[-3000:]  # noqa: E731
    try:
        store_url, store_root = store
        spec = {"command": [sys.executable, "-c", CHECKPOINTING_JOB], "upload_url": store_url}
        r = httpx.post(f"{server}/api/v1/bids/", headers=buyer, json={"job_spec": spec, "gpus": 2, "gpu_models": ["A10-24GB"], "max_price": 2_000_000, "duration_s": 600, "klass": "spot"})
        assert r.status_code == 201, r.text

        def running() -> Any:
            jobs = httpx.get(f"{server}/api/v1/jobs/", headers=buyer).json()["results"]
            return jobs[0] if jobs and jobs[0]["state"] == "running" else None

        job = wait_for("the job running", running, seconds=40, logs=logs)
        assert job["machine"] == machine
        work = home / "jobs" / str(job["trade"]) / "work"
        wait_for("the job making progress", lambda: (work / "outputs" / "progress.txt").exists(), seconds=15, logs=logs)
        time.sleep(1.5)
        # this machine is leaving: its offer is withdrawn first (see above)
        provider = {"Authorization": f"Bearer {tokens['spotty']}"}
        for offer in httpx.get(f"{server}/api/v1/offers/", headers=provider, params={"machine": machine}).json()["results"]:
            if offer["machine"] == machine and offer["state"] in ("open", "paused"):
                assert httpx.post(f"{server}/api/v1/offers/{offer['id']}/withdraw/", headers=provider).status_code == 200
        assert httpx.post(f"{server}/api/v1/jobs/{job['id']}/preempt/", headers=buyer).status_code == 403  # operators only
        r = httpx.post(f"{server}/api/v1/jobs/{job['id']}/preempt/", headers=operator)
        assert r.status_code == 200, r.text

        def preempted() -> Any:
            j = httpx.get(f"{server}/api/v1/jobs/{job['id']}/", headers=buyer).json()
            return j if j["state"] == "preempted" and "receipt" in j["checkpoint"] else None

        done = wait_for("the job checkpointed and preempted", preempted, seconds=30, logs=logs)
        checkpoint = done["checkpoint"]["latest_checkpoint"]
        # uploaded to the job's store, so any machine can resume from it, not only this one
        assert checkpoint["url"] == f"{store_url}/trade-{job['trade']}/checkpoint.tar"
        tar = store_root / f"trade-{job['trade']}" / "checkpoint.tar"
        assert hashlib.sha256(tar.read_bytes()).hexdigest() == checkpoint["sha256"].removeprefix("0x") and tar.stat().st_size == checkpoint["size"]
        with tarfile.open(tar) as packed:
            state = json.load(packed.extractfile(next(m for m in packed.getmembers() if m.name.endswith("state.json"))))  # type: ignore[arg-type]
        assert state["step"] > 10  # the job's own state at the moment it was stopped
        receipt = done["checkpoint"]["receipt"]["body"]
        assert receipt["outcome"] == "preempted" and receipt["checkpoint"]
        assert 2 * 2 <= done["gpu_seconds"] <= 2 * 40  # 2 GPUs for the seconds it ran, not the 600 booked
        outputs = done["checkpoint"]["outputs_archive"]
        packed = store_root / f"trade-{job['trade']}" / "outputs.tar"
        assert outputs["url"].endswith("/outputs.tar") and hashlib.sha256(packed.read_bytes()).hexdigest() == outputs["sha256"]
        with tarfile.open(packed) as tar_out:
            assert "progress.txt" in tar_out.getnames()

        # the rest of the job goes back to the market and resumes from its checkpoint elsewhere:
        # this machine leaves (daemon stopped, offer withdrawn), another A10 machine joins
        follow_id = done["checkpoint"]["continued_by_bid"]
        follow = httpx.get(f"{server}/api/v1/bids/{follow_id}/", headers=buyer).json()
        assert follow["resume_from"]["trade"] == job["trade"] and follow["duration_s"] == 600 - -(-done["gpu_seconds"] // 2)
        stop_daemons(daemons)
        daemons = []
        other_tokens = make_tokens(SERVER_ENV, spotty2=("provider", ("read", "provide")))
        home2, machine2 = join_market(server, tmp_path, "spotty2", other_tokens["spotty2"], region="eu-west", price="1.00", gpu=("NVIDIA A10", 23028, "A10-24GB"))
        daemons.append(start_daemon(home2, seconds=90))
        logs2 = lambda: (home2 / "daemon.log").read_text()[-3000:]  # noqa: E731

        def resumed() -> Any:
            jobs = httpx.get(f"{server}/api/v1/jobs/", headers=buyer).json()["results"]
            return next((j for j in jobs if j["machine"] == machine2 and j["state"] in ("running", "completed")), None)

        follow_now = lambda: httpx.get(f"{server}/api/v1/bids/{follow_id}/", headers=buyer).json()  # noqa: E731
        again = wait_for("the rest of the job running on the other machine", resumed, seconds=90, logs=lambda: f"{logs2()}\ncontinuation: {follow_now()}")
        marker = home2 / "jobs" / str(again["trade"]) / "work" / "outputs" / "resumed_at_step.txt"
        wait_for("the job resuming from its checkpoint", marker.exists, seconds=20, logs=logs2)
        assert int(marker.read_text()) == state["step"], "it carried on from the step it was stopped at"
    finally:
        stop_daemons(daemons)


def test_a_jobs_output_file_is_uploaded_by_its_agent_and_downloaded_by_its_buyer_alone(server, tmp_path):
    import hashlib

    tokens = make_tokens(SERVER_ENV, lab=("provider", ("read", "provide")), owner=("buyer", ("read", "trade")), nosy=("buyer", ("read", "trade")))
    # L4 machines, so no bid of the other tests can land here
    home, _ = join_market(server, tmp_path, "lab", tokens["lab"], region="us-west", price="0.50", gpu=("NVIDIA L4", 23034, "L4-24GB"))
    daemon = start_daemon(home, seconds=90)
    server_log = Path(SERVER_ENV["GRIDBID_DATA_DIR"]) / "server.log"
    logs = lambda: (home / "daemon.log").read_text()[-3000:] + "\n" + server_log.read_text()[-3000:]  # noqa: E731
    try:
        buyer = {"Authorization": f"Bearer {tokens['owner']}"}
        escrow_deposit(server, SERVER_ENV, "owner", buyer, 1 * TOKENS)
        # 3 MiB: over the 2.5 MiB any other request body may be
        spec = {"command": [sys.executable, "-c", "import os, random; random.seed(7); "
                            "open(os.environ['GRIDBID_OUTPUT_DIR'] + '/model.bin', 'wb').write(random.randbytes(3 * 1024 * 1024))"]}
        r = httpx.post(f"{server}/api/v1/bids/", headers=buyer, json={"job_spec": spec, "gpus": 1, "gpu_models": ["L4-24GB"], "max_price": 1_000_000, "duration_s": 60})
        assert r.status_code == 201, r.text

        def uploaded() -> Any:
            jobs = httpx.get(f"{server}/api/v1/jobs/", headers=buyer).json()["results"]
            if not jobs:
                return None
            listed = httpx.get(f"{server}/api/v1/jobs/{jobs[0]['id']}/outputs/", headers=buyer).json()
            return (jobs[0], listed) if listed["files"] else None

        job, listed = wait_for("the agent uploads the job's output", uploaded, seconds=60, logs=logs)
        receipt = httpx.get(f"{server}/api/v1/jobs/{job['id']}/", headers=buyer).json()["checkpoint"]["receipt"]
        (signed,) = receipt["outputs"]
        (kept,) = listed["files"]
        assert kept["path"] == signed["path"] == "model.bin" and kept["size"] == 3 * 1024 * 1024 and listed["waiting"] == []
        got = httpx.get(f"{server}{kept['download_url']}", headers=buyer, timeout=30)
        assert got.status_code == 200, got.text
        assert hashlib.sha256(got.content).hexdigest() == signed["sha256"] == kept["sha256"], "the buyer gets the bytes the provider signed for"
        assert got.headers["content-type"] == "application/octet-stream" and got.headers["content-disposition"] == 'attachment; filename="model.bin"'
        nosy = httpx.get(f"{server}{kept['download_url']}", headers={"Authorization": f"Bearer {tokens['nosy']}"})
        assert nosy.status_code == 404
        # the market lists the file once the upload's PUT is stored; the agent logs it once the
        # answer reaches it, a moment later (a clean-clone run read the log in between)
        wait_for("the agent logging the upload", lambda: "output model.bin uploaded" in (home / "daemon.log").read_text(), seconds=30, logs=logs)
    finally:
        stop_daemons([daemon])


@pytest.mark.timeout(300)
def test_a_round_preempts_a_spot_job_for_an_on_demand_bid_it_resumes_on_another_agent_and_both_settle_pro_rata(server, tmp_path):
    # issue 31: the round itself preempts. A spot job fills agent A's two GPUs; an on-demand
    # bid that only A can serve arrives; the round tells A's agent to stop the spot job, which
    # checkpoints; the rest of it resumes on agent B from that checkpoint; the on-demand job
    # runs on A; the preempted trade and its continuation settle on chain for what they ran.
    # The job names no store of its own: the checkpoint goes to the market, as an output
    import hashlib
    import tarfile

    rpc, chain = chain_rpc(server)
    tokens = make_tokens(SERVER_ENV, tidea=("provider", ("read", "provide")), tideb=("provider", ("read", "provide")))

    funds = agent_funding(rpc, chain)

    l4 = ("NVIDIA L4", 23034, "L4-24GB")  # no other test bids for L4s
    home_a, machine_a = join_market(server, tmp_path, "tidea", tokens["tidea"], region="eu-west", price="1.00", gpu=l4, states="recorded", chain=True, fund=funds)
    home_b, machine_b = join_market(server, tmp_path, "tideb", tokens["tideb"], region="us-east", price="1.50", gpu=l4, states="recorded", chain=True, fund=funds)
    spotter = funded_buyer(server, SERVER_ENV, "spotter", 20 * TOKENS)
    urgent = funded_buyer(server, SERVER_ENV, "urgent", 20 * TOKENS)
    daemons = [start_daemon(home, seconds=280) for home in (home_a, home_b)]
    server_log = Path(SERVER_ENV["GRIDBID_DATA_DIR"]) / "server.log"
    logs = lambda: "\n".join((h / "daemon.log").read_text()[-2500:] for h in (home_a, home_b)) + "\n" + server_log.read_text()[-2500:]  # noqa: E731
    try:
        job_code = CHECKPOINTING_JOB.replace("while step < 600", "while step < 250")  # 25 s of work
        spec = {"command": [sys.executable, "-c", job_code]}
        r = httpx.post(f"{server}/api/v1/bids/", headers=spotter, json={"job_spec": spec, "gpus": 2, "gpu_models": ["L4-24GB"], "max_price": 2_000_000,
                                                                        "duration_s": 600, "klass": "spot", "preempt_grace_s": 20})
        assert r.status_code == 201, r.text

        def spot_jobs() -> list[dict[str, Any]]:
            return sorted(httpx.get(f"{server}/api/v1/jobs/", headers=spotter).json()["results"], key=lambda j: j["id"])

        first = wait_for("the spot job running on A", lambda: next((j for j in spot_jobs() if j["state"] == "running"), None), seconds=60, logs=logs,
                         seen=lambda: buyer_view(server, spotter))
        assert first["machine"] == machine_a, "the cheaper machine"
        work = home_a / "jobs" / str(first["trade"]) / "work"
        wait_for("the spot job making progress", lambda: (work / "outputs" / "progress.txt").exists(), seconds=15, logs=logs)
        time.sleep(1.5)

        quick = {"command": [sys.executable, "-c", "import os, time; time.sleep(2); open(os.environ['GRIDBID_OUTPUT_DIR'] + '/done.txt', 'w').write('ok')"]}
        r = httpx.post(f"{server}/api/v1/bids/", headers=urgent, json={"job_spec": quick, "gpus": 2, "gpu_models": ["L4-24GB"], "max_price": 3_000_000,
                                                                       "duration_s": 120, "klass": "on_demand", "allowed_regions": ["eu-west"]})
        assert r.status_code == 201, r.text
        waiting = r.json()

        def preempted() -> Any:
            j = httpx.get(f"{server}/api/v1/jobs/{first['id']}/", headers=spotter).json()
            return j if j["state"] == "preempted" and "receipt" in j["checkpoint"] else None

        done = wait_for("the round preempting the spot job, which checkpoints", preempted, seconds=60, logs=logs)
        meta = done["checkpoint"]
        assert meta["preempted_for_bid"] == waiting["id"] and "preempted by round" in meta["preempt_reason"], meta
        told = done["preemption"]
        assert told["grace_s"] == 20 and told["for_bid"] == waiting["id"], told
        # it wrote its checkpoint on the signal: about nothing is done again where it resumes
        assert 0 <= told["lost_gpu_seconds"] <= 2 * 2 and told["lost_gpu_seconds"] < done["gpu_seconds"], (told, done["gpu_seconds"])
        checkpoint = meta["latest_checkpoint"]
        assert checkpoint["url"] == f"market:/api/v1/jobs/{first['id']}/outputs/.gridbid-checkpoint.tar", checkpoint
        assert meta["receipt"]["body"]["checkpoint"] == checkpoint, "the receipt signs where it is kept"
        # uploaded by A's agent, kept by the market for the buyer (and for B's agent)
        url = f"{server}/api/v1/jobs/{first['id']}/outputs/.gridbid-checkpoint.tar"
        got = wait_for("the checkpoint at the market", lambda: (r := httpx.get(url, headers=spotter)).status_code == 200 and r.content, seconds=30, logs=logs)
        assert hashlib.sha256(got).hexdigest() == checkpoint["sha256"].removeprefix("0x")
        tar = tmp_path / "checkpoint.tar"
        tar.write_bytes(got)
        assert httpx.get(url, headers={"Authorization": f"Bearer {tokens['tidea']}"}).status_code == 404, "not for a provider that resumes nothing of it"
        with tarfile.open(tar) as packed:
            state = json.load(packed.extractfile(next(m for m in packed.getmembers() if m.name.endswith("state.json"))))  # type: ignore[arg-type]
        assert state["step"] > 10

        # the on-demand job takes A's GPUs; the rest of the spot job resumes on B
        def urgent_ran() -> Any:
            jobs = httpx.get(f"{server}/api/v1/jobs/", headers=urgent).json()["results"]
            return jobs[0] if jobs and jobs[0]["state"] in ("running", "completed") else None

        assert wait_for("the on-demand job on A", urgent_ran, seconds=60, logs=logs)["machine"] == machine_a
        again = wait_for("the rest of the spot job on B", lambda: next((j for j in spot_jobs() if j["machine"] == machine_b and j["state"] in ("running", "completed")), None),
                         seconds=60, logs=logs)
        marker = home_b / "jobs" / str(again["trade"]) / "work" / "outputs" / "resumed_at_step.txt"
        wait_for("the job resuming from its checkpoint", marker.exists, seconds=30, logs=logs)
        assert int(marker.read_text()) == state["step"], "it carried on from the step it was stopped at, not from the start"

        # both parts of the spot job settle on chain for the GPU-seconds their receipts count
        def settled(trade_id: int) -> Any:
            t = httpx.get(f"{server}/api/v1/trades/{trade_id}/", headers=spotter).json()
            return t if t["state"] == "settled" else None

        for trade_id in (first["trade"], again["trade"]):
            trade = wait_for(f"trade {trade_id} settled", lambda t=trade_id: settled(t), seconds=150, logs=logs)
            settlement = httpx.get(f"{server}/api/v1/ledger/trades/{trade_id}/", headers=spotter).json()["settlement"]
            assert settlement["paid"] == trade["price"] * settlement["gpu_seconds"] // 3600 and settlement["paid"] > 0, (trade, settlement)
            assert settlement["paid"] + settlement["refund"] == trade["amount"], settlement
    finally:
        stop_daemons(daemons)


def test_an_agent_lends_its_gpus_takes_them_back_and_lends_them_again(server, tmp_path):
    # issue 31, tides: `price set --lend` publishes a lent offer (spot bids only);
    # `reclaim` takes it back (paused: no round sells it), `reclaim --release` lends it again
    tokens = make_tokens(SERVER_ENV, lender=("provider", ("read", "provide")))
    home, machine = join_market(server, tmp_path, "lender", tokens["lender"], region="us-west", price="1.00", gpu=("NVIDIA L4", 23034, "L4-24GB"))
    r = agent(home, "price", "set", "L4-24GB", "--fixed", "0.80", "--lend", "--no-spot")
    assert r.returncode == 2 and "must allow spot" in flat(r.stderr), r.stderr
    r = agent(home, "price", "set", "L4-24GB", "--fixed", "0.80", "--lend")
    assert r.returncode == 0, r.stderr + r.stdout
    auth = {"Authorization": f"Bearer {tokens['lender']}"}

    def offer() -> dict[str, Any]:
        (o,) = [o for o in httpx.get(f"{server}/api/v1/offers/", headers=auth, params={"machine": machine}).json()["results"] if o["state"] != "withdrawn"]
        return o

    assert (offer()["reclaimable"], offer()["price"], offer()["state"]) == (True, 800_000, "open")
    r = agent(home, "reclaim")
    assert r.returncode == 0 and "taken back: no spot job was on it" in flat(r.stdout), r.stderr + r.stdout
    assert (offer()["state"], offer()["paused_by"]) == ("paused", "reclaimed")
    r = agent(home, "reclaim", "--release")
    assert r.returncode == 0 and "is lent again" in flat(r.stdout), r.stderr + r.stdout
    assert offer()["state"] == "open"
    r = agent(home, "reclaim", "H100-SXM-80GB")
    assert r.returncode == 2 and "No lent H100-SXM-80GB offer" in flat(r.stderr), r.stderr
    # a daily reclaim schedule: checked by the agent, kept by the market in its canonical form
    r = agent(home, "price", "set", "L4-24GB", "--fixed", "0.80", "--lend", "--reclaim-hours", "8-25")
    assert r.returncode == 2 and "a range ends at 1-24" in flat(r.stderr), r.stderr
    r = agent(home, "price", "set", "L4-24GB", "--fixed", "0.80", "--reclaim-hours", "8-20")
    assert r.returncode == 2 and "only lent GPUs (--lend) have reclaim hours" in flat(r.stderr), r.stderr
    h = (datetime.now(UTC).hour + 2) % 24  # two hours this test does not reach: the market keeps it open
    r = agent(home, "price", "set", "L4-24GB", "--fixed", "0.80", "--lend", "--reclaim-hours", f"{h},{(h + 1) % 24}")
    assert r.returncode == 0, r.stderr + r.stdout
    written = f"{h:02d}-{h + 2:02d}" if h + 2 <= 24 else f"{h:02d}-{h + 2 - 24:02d}"  # one range, past midnight too
    assert offer()["reclaim_hours"] == written and offer()["state"] == "open"
    r = agent(home, "price", "show")
    assert f"taken back {written} UTC" in flat(r.stdout), r.stdout
    # --release leaves an offer its provider paused by hand alone
    assert httpx.patch(f"{server}/api/v1/offers/{offer()['id']}/", headers=auth, json={"state": "paused"}).status_code == 200
    r = agent(home, "reclaim", "--release")
    assert r.returncode == 0 and "was not taken back" in flat(r.stdout) and offer()["state"] == "paused", r.stdout
    assert httpx.patch(f"{server}/api/v1/offers/{offer()['id']}/", headers=auth, json={"state": "open"}).status_code == 200

    # "when my inference queue exceeds N": the running daemon reads the queue (a file here,
    # through a real command) and takes the GPUs back when it runs deep, lends them when quiet
    queue = tmp_path / "queue_depth"
    queue.write_text("3\n")
    command = f"cat {queue}"
    r = agent(home, "price", "set", "L4-24GB", "--fixed", "0.80", "--lend", "--reclaim-above", "50")
    assert r.returncode == 2 and "need --reclaim-queue CMD" in flat(r.stderr), r.stderr
    r = agent(home, "price", "set", "L4-24GB", "--fixed", "0.80", "--lend", "--reclaim-queue", command, "--reclaim-above", "50",
              "--release-after", "2")
    assert r.returncode == 0, r.stderr + r.stdout
    assert "taken back queue > 50 (again <= 25 for 2 s)" in flat(agent(home, "price", "show").stdout)
    daemon = start_daemon(home, seconds=60)
    try:
        time.sleep(3)
        assert offer()["state"] == "open", "a shallow queue leaves it lent"
        queue.write_text("57\n")
        wait_for("the deep queue to take the GPUs back", lambda: offer()["paused_by"] == "reclaimed", seconds=20,
                 logs=lambda: (home / "daemon.log").read_text(), seen=offer)
        queue.write_text("40\n")
        time.sleep(4)
        assert offer()["state"] == "paused", "between the marks: still taken back"
        queue.write_text("0\n")
        wait_for("the quiet queue to lend them again", lambda: offer()["state"] == "open", seconds=20,
                 logs=lambda: (home / "daemon.log").read_text(), seen=offer)
        log_text = (home / "daemon.log").read_text()
        assert "queue 57 > 50" in log_text and "lent again" in log_text, log_text
    finally:
        stop_daemons([daemon])

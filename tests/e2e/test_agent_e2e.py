"""A real `gridbid up` server (SQLite, in-process Celery clearing rounds every 2 s) and real
`gridbid-agent` subprocesses on declared inventories: init, detect, register, price set, heartbeats;
then a buyer's bid is matched by a round and run by the winning agent, whose signed receipt the
market verifies and the buyer sees."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.agents import (
    ROOT,
    SERVER_ENV,
    agent,
    agent_env,
    flat,
    join_market,
    market_server,
    start_daemon,
    stop_daemons,
)
from tests.e2e.funds import (
    TOKENS,
    chain_rpc,
    escrow_deposit,
    fund,
    funded_buyer,
    make_tokens,
    token_balance,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield from market_server(tmp_path_factory)


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

    def funds(home: Path) -> None:
        fund(rpc, chain, json.loads((home / "keys" / "eth-keystore.json").read_text())["address"], 150 * TOKENS)

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


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
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.e2e.conftest import running_server

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
SERVER_ENV: dict[str, str] = {}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(tmp_path_factory.mktemp("market"), demo=False) as (base, env):
        SERVER_ENV.clear()
        SERVER_ENV.update(env)
        yield base


def make_tokens(**users: tuple[str, tuple[str, ...]]) -> dict[str, str]:
    """Create accounts and their tokens on the server's database in one go: {name: (role, scopes)}."""
    code = "from market import services\n" + "".join(
        f"u = services.user_signup(username={name!r}, password='correct-horse-battery-staple', role={role!r})\n"
        f"print({name!r}, services.token_create(user=u, name='e2e', scopes={list(scopes)!r})[1])\n"
        for name, (role, scopes) in users.items()
    )
    out = subprocess.run([sys.executable, "-m", "gridbid.cli", "manage", "shell", "-c", code], cwd=ROOT, env=SERVER_ENV, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return dict(line.split() for line in out.stdout.splitlines() if line.split()[:1] and line.split()[0] in users)


def agent_env(home: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GRIDBID_AGENT_HOME": str(home), "PYTHONPATH": str(ROOT), "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}


def agent(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "providers.agent", *args], cwd=ROOT, env=agent_env(home), capture_output=True, text=True, timeout=timeout)


def join_market(server: str, tmp_path: Path, name: str, token: str, *, region: str, price: str) -> tuple[Path, int]:
    """A provider with a 2 x H100 machine, registered and priced; returns (agent home, machine id)."""
    inventory = tmp_path / f"{name}.json"
    inventory.write_text(json.dumps({"host": name, "gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559} for i in range(2)]}))
    home = tmp_path / name
    for args in (
        ("init", "--market", server, "--token", token, "--machine-name", name, "--region", region, "--inventory", str(inventory), "--kdf-iterations", "2", "--accept-trade-states", "pending,recorded", "--runtime", "process"),
        ("register",),
        ("price", "set", "H100-SXM-80GB", "--fixed", price),
    ):
        r = agent(home, *args)
        assert r.returncode == 0, f"{args[0]}: {r.stderr}{r.stdout}"
        if args[0] == "register":
            machine_id = int(r.stdout.split("as #")[1].split()[0])
    return home, machine_id


def test_an_agent_joins_the_market_and_its_offers_appear(server, tmp_path):
    token = make_tokens(rackowner=("provider", ("read", "provide")))["rackowner"]
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"host": "rack1", "driver_version": "550.54.15", "cuda_version": "12.4", "gpus": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "memory_mib": 81559} for i in range(4)]}))
    home = tmp_path / "agent"

    r = agent(home, "init", "--market", server, "--token", token, "--machine-name", "rack1", "--region", "eu-west", "--inventory", str(inventory), "--kdf-iterations", "2")
    assert r.returncode == 0, r.stderr + r.stdout
    assert "token valid" in r.stdout
    assert oct((home / "keys" / "bls.json").stat().st_mode)[-3:] == "600"

    r = agent(home, "detect")
    assert r.returncode == 0, r.stderr
    assert "H100-SXM-80GB" in r.stdout and "catalogue model H100-SXM-80GB" in r.stdout

    r = agent(home, "register")
    assert r.returncode == 0, r.stderr + r.stdout
    machine_id = int(r.stdout.split("as #")[1].split()[0])

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
    machine = httpx.get(f"{server}/api/v1/machines/{machine_id}/", headers=auth).json()
    assert machine["state"] == "online" and machine["last_heartbeat"]


def test_a_bad_token_stops_the_agent_with_one_clear_message(server, tmp_path):
    r = agent(tmp_path / "a", "init", "--market", server, "--token", "gb_deadbeef_nope", "--kdf-iterations", "2")
    assert r.returncode != 0
    assert "Unknown token" in r.stderr and "Traceback" not in r.stderr


def test_a_matched_bid_runs_on_the_winning_agent_and_the_buyer_sees_the_receipt(server, tmp_path):
    tokens = make_tokens(cheap=("provider", ("read", "provide")), dear=("provider", ("read", "provide")), trainer=("buyer", ("read", "trade")))
    cheap, cheap_machine = join_market(server, tmp_path, "cheap", tokens["cheap"], region="eu-west", price="1.50")
    dear, _ = join_market(server, tmp_path, "dear", tokens["dear"], region="us-east", price="2.50")
    daemons = []
    for home in (cheap, dear):
        log = open(home / "daemon.log", "w")  # noqa: SIM115 - closed below
        daemons.append((subprocess.Popen([sys.executable, "-m", "providers.agent", "run", "--poll-seconds", "0.5", "--heartbeat-seconds", "1", "--max-seconds", "50"], cwd=ROOT, env=agent_env(home), stdout=log, stderr=subprocess.STDOUT, start_new_session=True), log))
    try:
        buyer = {"Authorization": f"Bearer {tokens['trainer']}"}
        spec = {"command": [sys.executable, "-c", "import os; open(os.environ['GRIDBID_OUTPUT_DIR'] + '/result.txt', 'w').write('42')"]}
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

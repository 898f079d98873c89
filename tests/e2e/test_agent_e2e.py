"""A real `gridbid up` server and a real `gridbid-agent` in subprocesses, on a declared inventory:
init, detect, register, price set, then the daemon's heartbeats bring the machine online."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.slow, pytest.mark.timeout(120)]
SERVER_ENV: dict[str, str] = {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("market")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE")}
    env.update(GRIDBID_DATA_DIR=str(data), PYTHONUNBUFFERED="1")
    SERVER_ENV.clear()
    SERVER_ENV.update(env)
    log = open(data / "server.log", "w")  # noqa: SIM115 - closed in the finally below
    proc = subprocess.Popen([sys.executable, "-m", "gridbid.cli", "up", "--no-worker", "--port", str(port)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"server exited: {(data / 'server.log').read_text()}")
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        else:
            pytest.fail(f"server did not start: {(data / 'server.log').read_text()}")
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def provider_token(base: str, username: str) -> str:
    """Sign up over the API, then mint a token the way an operator would, on the server's database."""
    r = httpx.post(f"{base}/api/v1/accounts/signup/", json={"username": username, "password": "correct-horse-battery-staple", "role": "provider"})
    assert r.status_code == 201, r.text
    code = (
        "from market import services; from market.models import User; "
        f"print(services.token_create(user=User.objects.get(username={username!r}), name='agent', scopes=['read', 'provide'])[1])"
    )
    out = subprocess.run([sys.executable, "-m", "gridbid.cli", "manage", "shell", "-c", code], cwd=ROOT, env=SERVER_ENV, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


def agent(home: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GRIDBID_AGENT_HOME": str(home), "PYTHONPATH": str(ROOT), "COLUMNS": "200"}
    return subprocess.run([sys.executable, "-m", "providers.agent", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_an_agent_joins_the_market_and_its_offers_appear(server, tmp_path):
    token = provider_token(server, "rackowner")
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

"""Reaching a running job, end to end: a real `gridbid up` server and real `gridbid-agent`
processes. A buyer with real escrow on the dev chain adds an SSH key and bids for a job
that publishes ports.

- An agent that runs the process runtime says so with each heartbeat, and no round
  matches it the job: the bid waits, saying why, and its GPUs are never taken.
- On an agent with a working docker (or podman) the container runs with its ports
  published and the buyer reaches them at the job's access. That test needs a container
  engine that can run GPU containers and an image already present
  (GRIDBID_E2E_PORTS_IMAGE, default python:3.11-slim; nothing is pulled); it skips
  where there is none, saying which part is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from tests.e2e import test_agent_e2e as agents
from tests.e2e.funds import TOKENS, escrow_deposit, make_tokens, wait_for
from tests.e2e.test_agent_e2e import SERVER_ENV, agent, join_market, start_daemon, stop_daemons

server = agents.server  # the agent tests' server fixture (a module's own instance)
pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


def keygen(tmp_path: Path) -> tuple[Path, str]:
    if shutil.which("ssh-keygen") is None:
        pytest.skip("ssh-keygen is not installed")
    path = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "e2e@laptop", "-f", str(path)], check=True, timeout=60)
    return path, Path(f"{path}.pub").read_text().strip()


def buyer_with_key(server: str, tmp_path: Path, name: str) -> tuple[dict[str, str], Path]:
    """A buyer with escrow on the dev chain and an SSH key on its account (which needs the
    `tokens` scope, as API tokens do)."""
    token = make_tokens(SERVER_ENV, **{name: ("buyer", ("read", "trade", "tokens"))})[name]
    auth = {"Authorization": f"Bearer {token}"}
    escrow_deposit(server, SERVER_ENV, name, auth, 5 * TOKENS)
    private, public = keygen(tmp_path)
    r = httpx.post(f"{server}/api/v1/ssh-keys/", headers=auth, json={"name": "laptop", "public_key": public})
    assert r.status_code == 201 and r.json()["fingerprint"].startswith("SHA256:"), r.text
    return auth, private


def bid(server: str, auth: dict[str, str], spec: dict, region: str) -> httpx.Response:
    return httpx.post(f"{server}/api/v1/bids/", headers=auth, json={"job_spec": spec, "gpus": 1, "gpu_models": ["H100-SXM-80GB"], "allowed_regions": [region],
                                                                    "max_price": 3_000_000, "duration_s": 300})


def the_job(server: str, auth: dict[str, str], bid_id: int) -> dict | None:
    trades = httpx.get(f"{server}/api/v1/trades/", headers=auth, params={"bid": bid_id}).json()["results"]
    if not trades:
        return None
    jobs = [j for j in httpx.get(f"{server}/api/v1/jobs/", headers=auth).json()["results"] if j["trade"] == trades[0]["id"]]
    return jobs[0] if jobs else None


def test_a_process_runtime_agent_is_never_matched_a_job_with_ports_and_its_buyer_reads_why(server, tmp_path):
    # Its heartbeat says it runs jobs as processes (issue 32): no round matches it a job that
    # publishes ports or SSH, which waits in the book saying why. (Before, the agent took the
    # trade and refused it; that was also how this test passed whenever the first round
    # cleared before the first heartbeat. The agent still refuses one that reaches it:
    # tests/unit/agent/test_ports_runtime.py, tests/integration/test_ssh_ports.py.)
    tokens = make_tokens(SERVER_ENV, plainrack=("provider", ("read", "provide")))
    home, machine = join_market(server, tmp_path, "plainrack", tokens["plainrack"], region="eu-west", price="1.50")
    auth, _ = buyer_with_key(server, tmp_path, "porter")
    provider = {"Authorization": f"Bearer {tokens['plainrack']}"}

    r = bid(server, auth, {"command": ["python", "-m", "http.server", "8888"], "ports": [8888]}, "eu-west")
    assert r.status_code == 400 and "Ports need a container image" in r.text, r.text

    daemons = [start_daemon(home, seconds=120)]
    try:
        logs = lambda: (home / "daemon.log").read_text()[-3000:]  # noqa: E731
        host = wait_for("the agent's heartbeat saying what it runs", lambda: (m := httpx.get(f"{server}/api/v1/machines/{machine}/", headers=provider).json())["host"]["runtime"] and m,
                        seconds=30, logs=logs)
        assert (host["host"]["runtime"], host["runs_containers"], host["publishes_ports"]) == ("process", False, False), host
        r = bid(server, auth, {"image": "ghcr.io/acme/dev:1", "command": ["/usr/sbin/sshd", "-D", "-e"], "ssh": True, "ports": [8888]}, "eu-west")
        assert r.status_code == 201, r.text
        placed = r.json()

        def explained() -> object:
            b = httpx.get(f"{server}/api/v1/bids/{placed['id']}/", headers=auth).json()
            return b if "cannot publish ports" in " ".join((b.get("explanation") or {}).get("reasons") or []) else None

        waiting = wait_for("the bid unmatched, saying why", explained, seconds=60, logs=logs)
        assert waiting["state"] == "open" and the_job(server, auth, placed["id"]) is None, "never matched, so never refused"
        assert httpx.post(f"{server}/api/v1/bids/{placed['id']}/cancel/", headers=auth).status_code == 200
        offer = httpx.get(f"{server}/api/v1/offers/", params={"machine": machine}).json()["results"][0]
        assert offer["gpus_free"] == offer["gpus"] == 2, "its GPUs were never taken"
    finally:
        stop_daemons(daemons)


def container_engine() -> str:
    """docker or podman that answers and can run GPU containers, else skip saying why."""
    for name in ("docker", "podman"):
        binary = shutil.which(name)
        if binary is None:
            continue
        info = subprocess.run([binary, "info", "--format", "{{json .}}"], capture_output=True, text=True, timeout=30)
        if info.returncode != 0:
            continue
        if name == "docker" and "nvidia" not in info.stdout:
            pytest.skip("docker runs here but has no NVIDIA runtime, and the agent runs a job's container on its GPUs (--gpus)")
        return name
    pytest.skip("no container engine: neither docker nor podman is installed and answering (`docker info`), so no real container can run here")


@pytest.mark.timeout(300)
def test_a_container_agent_publishes_a_jobs_port_and_the_buyer_reaches_it(server, tmp_path):
    engine = container_engine()
    image = os.environ.get("GRIDBID_E2E_PORTS_IMAGE", "python:3.11-slim")
    if subprocess.run([engine, "image", "inspect", image], capture_output=True, timeout=30).returncode != 0:
        pytest.skip(f"the image {image} is not present here (set GRIDBID_E2E_PORTS_IMAGE to one that is; nothing is pulled)")
    tokens = make_tokens(SERVER_ENV, boxrack=("provider", ("read", "provide")))
    home, machine = join_market(server, tmp_path, "boxrack", tokens["boxrack"], region="us-east", price="1.50")
    inventory = tmp_path / "boxrack.json"
    r = agent(home, "init", "--market", server, "--token", tokens["boxrack"], "--machine-name", "boxrack", "--region", "us-east", "--inventory", str(inventory),
              "--kdf-iterations", "2", "--accept-trade-states", "pending,recorded", "--runtime", engine, "--public-host", "127.0.0.1", "--host-ports", "41000-41099")
    assert r.returncode == 0, r.stderr + r.stdout
    auth, _ = buyer_with_key(server, tmp_path, "boxer")
    daemons = [start_daemon(home, seconds=200)]
    try:
        r = bid(server, auth, {"image": image, "command": ["python", "-m", "http.server", "8888", "--directory", "/job"], "ports": [8888]}, "us-east")
        assert r.status_code == 201, r.text
        logs = lambda: (home / "daemon.log").read_text()[-3000:]  # noqa: E731
        job = wait_for("the job running with its access", lambda: (j := the_job(server, auth, r.json()["id"])) and j["access"] and j, seconds=120, logs=logs)
        ((port,),) = [[p["host"] for p in job["access"]["ports"] if p["container"] == 8888]]
        assert job["access"]["host"] == "127.0.0.1" and 41000 <= port <= 41099
        (home / "jobs" / str(job["trade"]) / "work" / "hello.txt").write_text("from the container")

        def reached() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/hello.txt", timeout=2).text == "from the container"
            except httpx.HTTPError:
                return False

        wait_for("the published port answering", reached, seconds=60, logs=logs)
        assert httpx.post(f"{server}/api/v1/jobs/{job['id']}/stop/", headers=auth).status_code == 200
        wait_for("the job stopped", lambda: the_job(server, auth, r.json()["id"])["state"] == "stopped", seconds=90, logs=logs)
    finally:
        stop_daemons(daemons)

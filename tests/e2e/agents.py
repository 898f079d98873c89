"""What the agent e2e modules share: a real `gridbid up` server per module, and real
`gridbid-agent` subprocesses on declared inventories."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import running_server

ROOT = Path(__file__).resolve().parents[2]
SERVER_ENV: dict[str, str] = {}


def market_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A module's server (SQLite, in-process Celery clearing rounds every 2 s); its
    environment (data dir, tokens' database) is in SERVER_ENV while it runs."""
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



def start_daemon(home: Path, seconds: int = 150) -> tuple[subprocess.Popen[bytes], Any]:
    log = open(home / "daemon.log", "w")  # noqa: SIM115 - closed by stop_daemons
    proc = subprocess.Popen([sys.executable, "-m", "providers.agent", "run", "--poll-seconds", "0.5", "--heartbeat-seconds", "1", "--max-seconds", str(seconds)],
                            cwd=ROOT, env=agent_env(home), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return proc, log


def stop_daemons(daemons: list[tuple[subprocess.Popen[bytes], Any]]) -> None:
    for proc, log in daemons:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


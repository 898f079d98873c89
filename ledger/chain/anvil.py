"""Start and stop the anvil dev chain (npm package ``@foundry-rs/anvil``, pinned in package.json).

The Prague hardfork is forced so the EIP-2537 BLS precompiles exist. With a
``state_file`` the chain's state is loaded at start and dumped at exit, so the
embedded dev chain survives a restart.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

__all__ = ["AnvilNotFound", "find_anvil", "start_anvil", "stop_anvil", "wait_for_rpc"]

REPO_ROOT = Path(__file__).resolve().parents[2]


class AnvilNotFound(RuntimeError):
    pass


def find_anvil(root: Path = REPO_ROOT) -> Path:
    """The anvil binary: ``$GRIDBID_ANVIL``, then node_modules, then PATH."""
    override = os.environ.get("GRIDBID_ANVIL")
    if override:
        return Path(override)
    modules = root / "node_modules"
    # the platform package ships the real binary; bin/anvil is a node shim around it
    for candidate in sorted(modules.glob("@foundry-rs/anvil-*/bin/anvil")):
        if os.access(candidate, os.X_OK):
            return candidate
    shim = modules / ".bin" / "anvil"
    if shim.exists():
        return shim
    on_path = shutil.which("anvil")
    if on_path:
        return Path(on_path)
    raise AnvilNotFound(
        "anvil not found: run `npm install` at the repository root "
        "(package.json pins @foundry-rs/anvil) or set GRIDBID_ANVIL"
    )


def wait_for_rpc(url: str, *, timeout: float = 30.0, proc: subprocess.Popen[bytes] | None = None) -> None:
    """Block until ``url`` answers ``eth_chainId``."""
    payload = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "eth_chainId", "params": []}).encode()
    deadline = time.monotonic() + timeout
    while True:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"anvil exited with code {proc.returncode} before answering")
        try:
            request = urllib.request.Request(url, payload, {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=2) as response:
                if "result" in json.loads(response.read()):
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"anvil did not answer on {url} within {timeout} s")
        time.sleep(0.1)


def start_anvil(
    *,
    port: int,
    state_file: Path | None = None,
    block_time: float | None = None,
    host: str = "127.0.0.1",
    chain_id: int | None = None,
    gas_limit: int | None = None,
    extra_args: list[str] | None = None,
    timeout: float = 30.0,
) -> subprocess.Popen[bytes]:
    """Start anvil with ``--hardfork prague`` and return once it answers JSON-RPC.

    Without ``block_time`` anvil mines a block per transaction.
    """
    args = [str(find_anvil()), "--hardfork", "prague", "--host", host, "--port", str(port), "--silent"]
    if state_file is not None:
        state_file = Path(state_file)
        state_file.parent.mkdir(parents=True, exist_ok=True)
        args += ["--state", str(state_file)]
    if block_time is not None:
        args += ["--block-time", str(block_time)]
    if chain_id is not None:
        args += ["--chain-id", str(chain_id)]
    if gas_limit is not None:
        args += ["--gas-limit", str(gas_limit)]
    args += extra_args or []
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        wait_for_rpc(f"http://{host}:{port}", timeout=timeout, proc=proc)
    except BaseException:
        stop_anvil(proc)
        raise
    return proc


def stop_anvil(proc: subprocess.Popen[bytes], *, timeout: float = 10.0) -> None:
    """Stop anvil gracefully (SIGTERM lets it dump ``--state``), then kill."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=timeout)

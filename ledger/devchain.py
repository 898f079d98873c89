"""The embedded dev chain of `gridbid up`: anvil with its state in the data directory,
the contracts deployed once (recorded in Deployment), demo accounts funded.

Used only when CHAIN_RPC_URL is unset. Without the anvil binary (`make run`
installs it from npm) the server runs without settlement and says so in one line.

A server killed with SIGKILL cannot stop its anvil, which lives on holding the port. So
the chain's pid is kept in ``chain.pid`` beside its state file, and a start first stops
an anvil serving this state file whose server is gone (SIGTERM: it dumps its state, which
the new chain loads). Anything else on the port is refused with DevChainError.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings
from eth_utils import to_checksum_address

from ledger.chain import ChainClient, signer_from_hex
from ledger.chain.anvil import (
    AnvilNotFound,
    AnvilPortTaken,
    anvil_state_file,
    find_anvil,
    port_free_wait,
    port_listener,
    process_cmdline,
    process_parent,
    start_anvil,
    stop_anvil,
    stop_pid,
)
from ledger.context import ANVIL_DEV_KEY, DEV_CHAIN_ID, chain_context_reset, operator_signer
from ledger.models import Deployment

log = logging.getLogger("gridbid.ledger.devchain")

# anvil's well-known dev accounts 1 and 2 (their keys are public): demo providers and wallet buyers
DEMO_KEYS = (
    "0x59c6995e998f97a5a0044966f0945389dc9e86dae88c7a8412f4603b6b78690d",
    "0x5de4111afa1a4b94908f83103eb1f1706367c2e68ca870fc3fb9a804cdab365a",
)
DEMO_ACCOUNTS = tuple(signer_from_hex(k).address for k in DEMO_KEYS)
DEMO_TOKENS = 100_000 * 10**6


class DevChainError(RuntimeError):
    """The dev chain cannot start: its port is held by another process, a chain left
    running would not stop, or anvil exited. The message says why and what to do."""


@dataclass
class DevChain:
    proc: subprocess.Popen[bytes]
    url: str
    deployment: Deployment
    pid_file: Path | None = None

    def stop(self) -> None:
        stop_anvil(self.proc)  # SIGTERM: anvil dumps its state file
        if self.pid_file is not None and _pid_file_read(self.pid_file) == self.proc.pid:
            self.pid_file.unlink(missing_ok=True)


def _pid_file_read(pid_file: Path) -> int | None:
    try:
        pid = json.loads(pid_file.read_text())["pid"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid if isinstance(pid, int) and pid > 0 else None


def _pid_file_write(pid_file: Path, *, pid: int, port: int, state_file: Path) -> None:
    part = pid_file.with_name(pid_file.name + ".part")
    part.write_text(json.dumps({"pid": pid, "server": os.getpid(), "port": port, "state_file": str(state_file.resolve())}))
    part.replace(pid_file)


def _server_of(pid: int) -> int | None:
    """The live `gridbid` process that runs anvil ``pid`` (its parent, or above it when the
    npm shim runs the binary); None for a chain whose server is gone."""
    for _ in range(3):
        parent = process_parent(pid)
        if parent is None or parent <= 1:
            return None
        args = process_cmdline(parent) or []
        if any(a == "gridbid.cli" or Path(a).name == "gridbid" for a in args):
            return parent
        pid = parent
    return None


def _leftover_stop(*, port: int, state_file: Path, pid_file: Path) -> None:
    """Stop an anvil an earlier server of this data directory left running: the one its pid
    file names, or the one on the port, when it serves this state file and its server is
    gone. Refuse (DevChainError) while another live server runs it."""
    ours = state_file.resolve()
    for pid in dict.fromkeys(p for p in (_pid_file_read(pid_file), port_listener(port)) if p is not None):
        if pid == os.getpid() or anvil_state_file(pid) != ours:
            continue  # a pid reused since, or not this data directory's chain
        server = _server_of(pid)
        if server is not None:
            raise DevChainError(f"the dev chain of {ours.parent} already runs (anvil pid {pid}, port {port}) under another "
                                f"`gridbid up` (pid {server}): stop that server first, or give this one its own GRIDBID_DATA_DIR")
        print(f"gridbid: stopping the dev chain an earlier server left running (anvil pid {pid}); its state is kept", flush=True)
        if not stop_pid(pid):
            raise DevChainError(f"the dev chain an earlier server left running (anvil pid {pid}) did not stop: "
                                f"end it (kill -9 {pid}) and start again")
        port_free_wait(port)  # what still holds it then is refused by start_anvil, named
    pid_file.unlink(missing_ok=True)


def devchain_start(*, port: int | None = None) -> DevChain | None:
    """Start anvil and make sure the contracts are there; None when there is no dev chain to run."""
    if settings.CONFIG.chain_rpc_url:
        return None
    try:
        find_anvil()
    except AnvilNotFound:
        print("gridbid: anvil is not installed (run `make run` or `npm install`): running without settlement")
        return None
    port = port or settings.CONFIG.chain_port
    state_file = settings.CONFIG.data_dir / "chain-state.json"
    pid_file = state_file.with_name("chain.pid")
    state_file.parent.mkdir(parents=True, exist_ok=True)
    _leftover_stop(port=port, state_file=state_file, pid_file=pid_file)
    try:
        proc = start_anvil(port=port, state_file=state_file)
    except AnvilPortTaken as exc:
        raise DevChainError(f"the dev chain's {exc}: stop that process, or set GRIDBID_CHAIN_PORT to a free port "
                            f"(or CHAIN_RPC_URL to use a chain of your own)") from exc
    except RuntimeError as exc:  # anvil exited: its own words say why (a broken state file, ...)
        raise DevChainError(f"the dev chain did not start on port {port} ({exc}); its state file is {state_file}") from exc
    url = f"http://127.0.0.1:{port}"
    try:
        _pid_file_write(pid_file, pid=proc.pid, port=port, state_file=state_file)
        deployment = deployment_ensure(ChainClient(url, expected_chain_id=DEV_CHAIN_ID), rpc_url=url, fund=DEMO_ACCOUNTS)
    except BaseException:
        stop_anvil(proc)
        pid_file.unlink(missing_ok=True)
        raise
    return DevChain(proc=proc, url=url, deployment=deployment, pid_file=pid_file)


def deployment_ensure(client: ChainClient, *, rpc_url: str = "", fund: tuple[str, ...] = ()) -> Deployment:
    """The active deployment on this chain if its code is still there and current, else a
    fresh one.

    On a chain restarted without its state file the old addresses are empty; after an
    upgrade of GridBid the market there is an older contract than the one this code talks
    to. Either way the old row is deactivated and the contracts are deployed again (on
    the dev chain: what the old market held stays in it)."""
    # lazy: the Vyper compiler is slow to load, and only a first deployment needs it
    from contracts.compile import load_artifact
    from contracts.deploy import deploy_all

    chain_id = client.chain_id
    current = Deployment.objects.filter(chain_id=chain_id, active=True).order_by("-id").first()
    if current is not None:
        # the deployed code is the compiled runtime followed by the immutables' values
        runtime = bytes.fromhex(load_artifact("GridBidMarket")["deployedBytecode"].removeprefix("0x"))
        code = client.code(current.market_address)
        if code.startswith(runtime):
            if rpc_url and current.rpc_url != rpc_url:
                Deployment.objects.filter(pk=current.pk).update(rpc_url=rpc_url)
            return current
        if code:
            log.warning("the market at %s is an older contract than this GridBid's: deploying the current one",
                        current.market_address)
    Deployment.objects.filter(chain_id=chain_id, active=True).update(active=False)
    operator = operator_signer(chain_id)
    token = settings.CONFIG.token_address
    addrs = deploy_all(client.w3, deployer=operator, operator=operator.address, arbiter=operator.address, token=token)
    deployment = Deployment.objects.create(
        chain_id=chain_id, rpc_url=rpc_url, market_address=addrs["market"], token_address=addrs["token"],
        operator_address=operator.address, deployed_block=client.block_number(),
    )
    chain_context_reset()
    if token is None and fund:
        token_contract = client.contract("TestToken", addrs["token"])
        for address in fund:
            tx = token_contract.functions.mint(to_checksum_address(address), DEMO_TOKENS).build_transaction(
                {"from": operator.address, "nonce": client.pending_nonce(operator.address)})
            client.wait(client.broadcast(client.sign(tx, nonce=tx["nonce"], fees=client.fees(), signer=operator)))
    return deployment


__all__ = ["ANVIL_DEV_KEY", "DevChain", "DevChainError", "deployment_ensure", "devchain_start"]

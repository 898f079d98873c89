"""The embedded dev chain of `gridbid up`: anvil with its state in the data directory,
the contracts deployed once (recorded in Deployment), demo accounts funded.

Used only when CHAIN_RPC_URL is unset. Without the anvil binary (`make run`
installs it from npm) the server runs without settlement and says so in one line.
"""

from __future__ import annotations

import logging
import subprocess
from dataclasses import dataclass

from django.conf import settings
from eth_utils import to_checksum_address

from ledger.chain import ChainClient, signer_from_hex
from ledger.chain.anvil import AnvilNotFound, find_anvil, start_anvil, stop_anvil
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


@dataclass
class DevChain:
    proc: subprocess.Popen[bytes]
    url: str
    deployment: Deployment

    def stop(self) -> None:
        stop_anvil(self.proc)  # SIGTERM: anvil dumps its state file


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
    proc = start_anvil(port=port, state_file=settings.CONFIG.data_dir / "chain-state.json")
    url = f"http://127.0.0.1:{port}"
    try:
        deployment = deployment_ensure(ChainClient(url, expected_chain_id=DEV_CHAIN_ID), rpc_url=url, fund=DEMO_ACCOUNTS)
    except BaseException:
        stop_anvil(proc)
        raise
    return DevChain(proc=proc, url=url, deployment=deployment)


def deployment_ensure(client: ChainClient, *, rpc_url: str = "", fund: tuple[str, ...] = ()) -> Deployment:
    """The active deployment on this chain if its code is still there and current, else a
    fresh one.

    On a chain restarted without its state file the old addresses are empty; after an
    upgrade of GridBid the market there is an older contract than the one this code talks
    to. Either way the old row is deactivated and the contracts are deployed again (on
    the dev chain: what the old market held stays in it)."""
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


__all__ = ["ANVIL_DEV_KEY", "DevChain", "deployment_ensure", "devchain_start"]

"""Deploy GridBid's contracts: used by the tests, the dev chain and ``gridbid chain deploy``.

``deployer`` is either an address the node unlocks (anvil) or a
local account (``eth_account.Account.from_key``) whose transactions are signed
here and sent raw, as on a production chain.
"""

from __future__ import annotations

from typing import Any

from eth_account.signers.local import LocalAccount
from web3 import Web3
from web3.contract import Contract

from contracts.compile import load_artifact

__all__ = [
    "MARKET_DEFAULTS",
    "contract_at",
    "deploy_bls_verifier",
    "deploy_all",
    "deploy_contract",
    "deploy_market",
    "deploy_token",
]

Deployer = str | LocalAccount

MARKET_DEFAULTS: dict[str, int] = {
    "min_stake": 100 * 10**6,  # 100 tokens of 6 decimals
    "grace_period": 3600,
    "dispute_window": 24 * 3600,
    "exit_delay": 7 * 24 * 3600,
}


def _address(who: Deployer) -> str:
    return who.address if isinstance(who, LocalAccount) else Web3.to_checksum_address(who)


def contract_at(w3: Web3, name: str, address: str) -> Contract:
    """A handle on a deployed contract, with the ABI from the compile step."""
    return w3.eth.contract(address=Web3.to_checksum_address(address), abi=load_artifact(name)["abi"])


def deploy_contract(w3: Web3, name: str, *args: Any, deployer: Deployer) -> Contract:
    artifact = load_artifact(name)
    factory = w3.eth.contract(abi=artifact["abi"], bytecode=artifact["bytecode"])
    constructor = factory.constructor(*args)
    if isinstance(deployer, LocalAccount):
        tx = constructor.build_transaction(
            {
                "from": deployer.address,
                "nonce": w3.eth.get_transaction_count(deployer.address, "pending"),
            }
        )
        signed = deployer.sign_transaction(tx)
        tx_hash = w3.eth.send_raw_transaction(signed.raw_transaction)
    else:
        tx_hash = constructor.transact({"from": _address(deployer)})
    receipt = w3.eth.wait_for_transaction_receipt(tx_hash)
    if receipt["status"] != 1 or not receipt["contractAddress"]:
        raise RuntimeError(f"deploy of {name} failed: {receipt}")
    return w3.eth.contract(address=receipt["contractAddress"], abi=artifact["abi"])


def deploy_token(w3: Web3, deployer: Deployer) -> Contract:
    """The 6-decimal test stablecoin; ``deployer`` becomes its minter."""
    return deploy_contract(w3, "TestToken", deployer=deployer)


def deploy_bls_verifier(w3: Web3, deployer: Deployer) -> Contract:
    """The stateless BLS verifier the market calls (one serves any number of markets)."""
    return deploy_contract(w3, "BlsVerifier", deployer=deployer)


def deploy_market(
    w3: Web3,
    *,
    admin: str,
    token: str,
    operator: str,
    arbiter: str,
    deployer: Deployer | None = None,
    bls_verifier: str | None = None,
    min_stake: int = MARKET_DEFAULTS["min_stake"],
    grace_period: int = MARKET_DEFAULTS["grace_period"],
    dispute_window: int = MARKET_DEFAULTS["dispute_window"],
    exit_delay: int = MARKET_DEFAULTS["exit_delay"],
) -> Contract:
    """GridBidMarket over ``token`` (any ERC-20 address), calling ``bls_verifier``
    (deployed first when not given). Times are in seconds."""
    deployer = deployer if deployer is not None else admin
    if bls_verifier is None:
        bls_verifier = deploy_bls_verifier(w3, deployer).address
    return deploy_contract(
        w3,
        "GridBidMarket",
        Web3.to_checksum_address(token),
        Web3.to_checksum_address(bls_verifier),
        Web3.to_checksum_address(admin),
        Web3.to_checksum_address(operator),
        Web3.to_checksum_address(arbiter),
        min_stake,
        grace_period,
        dispute_window,
        exit_delay,
        deployer=deployer,
    )


def deploy_all(
    w3: Web3,
    *,
    deployer: Deployer,
    operator: str,
    arbiter: str,
    admin: str | None = None,
    token: str | None = None,
    **market_params: Any,
) -> dict[str, str]:
    """Deploy the market, and a TestToken first when no ``token`` address is given
    (``market_params``: ``deploy_market``'s times, stake and ``bls_verifier``).

    Returns ``{"token": address, "market": address, "chain_id": ..., "bls_verifier": address}``.
    """
    if token is None:
        token = deploy_token(w3, deployer).address
    market = deploy_market(
        w3,
        admin=admin or _address(deployer),
        token=token,
        operator=operator,
        arbiter=arbiter,
        deployer=deployer,
        **market_params,
    )
    return {
        "token": str(token), "market": str(market.address), "chain_id": str(w3.eth.chain_id),
        "bls_verifier": str(market.functions.bls_verifier().call()),
    }

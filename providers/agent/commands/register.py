from __future__ import annotations

from typing import Any

import click

from providers.agent.commands import fail, option


@click.command("register")
@option("--interconnect", type=click.Choice(["auto", "pcie", "nvlink", "sxm", "infiniband", "none"]), default="auto", show_default=True)
@option("--public-endpoint", default="", help="Where buyers may reach this machine, if anywhere.")
@option("--stake", default=None, help="Tokens to stake on chain, e.g. 150.00 [default: the market's minimum].")
@option("--rpc-url", default=None, help="Your own chain node (JSON-RPC URL) instead of the one the market names; kept in the config.")
@option("--chain/--no-chain", default=True, help="Also register on chain (stake, BLS key, proof of possession).")
@click.pass_context
def command(ctx: click.Context, interconnect: str, public_endpoint: str, stake: str | None, rpc_url: str | None, chain: bool) -> None:
    """Register this machine's GPUs with the market, and the provider's keys.

    Sends the BLS public key, binds the Ethereum address by a signed challenge,
    registers the machine (REST), then registers the provider on chain: approves
    the stake on the token and calls the market contract's `register` with the
    stake, the BLS public key and its proof of possession. Running it again is
    harmless: what is registered already is left alone.
    """
    from providers.agent import keys
    from providers.agent.commands import client_for, console, home_of, load, market_call
    from providers.agent.config import save_config
    from providers.agent.inventory import InventoryError, detect

    home = home_of(ctx)
    config = load(ctx)
    out = console()
    try:
        inv = detect(config.inventory_file)
    except InventoryError as exc:
        fail(str(exc), 2)
    unmatched = [g for g in inv.gpus if not g.model]
    if not inv.gpus:
        fail("No GPUs found to register. Declare them with `gridbid-agent init --inventory FILE`.", 2)
    if unmatched:
        fail("; ".join(g.match for g in unmatched), 2)
    client = client_for(config)
    bls_key = keys.load_bls(home)
    account = keys.load_eth(home)
    market_call(lambda: client.provider_update(bls_public_key=bls_key.public_key.hex()))
    ch = market_call(client.challenge)
    market_call(lambda: client.challenge_verify(challenge=ch["challenge"], signature=keys.sign_text(account, ch["challenge"]), address=account.address))
    out.print(f"Provider keys sent: BLS {bls_key.public_key.hex()[:16]}..., address {account.address} (proved by signature).")
    existing = {m["name"]: m for m in market_call(client.machines)}
    if config.machine_name in existing:
        machine = existing[config.machine_name]
        out.print(f"Machine {config.machine_name!r} is registered already (#{machine['id']}).")
    else:
        body = {
            "name": config.machine_name, "region": config.region, "public_endpoint": public_endpoint,
            "interconnect": inv.interconnect if interconnect == "auto" else interconnect,
            "measured_tflops": config.measured_tflops,
            "gpus": inv.registration_gpus(),
        }
        machine = market_call(lambda: client.machine_register(body))
        out.print(f"Registered machine {config.machine_name!r} as #{machine['id']} with {len(inv.gpus)} GPU(s) in {config.region}.")
    config.machine_id = int(machine["id"])
    if rpc_url:
        from providers.agent.chain import ChainError, check_rpc_url

        try:
            config.rpc_url = check_rpc_url(rpc_url)
        except ChainError as exc:
            fail(f"--rpc-url: {exc}", 2)
    save_config(home, config)
    if not chain:
        out.print("On-chain registration skipped (--no-chain); trades need it before they are recorded on chain.")
        return
    register_on_chain(config, client, account=account, bls_key=bls_key, stake=stake, rpc_url=rpc_url, out=out)


def register_on_chain(config: Any, client: Any, *, account: Any, bls_key: Any, stake: str | None, rpc_url: str | None, out: Any) -> None:
    """Stake and register the BLS key in the market contract, unless already registered."""
    from contracts import bls
    from providers.agent.chain import tokens
    from providers.agent.commands import chain_call, chain_for, faucet_hint
    from providers.agent.pricing import PricingError, parse_amount

    market, why_not = chain_for(config, client, rpc_url)
    if market is None:
        out.print(f"On-chain registration skipped: {why_not}.")
        return
    address = account.address
    done, staked = chain_call(lambda: market.registered(address))
    if done:
        out.print(f"Already registered on chain {market.info.chain_id} as {address} with a stake of {tokens(staked)} tokens; nothing to do.")
        return
    minimum = market.info.min_stake if market.info.min_stake is not None else chain_call(market.min_stake)
    try:
        amount = parse_amount(stake) if stake is not None else minimum
    except PricingError as exc:
        fail(f"--stake: {exc}", 2)
    if amount < minimum:
        fail(f"--stake {tokens(amount)} is below the market's minimum stake of {tokens(minimum)} tokens.", 2)
    held = int(chain_call(lambda: market.token_view("balanceOf", address)))
    if held < amount:
        fail(f"Not enough tokens for the stake: {address} holds {tokens(held)} of token {market.info.token}, "
             f"the stake is {tokens(amount)}. {faucet_hint(market, f'Send at least {tokens(amount - held)} more tokens to {address}')}, "
             "then run `gridbid-agent register` again.")
    if chain_call(lambda: market.eth_balance(address)) == 0:
        fail(f"No ETH for gas: {address} holds none on chain {market.info.chain_id}, and staking takes two transactions. "
             f"{faucet_hint(market, f'Send some ETH to {address}')}, then run `gridbid-agent register` again.")
    if int(chain_call(lambda: market.token_view("allowance", address, market.info.market))) < amount:
        receipt = chain_call(lambda: market.approve(account, amount))
        out.print(f"Approved the market to take the {tokens(amount)}-token stake (tx {receipt['transactionHash']}).")
    receipt = chain_call(lambda: market.register(
        account, pubkey_eip2537=bls.g1_to_eip2537(bls_key.public_key), pop_eip2537=bls.g2_to_eip2537(bls_key.proof_of_possession), stake=amount))
    out.print(f"Registered on chain {market.info.chain_id}: {address} staked {tokens(amount)} tokens with BLS key "
              f"{bls_key.public_key.hex()[:16]}... and its proof of possession (tx {receipt['transactionHash']}, block {int(receipt['blockNumber'], 16)}).")

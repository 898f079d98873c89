from __future__ import annotations

import click

from providers.agent.commands import option


@click.command("faucet")
@option("--rpc-url", default=None, help="Your own chain node (JSON-RPC URL) instead of the configured or the market's one.")
@option("--wait/--no-wait", default=True, help="Wait until the tokens are on chain [default: wait].")
@click.pass_context
def command(ctx: click.Context, rpc_url: str | None, wait: bool) -> None:
    """Dev chain only: test tokens and ETH for gas to this agent's address, for the stake.

    Proves the agent's address to the market (a signed challenge, as `register` does),
    asks the market's faucet (POST /api/v1/ledger/faucet/), which mints the market's
    minimum stake (at least 1,000 test tokens) and gives gas, once an hour per address,
    then waits for the tokens on chain. Markets on any other chain refuse: there, send
    the token and some ETH to the address yourself. Then run `gridbid-agent register`.
    """
    from providers.agent import keys
    from providers.agent.chain import ChainError, tokens
    from providers.agent.commands import (
        chain_call,
        client_for,
        console,
        fail,
        load,
        market_call,
        provider_on_chain,
    )

    config = load(ctx)
    out = console()
    client = client_for(config)
    account, market = provider_on_chain(ctx, config, rpc_url, "No faucet to ask")
    address = account.address
    ch = market_call(client.challenge)
    market_call(lambda: client.challenge_verify(challenge=ch["challenge"], signature=keys.sign_text(account, ch["challenge"]), address=address))
    grant = market_call(client.faucet)
    amount = int(grant["amount"])
    tx = (grant.get("transactions") or [{}])[0]
    out.print(f"The market's faucet is sending {tokens(amount)} test tokens and gas to {address} (proved by signature).")
    if not wait:
        return
    if tx.get("tx_hash"):
        try:
            market.wait(str(tx["tx_hash"]), what="faucet", timeout_s=60)
        except ChainError as exc:
            fail(f"{exc}; check later with `gridbid-agent faucet --no-wait` or your wallet", 1)
    held = int(chain_call(lambda: market.token_view("balanceOf", address)))
    gas = int(chain_call(lambda: market.eth_balance(address)))
    if held < amount:
        fail(f"The faucet's tokens are not at {address} yet (it holds {tokens(held)}); the market may still be sending them: "
             "wait a few seconds and run `gridbid-agent register`.", 1)
    out.print(f"{address} holds {tokens(held)} tokens of {market.info.token} and {gas / 1e18:.4f} ETH on chain {market.info.chain_id}. "
              "Now run `gridbid-agent register` to stake and register.")

from __future__ import annotations

import click

from providers.agent.commands import fail, option

STATES = {0: "not registered", 1: "active", 2: "suspended: stake below the minimum"}


@click.command("stake")
@option("--amount", default=None, help="Tokens to add, e.g. 25 [default: what brings the stake up to the market's minimum].")
@option("--rpc-url", default=None, help="Your own chain node (JSON-RPC URL) instead of the configured or the market's one.")
@click.pass_context
def command(ctx: click.Context, amount: str | None, rpc_url: str | None) -> None:
    """Top up the provider's stake in the market contract.

    A buyer's dispute holds its amount from your earnings, then your stake, and a
    ruling against you slashes the stake. Below the market's minimum stake the
    provider is suspended: no new trades and no settlement until it is topped up.
    Approves the token and calls `add_stake`, then shows the stake before and after.
    """
    from rich.table import Table

    from providers.agent.chain import tokens
    from providers.agent.commands import (
        amount_option,
        chain_call,
        console,
        faucet_hint,
        load,
        provider_on_chain,
    )

    config = load(ctx)
    out = console()
    wanted = amount_option(amount)
    account, market = provider_on_chain(ctx, config, rpc_url, "No stake to add on chain")
    address = account.address
    state, stake, _ = chain_call(lambda: market.market_view("providers", address))
    state, stake = int(state), int(stake)
    if state == 0:
        fail(f"{address} is not registered in the market contract {market.info.market}; run `gridbid-agent register` first.", 2)
    if state > 2:
        fail(f"{address} has asked to exit the market; its stake can only leave now. Register again after the exit to trade.", 2)
    minimum = int(chain_call(market.min_stake))
    value = wanted if wanted is not None else max(0, minimum - stake)
    if value == 0:
        out.print(f"Nothing to add: the stake of {tokens(stake)} tokens meets the minimum of {tokens(minimum)}. Pass --amount to add more.")
        return
    held = int(chain_call(lambda: market.token_view("balanceOf", address)))
    if held < value:
        fail(f"Not enough tokens: {address} holds {tokens(held)} of token {market.info.token} and the top-up is {tokens(value)}. "
             f"{faucet_hint(market, f'Send at least {tokens(value - held)} more tokens to {address}')}, then run `gridbid-agent stake` again.", 2)
    if int(chain_call(lambda: market.token_view("allowance", address, market.info.market))) < value:
        chain_call(lambda: market.approve(account, value))
    receipt = chain_call(lambda: market.add_stake(account, value))
    state_after, stake_after, _ = chain_call(lambda: market.market_view("providers", address))
    t = Table(show_header=False, title=f"Added {tokens(value)} tokens of stake", title_style="bold green")
    t.add_row("provider", address)
    t.add_row("stake", f"{tokens(stake)} -> {tokens(int(stake_after))} (minimum {tokens(minimum)})")
    t.add_row("state", f"{STATES.get(state, 'exiting')} -> {STATES.get(int(state_after), 'exiting')}")
    t.add_row("transaction", f"{receipt['transactionHash']} (block {int(receipt['blockNumber'], 16)}, chain {market.info.chain_id})")
    out.print(t)

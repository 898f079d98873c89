from __future__ import annotations

import click

from providers.agent.commands import fail, option


@click.command("withdraw")
@option("--amount", default=None, help="Tokens to withdraw, e.g. 12.50 [default: the whole free balance].")
@option("--rpc-url", default=None, help="Your own chain node (JSON-RPC URL) instead of the configured or the market's one.")
@click.pass_context
def command(ctx: click.Context, amount: str | None, rpc_url: str | None) -> None:
    """Withdraw settled earnings from the market contract to the provider's address.

    Reads the free balance the contract holds for this provider (`balance_of`),
    withdraws `--amount` of it or all of it, and shows the balances before and after.
    """
    from rich.table import Table

    from providers.agent.chain import tokens
    from providers.agent.commands import amount_option, chain_call, console, load, provider_on_chain

    config = load(ctx)
    out = console()
    wanted = amount_option(amount)
    account, market = provider_on_chain(ctx, config, rpc_url, "Nothing to withdraw on chain")
    address = account.address
    free = int(chain_call(lambda: market.market_view("balance_of", address)))
    if free == 0:
        out.print(f"Nothing to withdraw: {address} has no free balance in the market contract {market.info.market}. Settled trades pay into it.")
        return
    value = free if wanted is None else wanted
    if value > free:
        fail(f"--amount {tokens(value)} is more than the free balance of {tokens(free)} tokens; pass at most that, or leave --amount out to withdraw it all.", 2)
    wallet_before = int(chain_call(lambda: market.token_view("balanceOf", address)))
    receipt = chain_call(lambda: market.withdraw(account, value))
    free_after = int(chain_call(lambda: market.market_view("balance_of", address)))
    wallet_after = int(chain_call(lambda: market.token_view("balanceOf", address)))
    t = Table(show_header=False, title=f"Withdrew {tokens(value)} tokens", title_style="bold green")
    t.add_row("to", address)
    t.add_row("amount", f"{tokens(value)} tokens ({value} base units)")
    t.add_row("free in the market", f"{tokens(free)} -> {tokens(free_after)}")
    t.add_row("tokens at the address", f"{tokens(wallet_before)} -> {tokens(wallet_after)}")
    t.add_row("transaction", f"{receipt['transactionHash']} (block {int(receipt['blockNumber'], 16)}, chain {market.info.chain_id})")
    t.add_row("token", market.info.token)
    out.print(t)

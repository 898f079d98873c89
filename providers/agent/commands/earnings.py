from __future__ import annotations

import click


@click.command("earnings")
@click.pass_context
def command(ctx: click.Context) -> None:
    """Trades sold by this provider, by state, with their amounts."""
    from collections import defaultdict

    from rich.table import Table

    from providers.agent.commands import client_for, console, load, market_call
    from providers.agent.pricing import format_amount

    config = load(ctx)
    client = client_for(config)
    me = market_call(client.provider)
    totals: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for tr in market_call(client.trades):
        if tr["provider"] == me["id"]:
            totals[tr["state"]][0] += 1
            totals[tr["state"]][1] += int(tr["amount"])
    t = Table("state", "trades", "amount", title="Earnings (token units; settled = paid)")
    for state, (n, amount) in sorted(totals.items()):
        t.add_row(state, str(n), format_amount(amount))
    out = console()
    out.print(t)
    from providers.agent.chain import tokens
    from providers.agent.client import MarketError

    try:
        money = client.earnings()
    except MarketError as exc:
        out.print(f"On-chain earnings unavailable: {exc.message}")
        return
    if not money.get("address"):
        out.print("No chain address proven yet: run `gridbid-agent register`.")
        return
    out.print(f"On chain ({money['address']}, from the market's journal): paid {tokens(int(money['paid']))}, "
              f"free to withdraw {tokens(int(money['free']))}, held in disputes {tokens(int(money['held']))}, "
              f"stake {tokens(int(money['stake']))} tokens. `gridbid-agent withdraw` pays the free balance out.")

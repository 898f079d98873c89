from __future__ import annotations

import click


@click.command("earnings")
@click.pass_context
def command(ctx: click.Context) -> None:
    """What this provider was paid on chain, what disputes hold, and its trades by state.

    The money comes from the market's journal of confirmed chain events
    (GET /api/v1/ledger/earnings/), the same figures as the provider page, and matches
    the market contract to the unit: `paid` is what settlements paid for the GPU-time
    used (the unused part of each lock goes back to the buyer), less disputes lost.
    """
    from collections import Counter

    from providers.agent.chain import tokens
    from providers.agent.client import MarketError
    from providers.agent.commands import client_for, console, load, market_call

    config = load(ctx)
    client = client_for(config)
    me = market_call(client.provider)
    states = Counter(tr["state"] for tr in market_call(client.trades) if tr["provider"] == me["id"])
    out = console()
    if states:
        out.print("Trades sold: " + ", ".join(f"{n} {state}" for state, n in sorted(states.items())))
    else:
        out.print("No trades sold yet.")
    try:
        money = client.earnings()
    except MarketError as exc:
        out.print(f"On-chain earnings unavailable: {exc.message}")
        return
    if not money.get("address"):
        out.print("No chain address proven yet: run `gridbid-agent register`.")
        return
    d = money.get("disputes") or {}
    out.print(f"On chain ({money['address']}, confirmed events only): paid {tokens(int(money['paid']))} "
              f"(settled {tokens(int(money['settled']))} for the GPU-time used, less {tokens(int(d.get('lost_amount', 0)))} "
              f"lost in {int(d.get('lost', 0))} dispute(s)), held in disputes {tokens(int(money['held']))} "
              f"({int(d.get('open', 0))} open, {int(d.get('won', 0))} won), free to withdraw {tokens(int(money['free']))}, "
              f"withdrawn {tokens(int(money['withdrawn']))}, stake {tokens(int(money['stake']))} "
              f"(slashed {tokens(int(money['slashed']))}) tokens. `gridbid-agent withdraw` pays the free balance out.")

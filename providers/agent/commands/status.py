from __future__ import annotations

import click


@click.command("status")
@click.pass_context
def command(ctx: click.Context) -> None:
    """Show the agent's config, the machine as the market sees it, and local jobs."""
    from collections import Counter

    from rich.table import Table

    from providers.agent import keys
    from providers.agent.client import MarketError
    from providers.agent.commands import client_for, console, home_of, load
    from providers.agent.state import State

    home = home_of(ctx)
    config = load(ctx)
    out = console()
    t = Table(show_header=False, title="gridbid-agent")
    t.add_row("home", str(home))
    t.add_row("market", config.market_url)
    t.add_row("machine", f"{config.machine_name} (#{config.machine_id or 'unregistered'}) in {config.region}")
    t.add_row("address", keys.eth_address(home) if keys.keys_exist(home) else "no keys")
    try:
        machines = {m["id"]: m for m in client_for(config).machines()}
        m = machines.get(config.machine_id)
        t.add_row("market says", f"{m['state']}, reliability {m['reliability']:.2f}, last heartbeat {m['last_heartbeat']}" if m else "machine unknown to the market")
    except MarketError as exc:
        t.add_row("market says", f"[red]{exc.message}[/]")
    jobs = State(home / "state.sqlite3").jobs() if (home / "state.sqlite3").exists() else []
    t.add_row("jobs", ", ".join(f"{n} {s}" for s, n in Counter(j["state"] for j in jobs).items()) or "none")
    out.print(t)

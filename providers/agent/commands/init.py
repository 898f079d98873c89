from __future__ import annotations

import socket

import click

from providers.agent.commands import fail, home_of, market_call, option


@click.command("init")
@option("--market", required=True, help="The market's URL, e.g. https://gridbid.example.")
@option("--token", required=True, help="A provider API token (gb_...) with the 'provide' scope.")
@option("--machine-name", default=lambda: socket.gethostname().split(".")[0][:64], help="This machine's name on the market.")
@option("--region", default="us-east", show_default=True, help="Catalogue region id where this machine sits.")
@option("--inventory", type=click.Path(dir_okay=False, exists=True), default=None, help="A declared inventory (JSON/TOML) instead of NVML.")
@option("--runtime", type=click.Choice(["auto", "process", "docker", "podman"]), default="auto", show_default=True)
@option("--public-host", default=None, help="The host name or address buyers reach this machine's published container ports at (jobs asking for ports or ssh need it).")
@option("--host-ports", default="40000-40999", show_default=True, help="The range of host ports published container ports are mapped to, LOW-HIGH.")
@option("--password-file", type=click.Path(dir_okay=False, exists=True), default=None, help="Keystore password; otherwise a random one is kept 0600 beside the keystore.")
@option("--kdf-iterations", type=int, default=None, hidden=True)
@option("--accept-trade-states", default="recorded", show_default=True, help="Run jobs whose trade is in these states (comma-separated); 'pending,recorded' for a market without a chain.")
@option("--check/--no-check", default=True, help="Check the market is reachable and the token valid.")
@click.pass_context
def command(ctx: click.Context, market: str, token: str, machine_name: str, region: str, inventory: str | None, runtime: str, public_host: str | None, host_ports: str, password_file: str | None, kdf_iterations: int | None, accept_trade_states: str, check: bool) -> None:
    """Create the provider's keys and the agent's config; check the market and token."""
    from pathlib import Path

    from providers import catalogue
    from providers.agent import keys
    from providers.agent.commands import client_for, console
    from providers.agent.config import (
        AgentConfig,
        ConfigError,
        load_config,
        ports_check,
        save_config,
    )

    home = home_of(ctx)
    out = console()
    if not token.startswith("gb_"):
        fail("The token should start with 'gb_'. Create one on your account page with the 'provide' scope.", 2)
    if region not in catalogue.regions():
        fail(f"Unknown region {region!r}; choose one of: {', '.join(sorted(catalogue.regions()))}", 2)
    try:
        old = load_config(home)
    except ConfigError:
        old = None
    config = AgentConfig(market_url=market.rstrip("/"), token=token, machine_name=machine_name, region=region, inventory_file=str(Path(inventory).resolve()) if inventory else None, runtime=runtime)
    low, _, high = host_ports.partition("-")
    if not (low.strip().isdigit() and high.strip().isdigit()):
        fail(f"--host-ports: expected LOW-HIGH, e.g. 40000-40999 (got {host_ports!r})", 2)
    config.public_host, config.host_port_min, config.host_port_max = public_host or None, int(low), int(high)
    try:
        ports_check(config, source="--public-host/--host-ports")
    except ConfigError as exc:
        fail(str(exc), 2)
    config.accept_trade_states = [x.strip() for x in accept_trade_states.split(",") if x.strip()]
    if unknown := set(config.accept_trade_states) - {"pending", "recorded"}:
        fail(f"--accept-trade-states: {', '.join(sorted(unknown))} are not states a job may run in (pending, recorded)", 2)
    if old is not None:  # keep what was learnt since: registration, prices, benchmark
        config.machine_id, config.pricing, config.measured_tflops = old.machine_id, old.pricing, old.measured_tflops
    if check:
        client = client_for(config)
        me = market_call(client.me)
        if me.get("role") != "provider":
            fail(f"The token belongs to {me.get('username')!r}, a {me.get('role')} account; sign up as a provider.", 2)
        market_call(client.provider)  # needs the 'provide' scope
        out.print(f"Market {config.market_url} reachable; token valid for provider [bold]{me['username']}[/].")
    if keys.keys_exist(home):
        address = keys.eth_address(home)
        out.print(f"Keys already in {keys.keys_dir(home)}; keeping them.")
    else:
        password = Path(password_file).read_text().strip() if password_file else None
        address, _ = keys.create_keys(home, password=password, kdf_iterations=kdf_iterations)
        out.print(f"Created an Ethereum account and a BLS12-381 key with proof of possession in {keys.keys_dir(home)} (0600).")
    path = save_config(home, config)
    out.print(f"Provider address {address}\nConfig written to {path}\n"
              "Next: `gridbid-agent detect` (your GPUs), `gridbid-agent faucet` (on a market's dev chain: test tokens and gas "
              "for the stake), `gridbid-agent register` (machine, keys and stake), `gridbid-agent price set MODEL --floor USDC` "
              "(your offers), then `gridbid-agent run`.")

from __future__ import annotations

import click

from providers.agent.commands import fail, option


@click.command("register")
@option("--interconnect", type=click.Choice(["auto", "pcie", "nvlink", "sxm", "infiniband", "none"]), default="auto", show_default=True)
@option("--public-endpoint", default="", help="Where buyers may reach this machine, if anywhere.")
@click.pass_context
def command(ctx: click.Context, interconnect: str, public_endpoint: str) -> None:
    """Register this machine's GPUs with the market, and the provider's keys.

    Sends the BLS public key, binds the Ethereum address by a signed challenge,
    and registers the machine (REST). Staking on chain is not done here yet.
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
            "gpus": [{"index": g.index, "uuid": g.uuid, "model": g.model, "memory_gib": g.memory_gib} for g in inv.gpus],
        }
        machine = market_call(lambda: client.machine_register(body))
        out.print(f"Registered machine {config.machine_name!r} as #{machine['id']} with {len(inv.gpus)} GPU(s) in {config.region}.")
    config.machine_id = int(machine["id"])
    save_config(home, config)
    out.print("On-chain registration (stake, BLS key and proof of possession) is not available from the agent yet.")

from __future__ import annotations

import contextlib

import click

from providers.agent.commands import fail, option


@click.command("detect")
@option("--inventory", type=click.Path(dir_okay=False, exists=True), default=None, help="Read a declared inventory (JSON/TOML) instead of NVML / rocm-smi.")
@option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@option("--list-models", is_flag=True, help="List the catalogue's GPU model ids.")
@click.pass_context
def command(ctx: click.Context, inventory: str | None, as_json: bool, list_models: bool) -> None:
    """Show this machine's GPUs (model, memory, UUID, driver and CUDA, topology, MIG) and its
    host (CPU, RAM, free disk, measured bandwidth), as the agent reports them to the market."""
    import json

    from rich.table import Table

    from providers import catalogue
    from providers.agent.commands import console, home_of
    from providers.agent.config import ConfigError, load_config
    from providers.agent.host import host_facts
    from providers.agent.inventory import InventoryError, detect

    out = console()
    if list_models:
        t = Table("id", "vendor", "name", "GiB", "BF16 TFLOPS", title="Catalogue GPU models")
        for m in catalogue.gpu_models().values():
            t.add_row(m.id, m.vendor, m.name, str(m.memory_gib), f"{m.bf16_tflops:g}")
        out.print(t)
        return
    if inventory is None:
        with contextlib.suppress(ConfigError):
            inventory = load_config(home_of(ctx)).inventory_file
    config = None
    with contextlib.suppress(ConfigError):
        config = load_config(home_of(ctx))
    try:
        inv = detect(inventory)
    except InventoryError as exc:
        fail(str(exc), 2)
    host = host_facts(home=home_of(ctx), inv=inv, runtime=config.runtime if config else "auto",
                      net_down_mbps=config.net_down_mbps if config else None, net_up_mbps=config.net_up_mbps if config else None)
    if as_json:
        click.echo(json.dumps({**inv.as_dict(), "host": host}, indent=2))
        return
    if not inv.gpus:
        fail("No GPUs found: NVML and rocm-smi see none. Declare them with --inventory FILE.", 1)
    t = Table("#", "name", "catalogue model", "memory", "uuid", "MIG", title=f"GPUs ({inv.source}; driver {inv.driver_version or '?'}, CUDA {inv.cuda_version or '?'})")
    for g in inv.gpus:
        t.add_row(str(g.index), g.name, g.model or "[red]unmatched[/]", f"{g.memory_mib / 1024:.0f} GiB", g.uuid, g.mig or "-")
    out.print(t)
    for g in inv.gpus:
        out.print(("  " if g.model else "  [yellow]![/] ") + g.match, highlight=False)
    if inv.links:
        out.print("Topology: " + ", ".join(f"{k} {v}" for k, v in sorted(inv.links.items())))
    net = (f"{host['net_down_mbps']:,} Mbit/s down, {host['net_up_mbps']:,} up" if "net_down_mbps" in host and "net_up_mbps" in host
           else "bandwidth not measured (run `gridbid-agent benchmark`)")
    out.print(f"Host: {host['cpu_model'] or 'CPU model unknown'}, {host['cpu_cores']} cores, {host['ram_gib']} GiB RAM, "
              f"{host['disk_gb']:,} GB free for jobs, {net}", highlight=False)

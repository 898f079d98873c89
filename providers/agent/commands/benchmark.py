from __future__ import annotations

import click

from providers.agent.commands import option


@click.command("benchmark")
@option("--seconds", type=click.FloatRange(0.1, 120), default=2.0, show_default=True, help="Time budget per device.")
@option("--size", type=click.IntRange(64, 32768), default=1024, show_default=True, help="Matrix size for the CPU run.")
@option("--save/--no-save", default=True, help="Store the figures in the config: the per-GPU TFLOPS, sent on `register`; the bandwidth, sent with each heartbeat.")
@option("--network/--no-network", default=True, show_default=True, help="Also measure bandwidth to the market, down and up (needs `init`).")
@option("--net-mib", type=click.IntRange(1, 64), default=8, show_default=True, help="MiB moved each way per try (best of 3).")
@click.pass_context
def command(ctx: click.Context, seconds: float, size: int, save: bool, network: bool, net_mib: int) -> None:
    """Measure achieved TFLOPS (numpy on the CPU, torch or cupy on each GPU when installed)
    and bandwidth to the market, down and up."""
    from rich.progress import Progress
    from rich.table import Table

    from providers.agent.benchmark import (
        NetResult,
        bench_cpu,
        bench_gpus,
        bench_network,
        per_gpu_tflops,
    )
    from providers.agent.client import MarketError
    from providers.agent.commands import client_for, console, home_of
    from providers.agent.config import ConfigError, load_config, save_config

    out = console()
    net: list[NetResult] = []
    net_error = ""
    try:
        config = load_config(home_of(ctx)) if (network or save) else None
    except ConfigError as exc:
        config, net_error = None, str(exc)
    with Progress(transient=True, console=out) as progress:
        task = progress.add_task("benchmarking", total=3)
        results = [bench_cpu(size, seconds)]
        progress.advance(task)
        results += bench_gpus(budget_s=seconds)
        progress.advance(task)
        if network and config is not None:
            progress.update(task, description=f"network: {net_mib} MiB each way, 3 tries")
            try:
                net = bench_network(client_for(config), net_mib * 2**20)
            except MarketError as exc:
                net_error = exc.message
        progress.advance(task)
    t = Table("device", "backend", "dtype", "n", "TFLOPS", "seconds", title="Matrix multiply")
    for r in results:
        t.add_row(r.device, r.backend, r.dtype, str(r.n), f"{r.tflops:g}", f"{r.seconds:g}")
    out.print(t)
    if net:
        n = Table("direction", "MiB", "seconds", "Mbit/s", title=f"Bandwidth to the market ({config.market_url if config else ''}), best of 3")
        for r in net:
            n.add_row(r.direction, f"{r.bytes / 2**20:g}", f"{r.seconds:.3f}", f"{r.mbps:,.0f}")
        out.print(n)
    elif network:
        out.print(f"Bandwidth not measured: {net_error or 'no market configured'}.")
    measured = per_gpu_tflops(results)
    if measured is None:
        out.print("No GPU library (torch with CUDA, or cupy) is installed: only the CPU was measured, and offers keep the datasheet figure.")
    if not save or config is None:
        return
    if measured is not None:
        config.measured_tflops = measured
        out.print(f"Saved {measured} TFLOPS per GPU; `gridbid-agent register` sends it to the market.")
    for r in net:
        setattr(config, f"net_{r.direction}_mbps", round(r.mbps))
    if net:
        out.print("Saved the bandwidth; the agent's next heartbeat sends it, and offers show it.")
    if measured is not None or net:
        save_config(home_of(ctx), config)

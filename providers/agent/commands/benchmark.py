from __future__ import annotations

import click

from providers.agent.commands import option


@click.command("benchmark")
@option("--seconds", type=click.FloatRange(0.1, 120), default=2.0, show_default=True, help="Time budget per device.")
@option("--size", type=click.IntRange(64, 32768), default=1024, show_default=True, help="Matrix size for the CPU run.")
@option("--save/--no-save", default=True, help="Store the per-GPU figure in the config, to be sent on `register`.")
@click.pass_context
def command(ctx: click.Context, seconds: float, size: int, save: bool) -> None:
    """Measure achieved TFLOPS: numpy on the CPU, torch or cupy on each GPU when installed."""
    from rich.progress import Progress
    from rich.table import Table

    from providers.agent.benchmark import bench_cpu, bench_gpus, per_gpu_tflops
    from providers.agent.commands import console, home_of
    from providers.agent.config import ConfigError, load_config, save_config

    out = console()
    with Progress(transient=True, console=out) as progress:
        task = progress.add_task("benchmarking", total=2)
        results = [bench_cpu(size, seconds)]
        progress.advance(task)
        results += bench_gpus(budget_s=seconds)
        progress.advance(task)
    t = Table("device", "backend", "dtype", "n", "TFLOPS", "seconds", title="Matrix multiply")
    for r in results:
        t.add_row(r.device, r.backend, r.dtype, str(r.n), f"{r.tflops:g}", f"{r.seconds:g}")
    out.print(t)
    measured = per_gpu_tflops(results)
    if measured is None:
        out.print("No GPU library (torch with CUDA, or cupy) is installed: only the CPU was measured, and offers keep the datasheet figure.")
    elif save:
        try:
            config = load_config(home_of(ctx))
        except ConfigError:
            return
        config.measured_tflops = measured
        save_config(home_of(ctx), config)
        out.print(f"Saved {measured} TFLOPS per GPU; `gridbid-agent register` sends it to the market.")

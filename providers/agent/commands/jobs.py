from __future__ import annotations

import click

from providers.agent.commands import fail, option


def _state(ctx: click.Context):  # type: ignore[no-untyped-def]
    from providers.agent.commands import home_of
    from providers.agent.state import State

    return State(home_of(ctx) / "state.sqlite3")


@click.group("jobs")
def command() -> None:
    """Jobs this agent ran or is running."""


@command.command("list")
@click.pass_context
def list_(ctx: click.Context) -> None:
    """List jobs."""
    from rich.table import Table

    from providers.agent.commands import console

    t = Table("trade", "job", "state", "GPUs", "exit", "GPU-s", "reason", title="Jobs")
    for j in _state(ctx).jobs():
        t.add_row(str(j["trade_id"]), str(j["job_id"]), j["state"], ",".join(map(str, j["gpus"])), "" if j["exit_code"] is None else str(j["exit_code"]), str(j["gpu_seconds"] or ""), j["reason"] or "")
    console().print(t)


@command.command("show")
@click.argument("trade_id", type=int)
@click.pass_context
def show(ctx: click.Context, trade_id: int) -> None:
    """Show one job, with its receipt."""
    import json

    job = _state(ctx).job(trade_id)
    if job is None:
        fail(f"No job for trade {trade_id} on this machine.")
    click.echo(json.dumps(job, indent=2, default=str))


@command.command("logs")
@click.argument("trade_id", type=int)
@option("--tail", type=int, default=200, show_default=True, help="Lines from the end.")
@click.pass_context
def logs(ctx: click.Context, trade_id: int, tail: int) -> None:
    """Print a job's output (stdout and stderr)."""
    from providers.agent.commands import home_of

    path = home_of(ctx) / "jobs" / str(trade_id) / "job.log"
    if not path.exists():
        fail(f"No log for trade {trade_id}.")
    lines = path.read_text(errors="replace").splitlines()
    click.echo("\n".join(lines[-tail:]))

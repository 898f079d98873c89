"""`gridbid-agent`: the provider agent's command line.

One module per command under `providers.agent.commands`, loaded only when that
command runs, so `gridbid-agent --help` stays fast and light. Every option is
also an environment variable `GRIDBID_AGENT_<OPTION>`.
"""

from __future__ import annotations

import importlib
from typing import Any

import click

from providers.agent.config import agent_home

COMMANDS = {
    "init": "Create keys and the config; check the market and token.",
    "detect": "Show the GPUs this machine has, matched to the catalogue.",
    "benchmark": "Measure achieved TFLOPS with a short matrix multiply.",
    "faucet": "Dev chain only: get test tokens and gas for the stake.",
    "register": "Register this machine and the provider's keys with the market.",
    "price": "Set pricing per GPU model and publish offers.",
    "reclaim": "Take lent GPUs back (their spot jobs checkpoint and move), or lend them again.",
    "run": "Run the daemon: heartbeats, assignments, jobs, receipts.",
    "status": "Show the agent, machine and job status.",
    "jobs": "List jobs, show one, print its logs.",
    "earnings": "Show what this provider has sold and earned.",
    "withdraw": "Withdraw earnings on chain.",
    "stake": "Top up the provider's stake on chain.",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context | None, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        # before a command loads web3 or our BLS code: py-ecc raises the recursion limit so
        # far that a deeply nested JSON reply would crash the agent instead of raising
        importlib.import_module("contracts.pyecc")
        return importlib.import_module(f"providers.agent.commands.{name}").command  # type: ignore[no-any-return]

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        with formatter.section("Commands"):
            formatter.write_dl([(n, h) for n, h in COMMANDS.items()])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--home", envvar="GRIDBID_AGENT_HOME", type=click.Path(file_okay=False), default=None, help="The agent's data directory [env GRIDBID_AGENT_HOME; default ~/.gridbid-agent].")
@click.version_option(package_name="gridbid", prog_name="gridbid-agent")
@click.pass_context
def main(ctx: click.Context, home: str | None) -> None:
    """GridBid provider agent: sell this machine's GPUs on the GridBid market."""
    ctx.obj = {"home": agent_home(home)}


def run() -> Any:  # pragma: no cover - console entry alias
    return main()

from __future__ import annotations

import click

from providers.agent.commands import fail


@click.command("withdraw")
def command() -> None:
    """Withdraw settled earnings to the provider's address (on chain)."""
    fail("On-chain withdrawal is not available from the agent yet; the market's settlement contract pays providers directly.", 2)

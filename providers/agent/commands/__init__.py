"""One module per `gridbid-agent` command; shared helpers for them live here."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

import click


def option(*decls: str, **kw: Any) -> Callable[[Any], Any]:
    """A click option whose environment variable is GRIDBID_AGENT_<LONG NAME>."""
    long = next(d for d in decls if d.startswith("--")).split("/")[0]
    kw.setdefault("envvar", "GRIDBID_AGENT_" + long[2:].replace("-", "_").upper())
    kw.setdefault("show_envvar", True)
    return click.option(*decls, **kw)


def fail(message: str, code: int = 1) -> NoReturn:
    from rich.console import Console

    Console(stderr=True).print(f"[bold red]gridbid-agent:[/] {message}", highlight=False)
    sys.exit(code)


def home_of(ctx: click.Context) -> Path:
    return ctx.find_root().obj["home"]  # type: ignore[no-any-return]


def load(ctx: click.Context) -> Any:
    from providers.agent.config import ConfigError, load_config

    try:
        return load_config(home_of(ctx))
    except ConfigError as exc:
        fail(str(exc), 2)


def client_for(config: Any) -> Any:
    from providers.agent.client import MarketClient

    return MarketClient(config.market_url, config.token)


def market_call(fn: Callable[[], Any]) -> Any:
    """Run one market request, turning its errors into one clear line."""
    from providers.agent.client import MarketError

    try:
        return fn()
    except MarketError as exc:
        detail = "; ".join(f"{k}: {' '.join(v) if isinstance(v, list) else v}" for k, v in exc.fields.items())
        fail(exc.message + (f" ({detail})" if detail else ""))


def console() -> Any:
    from rich.console import Console

    return Console()


def rpc_for(url: str) -> Any:
    """The chain node at `url` (a seam for tests)."""
    from providers.agent.chain import Rpc

    return Rpc(url)


def chain_for(config: Any, client: Any, rpc_url: str | None) -> tuple[Any, str | None]:
    """(the market's contracts on a checked node, None), or (None, why there is no chain).

    The node is `rpc_url` (--rpc-url / GRIDBID_AGENT_RPC_URL), else the one saved in the
    config, else the one the market names. Fails with a clear message when the node is
    unreachable or is not the market's chain."""
    from providers.agent.chain import ChainError, ChainInfo, Market, check_rpc_url
    from providers.agent.client import MarketError

    try:
        body = client.chain_info()
    except MarketError as exc:
        if exc.status == 404:
            return None, f"the market at {config.market_url} does not describe a settlement chain (an older market?)"
        fail(exc.message)
    try:
        info = ChainInfo.from_api(body)
        if info is None:
            return None, f"the market at {config.market_url} has no settlement chain configured; its trades are not settled on chain"
        url = rpc_url or config.rpc_url or info.rpc_url
        if not url:
            fail(f"The market settles on chain {info.chain_id} but publishes no node URL; pass your own node with --rpc-url URL (or GRIDBID_AGENT_RPC_URL).", 2)
        market = Market(rpc_for(check_rpc_url(url)), info)
        market.check()
    except ChainError as exc:
        fail(str(exc))
    return market, None


def chain_call(fn: Callable[[], Any]) -> Any:
    """Run one chain step, turning its errors into one clear line."""
    from providers.agent.chain import ChainError, Reverted

    try:
        return fn()
    except Reverted as exc:
        fail(f"the contract refused: {exc.reason}")
    except ChainError as exc:
        fail(str(exc))


def amount_option(amount: str | None) -> int | None:
    """The --amount of a chain command in base units (None when not given); exits 2 on a bad one."""
    from providers.agent.pricing import PricingError, parse_amount

    if amount is None:
        return None
    try:
        value = parse_amount(amount)
    except PricingError as exc:
        fail(f"--amount: {exc}", 2)
    if value <= 0:
        fail("--amount must be more than 0.", 2)
    return value


def provider_on_chain(ctx: click.Context, config: Any, rpc_url: str | None, nothing: str) -> tuple[Any, Any]:
    """(the provider's Ethereum account, the market's contracts): for the commands that send
    from the provider's address. Exits 2 with ``nothing``: why, when there is no chain."""
    from providers.agent import keys

    try:
        account = keys.load_eth(home_of(ctx))
    except keys.KeyError_ as exc:
        fail(str(exc), 2)
    market, why_not = chain_for(config, client_for(config), rpc_url)
    if market is None:
        fail(f"{nothing}: {why_not}.", 2)
    return account, market


def faucet_hint(market: Any, otherwise: str) -> str:
    """What to do about missing tokens or gas: the faucet where the market's dev chain has one."""
    if market.info.faucet:
        return "This market runs a dev chain with a faucet: run `gridbid-agent faucet` for test tokens and gas"
    return f"{otherwise} (the faucet, `gridbid-agent faucet`, runs only on a market's dev chain, not on this one)"

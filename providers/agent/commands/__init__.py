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

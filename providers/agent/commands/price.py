from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING

import click

from providers.agent.commands import fail, option

if TYPE_CHECKING:
    from providers.agent.config import PricingRule


@click.group("price")
def command() -> None:
    """Pricing per GPU model: fixed, or a floor plus a premium that rises with utilisation."""


@command.command("set")
@click.argument("gpu_model")
@option("--fixed", default=None, help="Fixed price per GPU-hour, e.g. 2.50.")
@option("--floor", default=None, help="Lowest price per GPU-hour (with --premium).")
@option("--premium", default="0", help="Added at full utilisation.")
@option("--exponent", type=float, default=1.0, show_default=True, help="Premium x utilisation**exponent.")
@option("--min-duration", type=int, default=60, show_default=True, help="Seconds.")
@option("--max-duration", type=int, default=30 * 24 * 3600, show_default=True, help="Seconds.")
@option("--spot/--no-spot", default=True, show_default=True, help="Allow spot (preemptible) bids.")
@option("--lend/--no-lend", default=False, show_default=True, help="Lend the GPUs while you do not need them: sold to spot bids only, taken back with `gridbid-agent reclaim`.")
@option("--reclaim-hours", default="", help="With --lend: the UTC hours you take them back every day, e.g. 08-20 or 22-06,12-13.")
@option("--reclaim-queue", default="", help="With --lend: a command printing your own queue's depth (e.g. 'redis-cli llen jobs'); the daemon takes the GPUs back when it runs deep.")
@option("--reclaim-above", type=float, default=0.0, help="With --reclaim-queue: take them back when the depth is above this.")
@option("--release-below", type=float, default=None, help="With --reclaim-queue: lend them again at or below this depth (default: half of --reclaim-above).")
@option("--release-after", type=float, default=300.0, show_default=True, help="With --reclaim-queue: ... held this many seconds.")
@option("--from", "available_from", default="", help="Sell from this time on (ISO 8601 with a zone, e.g. 2026-12-14T08:00Z); default: now.")
@option("--until", "available_until", default="", help="Sell until this time (ISO 8601 with a zone); default: no end.")
@option("--publish/--no-publish", default=True, show_default=True, help="Publish the offers now.")
@click.pass_context
def set_(ctx: click.Context, gpu_model: str, fixed: str | None, floor: str | None, premium: str, exponent: float, min_duration: int, max_duration: int, spot: bool, lend: bool, reclaim_hours: str, reclaim_queue: str, reclaim_above: float, release_below: float | None, release_after: float, available_from: str, available_until: str, publish: bool) -> None:
    """Set the pricing rule for GPU_MODEL (a catalogue id)."""
    from providers import catalogue
    from providers.agent.commands import home_of, load
    from providers.agent.config import PricingRule, save_config
    from providers.agent.pricing import PricingError, parse_amount, validate_rule

    if gpu_model not in catalogue.gpu_models():
        fail(f"{gpu_model!r} is not a catalogue model id (see `gridbid-agent detect --list-models`)", 2)
    if (fixed is None) == (floor is None):
        fail("Give either --fixed PRICE or --floor PRICE [--premium AMOUNT].", 2)
    from providers.agent.config import moment

    try:
        for text, name in ((available_from, "--from"), (available_until, "--until")):
            moment(text, name)  # worded as the options are; the rule's check below names the config's keys
    except ValueError as exc:
        fail(str(exc), 2)
    try:
        lent = {"reclaim_hours": reclaim_hours, "reclaim_queue_command": reclaim_queue, "reclaim_queue_above": reclaim_above,
                "release_queue_below": release_below, "release_after_s": release_after,
                "available_from": available_from, "available_until": available_until}
        if fixed is not None:
            rule = PricingRule(gpu_model, "fixed", parse_amount(fixed), 0, 1.0, min_duration, max_duration, spot, lend, **lent)
        else:
            rule = PricingRule(gpu_model, "utilisation", parse_amount(floor), parse_amount(premium), exponent,  # type: ignore[arg-type]
                               min_duration, max_duration, spot, lend, **lent)
        validate_rule(rule)
        if rule.available_until and datetime.fromisoformat(rule.available_until) <= datetime.now(UTC):
            raise PricingError(f"{gpu_model}: --until {available_until} has passed: the offer would never sell")
    except PricingError as exc:
        fail(str(exc), 2)
    config = load(ctx)
    config.pricing = [r for r in config.pricing if r.gpu_model != gpu_model] + [rule]
    save_config(home_of(ctx), config)
    click.echo(f"Pricing for {gpu_model} saved.")
    if publish:
        ctx.invoke(sync)


def lent_terms(r: PricingRule) -> str:
    """How a rule lends its GPUs, in a few words."""
    if not r.reclaimable:
        return "no"
    back = []
    if r.reclaim_hours:
        back.append(f"{r.reclaim_hours} UTC")
    if r.reclaim_queue_command:
        back.append(f"queue > {r.reclaim_queue_above:g} (again <= {r.release_mark:g} for {r.release_after_s:g} s)")
    return "taken back " + " and ".join(back) if back else "yes"


@command.command("remove")
@click.argument("gpu_model")
@option("--publish/--no-publish", default=True, show_default=True, help="Withdraw the offer now.")
@click.pass_context
def remove(ctx: click.Context, gpu_model: str, publish: bool) -> None:
    """Stop selling GPU_MODEL."""
    from providers.agent.commands import home_of, load
    from providers.agent.config import save_config

    config = load(ctx)
    config.pricing = [r for r in config.pricing if r.gpu_model != gpu_model]
    save_config(home_of(ctx), config)
    if publish:
        ctx.invoke(sync)


@command.command("show")
@click.pass_context
def show(ctx: click.Context) -> None:
    """Show the pricing rules and what each asks now."""
    from rich.table import Table

    from providers.agent.commands import console, load
    from providers.agent.pricing import ask_price, format_amount, window_text

    config = load(ctx)
    t = Table("GPU model", "kind", "floor / price", "premium", "ask idle", "ask full", "duration", "spot", "lent", "sells", title="Pricing (per GPU-hour)")
    for r in config.pricing:
        t.add_row(r.gpu_model, r.kind, format_amount(r.price), format_amount(r.premium), format_amount(ask_price(r, 0)), format_amount(ask_price(r, 1)), f"{r.min_duration_s}-{r.max_duration_s}s", "yes" if r.spot_allowed else "no",
                  lent_terms(r), window_text(r))
    console().print(t)


@command.command("sync")
@click.pass_context
def sync(ctx: click.Context) -> None:
    """Publish, reprice or withdraw offers so they match the rules and the GPUs."""
    from providers.agent.commands import client_for, console, load, market_call
    from providers.agent.inventory import detect
    from providers.agent.offers import offers_sync

    config = load(ctx)
    if not config.machine_id:
        fail("Register the machine first: `gridbid-agent register`.", 2)
    client = client_for(config)
    actions = market_call(lambda: offers_sync(client, config, detect(config.inventory_file)))
    out = console()
    for a in actions:
        out.print(f"  {a.describe()}")
    out.print(f"Offers in step ({len(actions)} change(s)).")

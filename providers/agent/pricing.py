"""Pricing policy: pure functions from a rule and the machine's load to an ask.

A rule is either a fixed price per GPU-hour or a floor plus a premium that rises
with the machine's utilisation (GPUs taken by trades / GPUs offered), so a busy
machine asks more for its last free cards. `plan_offers` compares what the
rules want with the live offers and says what to publish, reprice or withdraw.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from contracts import hours
from providers.agent.config import PricingRule, moment, window_of

TOKEN_DECIMALS = 6


class PricingError(ValueError):
    pass


def parse_amount(text: str) -> int:
    """'2.50' -> 2_500_000 token base units (6 decimals)."""
    try:
        value = Decimal(str(text).strip())
    except InvalidOperation:
        raise PricingError(f"{text!r} is not an amount; write it like 2.50") from None
    if value < 0:
        raise PricingError(f"{text!r} is negative")
    units = value * 10**TOKEN_DECIMALS
    if units != units.to_integral_value():
        raise PricingError(f"{text!r} has more than {TOKEN_DECIMALS} decimals")
    return int(units)


def format_amount(units: int) -> str:
    return f"{Decimal(units) / 10**TOKEN_DECIMALS:.2f}"


def validate_rule(rule: PricingRule) -> PricingRule:
    if rule.kind not in ("fixed", "utilisation"):
        raise PricingError(f"pricing kind must be 'fixed' or 'utilisation', not {rule.kind!r}")
    if rule.price <= 0:
        raise PricingError(f"{rule.gpu_model}: the price (or floor) must be above zero")
    if rule.kind == "fixed" and rule.premium:
        raise PricingError(f"{rule.gpu_model}: a fixed price takes no premium")
    if rule.premium < 0 or rule.exponent <= 0:
        raise PricingError(f"{rule.gpu_model}: premium must be >= 0 and exponent > 0")
    if not 60 <= rule.min_duration_s <= rule.max_duration_s:
        raise PricingError(f"{rule.gpu_model}: need 60 <= min_duration_s <= max_duration_s")
    if rule.reclaimable and not rule.spot_allowed:
        raise PricingError(f"{rule.gpu_model}: lent GPUs (--lend) sell to spot bids only, so they must allow spot (drop --no-spot)")
    if not isinstance(rule.reclaim_hours, str):
        raise PricingError(f"{rule.gpu_model}: reclaim_hours is text, like \"08-20\" (UTC hours)")
    try:
        mask = hours.parse(rule.reclaim_hours)
    except hours.HoursError as exc:
        raise PricingError(f"{rule.gpu_model}: reclaim hours: {exc}") from None
    if mask and not rule.reclaimable:
        raise PricingError(f"{rule.gpu_model}: only lent GPUs (--lend) have reclaim hours")
    if mask == hours.ALL:
        raise PricingError(f"{rule.gpu_model}: every hour reclaimed means never lent; drop --lend instead")
    rule.reclaim_hours = hours.text(mask)
    if rule.reclaim_queue_command:
        if not rule.reclaimable:
            raise PricingError(f"{rule.gpu_model}: only lent GPUs (--lend) are taken back by a queue")
        try:
            words = shlex.split(rule.reclaim_queue_command)
        except ValueError as exc:
            raise PricingError(f"{rule.gpu_model}: the queue command cannot be split into words: {exc}") from None
        if not words:
            raise PricingError(f"{rule.gpu_model}: the queue command is empty")
        if not rule.reclaim_queue_above > 0:
            raise PricingError(f"{rule.gpu_model}: with a queue command, give --reclaim-above N (> 0): the depth that takes the GPUs back")
        below = rule.release_queue_below
        if below is not None and not 0 <= below < rule.reclaim_queue_above:
            raise PricingError(f"{rule.gpu_model}: --release-below must be >= 0 and below --reclaim-above ({rule.reclaim_queue_above:g})")
        if not 0 <= rule.release_after_s <= 86400:
            raise PricingError(f"{rule.gpu_model}: --release-after must be 0-86400 seconds")
    elif rule.reclaim_queue_above or rule.release_queue_below is not None:
        raise PricingError(f"{rule.gpu_model}: --reclaim-above and --release-below need --reclaim-queue CMD: the command that prints the queue's depth")
    try:
        start, end = window_of(rule)
    except ValueError as exc:
        raise PricingError(f"{rule.gpu_model}: {exc}") from None
    rule.available_from = start.isoformat() if start else ""
    rule.available_until = end.isoformat() if end else ""
    return rule


def window_text(rule: PricingRule) -> str:
    """The window a rule sells in, in a few words."""
    start, end = window_of(rule)
    if start is None and end is None:
        return "always"
    fmt = "%Y-%m-%d %H:%M UTC"
    return f"{'now' if start is None else start.strftime(fmt)} to {'no end' if end is None else end.strftime(fmt)}"


def ask_price(rule: PricingRule, utilisation: float) -> int:
    """The ask for one GPU-hour at `utilisation` (0-1, clamped)."""
    if rule.kind == "fixed":
        return rule.price
    u = min(1.0, max(0.0, utilisation))
    return rule.price + round(rule.premium * u**rule.exponent)


def machine_utilisation(offers: Iterable[Mapping[str, Any]]) -> float:
    """Share of offered GPUs that trades hold, across the machine's live offers."""
    live = [o for o in offers if o.get("state") in ("open", "paused")]
    total = sum(int(o["gpus"]) for o in live)
    taken = sum(int(o["gpus"]) - int(o["gpus_free"]) for o in live)
    return taken / total if total else 0.0


@dataclass(frozen=True)
class OfferAction:
    kind: str  # publish, update, withdraw
    gpu_model: str
    offer_id: int | None = None
    changes: Mapping[str, Any] | None = None

    def describe(self) -> str:
        what = ", ".join(f"{k}={v}" for k, v in (self.changes or {}).items())
        ident = f" #{self.offer_id}" if self.offer_id else ""
        return f"{self.kind} {self.gpu_model}{ident} {what}".strip()


def plan_offers(rules: Iterable[PricingRule], installed: Mapping[str, int], offers: Iterable[Mapping[str, Any]]) -> list[OfferAction]:
    """What to do so the live offers match the rules and the installed GPUs.

    `installed` counts this machine's GPUs per catalogue model; `offers` are the
    machine's offers as the market returns them. Offers stay live while trades
    hold GPUs (their `gpus_free` falls); only the ask and the size change.
    """
    offers = list(offers)
    live = {o["gpu_model"]: o for o in offers if o.get("state") in ("open", "paused")}
    util = machine_utilisation(offers)
    actions: list[OfferAction] = []
    wanted = {r.gpu_model: r for r in rules}
    for model, rule in sorted(wanted.items()):
        count = installed.get(model, 0)
        if count == 0:
            continue
        terms = {
            "price": ask_price(rule, util),
            "min_duration_s": rule.min_duration_s,
            "max_duration_s": rule.max_duration_s,
            "spot_allowed": rule.spot_allowed,
            "reclaimable": rule.reclaimable,
            "reclaim_hours": hours.text(hours.parse(rule.reclaim_hours)),
        }
        start, end = window_of(rule)
        window = {"available_until": end.isoformat() if end else None}
        if start is not None:  # none: it sells from when it is published, and that stays
            window["available_from"] = start.isoformat()
        offer = live.get(model)
        if offer is None:
            actions.append(OfferAction("publish", model, None, {"gpus": count, **terms, **window}))
            continue
        # a market that predates lending says nothing of it: not lent, no reclaim hours
        unsaid = {"reclaimable": False, "reclaim_hours": ""}
        changes = {k: v for k, v in terms.items() if offer.get(k, unsaid.get(k)) != v}
        # the market writes times its own way ("...Z", microseconds): compared as times
        changes.update({k: v for k, v in window.items() if moment(offer.get(k) or "", k) != moment(v or "", k)})
        if int(offer["gpus"]) != count:
            changes["gpus"] = count
        if changes:
            actions.append(OfferAction("update", model, int(offer["id"]), changes))
    for model, offer in sorted(live.items()):
        if model not in wanted or installed.get(model, 0) == 0:
            actions.append(OfferAction("withdraw", model, int(offer["id"])))
    return actions

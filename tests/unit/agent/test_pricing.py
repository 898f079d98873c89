"""Pricing policy: fixed and utilisation-based asks, and keeping offers in step."""

from __future__ import annotations

import pytest

from providers.agent.config import PricingRule
from providers.agent.pricing import (
    PricingError,
    ask_price,
    format_amount,
    machine_utilisation,
    parse_amount,
    plan_offers,
    validate_rule,
)


def test_amounts_parse_to_token_base_units():
    assert parse_amount("2.50") == 2_500_000
    assert format_amount(2_500_000) == "2.50"
    with pytest.raises(PricingError):
        parse_amount("0.0000001")
    with pytest.raises(PricingError):
        parse_amount("cheap")


def test_fixed_price_ignores_utilisation():
    rule = PricingRule("H100-SXM-80GB", price=2_000_000)
    assert ask_price(rule, 0.0) == ask_price(rule, 1.0) == 2_000_000


def test_premium_rises_with_utilisation_from_the_floor():
    rule = PricingRule("H100-SXM-80GB", kind="utilisation", price=2_000_000, premium=1_000_000, exponent=2)
    assert ask_price(rule, 0) == 2_000_000
    assert ask_price(rule, 0.5) == 2_250_000
    assert ask_price(rule, 1) == 3_000_000
    assert ask_price(rule, 7) == 3_000_000  # clamped


def test_bad_rules_are_refused():
    with pytest.raises(PricingError):
        validate_rule(PricingRule("X", kind="auction", price=1))
    with pytest.raises(PricingError):
        validate_rule(PricingRule("X", price=0))
    with pytest.raises(PricingError):
        validate_rule(PricingRule("X", price=1, min_duration_s=3600, max_duration_s=60))


def test_utilisation_counts_gpus_held_by_trades_across_live_offers():
    offers = [{"state": "open", "gpus": 8, "gpus_free": 2}, {"state": "open", "gpus": 4, "gpus_free": 4}, {"state": "withdrawn", "gpus": 8, "gpus_free": 0}]
    assert machine_utilisation(offers) == pytest.approx(6 / 12)


def test_plan_publishes_missing_offers_reprices_busy_ones_and_withdraws_dropped_models():
    rules = [PricingRule("H100-SXM-80GB", kind="utilisation", price=2_000_000, premium=1_000_000), PricingRule("L4-24GB", price=300_000)]
    installed = {"H100-SXM-80GB": 8, "L4-24GB": 2}
    offers = [
        {"id": 5, "gpu_model": "H100-SXM-80GB", "state": "open", "gpus": 8, "gpus_free": 4, "price": 2_000_000, "min_duration_s": 60, "max_duration_s": 30 * 24 * 3600, "spot_allowed": True},
        {"id": 6, "gpu_model": "A100-SXM-80GB", "state": "open", "gpus": 2, "gpus_free": 2, "price": 1, "min_duration_s": 60, "max_duration_s": 60, "spot_allowed": True},
    ]
    actions = {a.gpu_model: a for a in plan_offers(rules, installed, offers)}
    util = 4 / 10
    assert actions["H100-SXM-80GB"].kind == "update" and actions["H100-SXM-80GB"].changes == {"price": 2_000_000 + round(1_000_000 * util)}
    assert actions["L4-24GB"].kind == "publish" and actions["L4-24GB"].changes["gpus"] == 2
    assert actions["A100-SXM-80GB"].kind == "withdraw" and actions["A100-SXM-80GB"].offer_id == 6


def test_plan_is_empty_when_offers_already_match():
    rules = [PricingRule("L4-24GB", price=300_000)]
    offers = [{"id": 1, "gpu_model": "L4-24GB", "state": "open", "gpus": 2, "gpus_free": 2, "price": 300_000, "min_duration_s": 60, "max_duration_s": 30 * 24 * 3600, "spot_allowed": True}]
    assert plan_offers(rules, {"L4-24GB": 2}, offers) == []


def test_a_rule_sells_in_its_window_and_the_plan_moves_an_offers_window_to_it():
    """Offers state the windows in which they sell (issue 40): published with the rule's, moved
    when the rule's changes, and left alone when the market writes the same time its own way."""
    from providers.agent.pricing import validate_rule, window_text

    rule = validate_rule(PricingRule("L4-24GB", price=300_000, available_from="2026-12-14T09:00+01:00", available_until="2026-12-18T18:00Z"))
    assert (rule.available_from, rule.available_until) == ("2026-12-14T08:00:00+00:00", "2026-12-18T18:00:00+00:00")  # in UTC
    assert window_text(rule) == "2026-12-14 08:00 UTC to 2026-12-18 18:00 UTC"
    [publish] = plan_offers([rule], {"L4-24GB": 2}, [])
    assert publish.changes is not None
    assert (publish.changes["available_from"], publish.changes["available_until"]) == (rule.available_from, rule.available_until)
    live = {"id": 1, "gpu_model": "L4-24GB", "state": "open", "gpus": 2, "gpus_free": 2, "price": 300_000, "min_duration_s": 60,
            "max_duration_s": 30 * 24 * 3600, "spot_allowed": True, "available_from": "2026-12-14T08:00:00Z", "available_until": "2026-12-18T18:00:00Z"}
    assert plan_offers([rule], {"L4-24GB": 2}, [live]) == []
    later = validate_rule(PricingRule("L4-24GB", price=300_000, available_from="2026-12-14T08:00Z", available_until="2026-12-19T18:00Z"))
    [move] = plan_offers([later], {"L4-24GB": 2}, [live])
    assert move.kind == "update" and move.changes == {"available_until": "2026-12-19T18:00:00+00:00"}
    always = validate_rule(PricingRule("L4-24GB", price=300_000))
    assert window_text(always) == "always"
    [open_ended] = plan_offers([always], {"L4-24GB": 2}, [live])
    assert open_ended.changes == {"available_until": None}  # no end: its start stays when it was published


@pytest.mark.parametrize("start, end, says", [
    ("tomorrow", "", "is not a time"),
    ("2026-12-14T08:00", "", "has no zone"),
    ("2026-12-14T08:00Z", "2026-12-14T07:00Z", "must be after available_from"),
    ("", 20261214, "is text"),
])
def test_a_window_that_is_not_one_is_refused_saying_what_to_write(start, end, says):
    from providers.agent.config import ConfigError, config_from_dict
    from providers.agent.pricing import PricingError, validate_rule

    with pytest.raises(PricingError, match=says):
        validate_rule(PricingRule("L4-24GB", price=300_000, available_from=start, available_until=end))
    raw = {"market_url": "http://127.0.0.1:8000", "token": "gb_x", "machine_name": "m",
           "pricing": [{"gpu_model": "L4-24GB", "price": 300_000, "available_from": start, "available_until": end}]}
    with pytest.raises(ConfigError, match=f"pricing\\[0\\].*{says}.*gridbid-agent price set"):
        config_from_dict(raw)

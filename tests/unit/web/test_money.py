"""Money and moments as a person reads them: one format on every page, in messages and in
the engine's explanations."""

from __future__ import annotations

import datetime as dt

import pytest

from market import money
from market.engine import explain
from market.templatetags import gridbid


@pytest.mark.parametrize("units,text", [
    (2_260_000, "2.26 USDC/GPU-h"), (2_315_000, "2.315 USDC/GPU-h"), (1, "0.000001 USDC/GPU-h"),
    (0, "0.00 USDC/GPU-h"), (1_234_500_000, "1,234.50 USDC/GPU-h"), (-400_000, "-0.40 USDC/GPU-h"),
])
def test_a_price_reads_in_usdc_per_gpu_hour_with_every_digit_it_has(units, text):
    assert money.price(units) == text
    assert gridbid.price(units) == text


@pytest.mark.parametrize("units", [0, 1, 10, 99_999, 2_400_000, 2_315_500, 123_456_789_012, -5])
def test_the_engine_writes_prices_exactly_as_the_pages_do(units):
    assert explain.money(units) == money.price(units)


def test_amounts_carry_their_unit_and_nothing_shows_as_a_dash():
    assert money.usdc(12_500_000) == "12.50 USDC"
    assert gridbid.usdc(50_000_000_000) == "50,000.00 USDC"
    assert gridbid.money(12_500_000) == "12.50"
    assert gridbid.price(None) == gridbid.usdc("") == "—"


def test_price_per_compute_unit_has_enough_digits_to_tell_close_offers_apart():
    a, b = gridbid.per_cu(2_260_000, 3.96), gridbid.per_cu(2_280_000, 3.96)
    assert a == "0.5707 USDC/CU-h" and b == "0.5758 USDC/CU-h"
    assert gridbid.per_cu(2_260_000, 0) == "—"


@pytest.mark.parametrize("text,units", [
    ("2.50", 2_500_000), ("2.5", 2_500_000), ("2", 2_000_000), (" 2.50 ", 2_500_000), ("$2.50", 2_500_000),
    ("2,50", 2_500_000), ("1,000", 1_000_000_000), ("2.50 USDC", 2_500_000), ("0.000001", 1), ("0", 0),
])
def test_typed_amounts_are_read_as_usdc(text, units):
    assert money.parse_usdc(text) == units


@pytest.mark.parametrize("text,says", [
    ("abc", "not a number of USDC"), ("", "not a number of USDC"), ("-1", "0 or more"), ("NaN", "0 or more"),
    ("inf", "0 or more"), ("0.0000001", "more than 6 decimals"), ("1e40", "too large"),
])
def test_an_amount_that_cannot_be_read_says_what_to_type(text, says):
    with pytest.raises(ValueError, match=says):
        money.parse_usdc(text, what="max price")


def test_moments_have_one_format_with_a_zone_whatever_they_come_as():
    at = dt.datetime(2026, 12, 4, 13, 25, 7, tzinfo=dt.UTC)
    html = str(gridbid.when(at))
    assert html == '<time class="ts" datetime="2026-12-04T13:25:07Z">2026-12-04 13:25:07 UTC</time>'
    assert str(gridbid.when(int(at.timestamp()))) == html  # a Unix time from the chain
    assert str(gridbid.when("2026-12-04T13:25:07+00:00")) == html
    assert str(gridbid.when(None, "never")) == "never"

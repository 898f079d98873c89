"""The rounds page's bar of where a round's clearing time went."""

from __future__ import annotations

import re

from market.engine import STAGES
from market.templatetags.gridbid import STAGE_COLOURS, stage_bar, stage_legend


def test_every_engine_stage_has_a_colour_in_the_engines_order() -> None:
    assert tuple(STAGE_COLOURS) == STAGES


def test_each_stage_is_a_segment_as_wide_as_its_share_in_engine_order() -> None:
    svg = str(stage_bar({"explain": 10.0, "validate": 30, "on_demand": 15.0, "on_demand bound": 45.0}, width=100))
    rects = re.findall(r'<rect x="([\d.]+)" y="0" width="([\d.]+)" height="10" fill="(#[0-9a-f]{6})"/>', svg)
    assert [(float(x), float(w), c) for x, w, c in rects] == [
        (0.0, 30.0, STAGE_COLOURS["validate"]),
        (30.0, 15.0, STAGE_COLOURS["on_demand"]),
        (45.0, 45.0, STAGE_COLOURS["on_demand bound"]),
        (90.0, 10.0, STAGE_COLOURS["explain"]),
    ]
    assert 'aria-label="validate 30 ms, on-demand 15 ms, on-demand&#x27;s LP bound 45 ms, explain 10 ms"' in svg


def test_no_or_unreadable_timings_draw_nothing_and_never_raise() -> None:
    for bad in (None, [], "fast", {}, {"validate": 0}, {"validate": "12"}, {"validate": True},
                {"validate": 10**400}, {"validate": -5.0}, {"validate": float("nan")}, {"mystery": 5.0}):
        assert str(stage_bar(bad)) == "", bad


def test_a_bad_value_beside_good_ones_is_left_out() -> None:
    svg = str(stage_bar({"validate": 10**400, "market": -3, "explain": 5.0}, width=50))
    assert svg.count("<rect") == 1 and 'width="50.00"' in svg


def test_keys_the_engine_does_not_name_never_reach_the_page() -> None:
    svg = str(stage_bar({"validate": 1.0, '<script>alert(1)</script> bound': 5.0}))
    assert "script" not in svg and svg.count("<rect") == 1


def test_the_legend_names_every_colour() -> None:
    legend = str(stage_legend())
    assert all(c in legend for c in STAGE_COLOURS.values()) and "on-demand&#x27;s LP bound" in legend

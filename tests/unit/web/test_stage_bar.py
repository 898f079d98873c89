"""The rounds page's bar of where a round's clearing time went."""

from __future__ import annotations

import re

from market.templatetags.gridbid import STAGE_COLOURS, stage_bar, stage_legend


def test_each_stage_is_a_segment_as_wide_as_its_share_in_engine_order() -> None:
    svg = str(stage_bar({"explain": 10.0, "validate": 30.0, "on_demand": 60.0, "on_demand bound": 45.0}, width=100))
    rects = re.findall(r'<rect x="([\d.]+)" y="0" width="([\d.]+)" height="10" fill="(#[0-9a-f]{6})"/>', svg)
    assert [(float(x), float(w), c) for x, w, c in rects] == [
        (0.0, 30.0, STAGE_COLOURS["validate"]),
        (30.0, 60.0, STAGE_COLOURS["on_demand"]),
        (90.0, 10.0, STAGE_COLOURS["explain"]),
    ]
    assert "validate 30 ms, on-demand 60 ms, explain 10 ms (of which LP bounds: on-demand bound 45 ms)" in svg


def test_no_or_malformed_timings_draw_nothing() -> None:
    for bad in (None, [], "fast", {}, {"validate": 0}, {"validate": "12"}, {"mystery": 5.0}):
        assert str(stage_bar(bad)) == ""  # type: ignore[arg-type]


def test_the_legend_names_every_colour() -> None:
    legend = str(stage_legend())
    assert all(c in legend for c in STAGE_COLOURS.values()) and "on-demand" in legend

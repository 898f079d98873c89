"""Carbon priced at the hours a job runs (issue 37): each region's hourly forecast,
averaged over the bid's expected span, worked out by hand."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from market.engine import DEFAULT_WEIGHTS, EngineInputError, Region, clear_round
from market.engine.market import carbon_means
from market.engine.validate import validate
from tests.unit.engine.engine_builders import NOW, REGIONS, bid, offer, round_of

HOUR = 3600


def test_the_mean_over_a_span_weights_each_hour_by_what_it_covers() -> None:
    start = NOW - NOW % HOUR + 1800  # half past the hour
    regions = (Region("flat", 290.0), Region("swing", 380.0, (100.0, 300.0, 500.0)))
    got = carbon_means(regions, start, [HOUR, 2 * HOUR, 4 * HOUR, 900])
    assert got[:, 0].tolist() == [290.0] * 4, "no forecast: the constant"
    assert got[0, 1] == pytest.approx((1800 * 100 + 1800 * 300) / 3600)  # 200
    assert got[1, 1] == pytest.approx((1800 * 100 + 3600 * 300 + 1800 * 500) / 7200)  # 300
    # past the forecast's end, its last hour: 500 from hour 2 on
    assert got[2, 1] == pytest.approx((1800 * 100 + 3600 * 300 + 3600 * 500 + 5400 * 500) / 14400)  # 400
    assert got[3, 1] == pytest.approx(100.0)


def test_without_forecasts_every_bid_sees_the_constants_and_nothing_is_copied() -> None:
    got = carbon_means(REGIONS, NOW, [60] * 1000)
    assert got.shape == (1000, 3) and got.base is not None and not got.flags.writeable
    assert np.array_equal(got[7], [r.carbon_g_per_kwh for r in REGIONS])


def test_a_short_job_avoids_a_dirty_hour_that_a_long_job_averages_away() -> None:
    # us-east's grid is dirty for the next half hour (900 g/kWh), then clean (50) for the
    # day; eu-west is 290 throughout. Same asks; a carbon-minded buyer (1 USD a kg).
    hourly = (900.0,) + (50.0,) * 24
    regions = tuple(dataclasses.replace(r, carbon_hourly=hourly) if r.id == "us-east" else r for r in REGIONS)
    heavy = dataclasses.replace(DEFAULT_WEIGHTS, carbon_per_kg=1_000_000.0)
    offers = [offer(1, region="us-east", gpus=1), offer(2, region="eu-west", gpus=1)]
    now = NOW - NOW % HOUR + 1800
    short = bid(1, duration_s=8 * HOUR, runtime_p50_s=1200, weights=heavy)  # booked 8 h, expected to run 20 min
    long = bid(2, duration_s=8 * HOUR, weights=heavy)  # no prediction: its 8 h
    for b, region in ((short, "eu-west"), (long, "us-east")):
        inp = dataclasses.replace(round_of(offers, [b]), now=now, regions=regions)
        assert [t.offer_id for t in clear_round(inp).trades] == [1 if region == "us-east" else 2], region
    # 20 min at 900 (us-east) is dearer than at 290; 8 h at (1800 x 900 + 27000 x 50) / 28800 = 103 is cheaper
    means = carbon_means(regions, now, [1200, 8 * HOUR])
    east = [r.id for r in regions].index("us-east")
    assert means[0, east] == 900.0 and means[1, east] == pytest.approx((1800 * 900 + 27000 * 50) / 28800)


@pytest.mark.parametrize(("hourly", "says"), [((float("nan"),), "carbon_hourly[0]"), ((-1.0,), "carbon_hourly[0]"),
                                              ((1.0,) * 400, "at most 336")])
def test_a_bad_forecast_is_refused_with_its_field(hourly: tuple[float, ...], says: str) -> None:
    regions = tuple(dataclasses.replace(r, carbon_hourly=hourly) if r.id == "us-east" else r for r in REGIONS)
    with pytest.raises(EngineInputError, match=says.replace("[", r"\[")):
        validate(dataclasses.replace(round_of([offer(1)], [bid(1)]), regions=regions))


def test_a_round_with_forecasts_replays_from_its_stored_inputs() -> None:
    from market.engine import serialize

    regions = tuple(dataclasses.replace(r, carbon_hourly=(100.0, 200.5)) for r in REGIONS)
    inp = dataclasses.replace(round_of([offer(1)], [bid(1, runtime_p50_s=600, runtime_p90_s=900, klass="spot")]), regions=regions)
    again = serialize.input_from_dict(serialize.input_to_dict(inp))
    assert again == inp
    assert serialize.digest(serialize.result_to_dict(clear_round(again))) == serialize.digest(serialize.result_to_dict(clear_round(inp)))


def test_a_round_with_forecasts_and_no_bid_clears_empty() -> None:
    # every bid set aside (the clean-clone run: a round whose only bid had lost its cover failed)
    regions = tuple(dataclasses.replace(r, carbon_hourly=(100.0, 200.0)) for r in REGIONS)
    assert carbon_means(regions, NOW, []).shape == (0, len(REGIONS))
    res = clear_round(dataclasses.replace(round_of([offer(1)], []), regions=regions))
    assert res.trades == () and res.unmatched == ()

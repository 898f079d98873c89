"""Backfill (issue 36): a round may place a short spot job on GPUs that a future taking
(the offer's window closing) will claim, when its predicted p90 ends before it."""

from __future__ import annotations

import pytest

from market.engine import EngineInputError, clear_round
from tests.unit.engine.engine_builders import NOW, bid, offer, round_of

HOUR = 3600


def test_a_short_job_backfills_before_the_window_closes_and_a_long_one_does_not() -> None:
    # 4 GPUs until two hours from now; both jobs book 6 h (buyers round up), as spot
    gap = offer(1, gpus=4, available_until=NOW + 2 * HOUR)
    short = bid(1, gpus=4, klass="spot", duration_s=6 * HOUR, runtime_p90_s=HOUR)  # 9 in 10 like it ended within 1 h
    long = bid(2, gpus=4, klass="spot", duration_s=6 * HOUR, runtime_p90_s=5 * HOUR, max_price=3_500_000)
    res = clear_round(round_of([gap], [short, long]))
    assert [t.bid_id for t in res.trades] == [1], "the long job's p90 runs past the window: it is not placed, though it bids more"
    t = res.trades[0]
    assert t.backfill_until == NOW + 2 * HOUR and t.duration_s == 6 * HOUR
    assert "backfilled: the offer's window closes in 2.0 h, before the 6.0 h bought" in t.reason
    why = {u.bid_id: u.reasons for u in res.unmatched}
    assert any("time" in r or "window" in r or "duration" in r for r in why[2]), why[2]


def test_without_a_prediction_or_above_spot_a_job_must_fit_the_window_whole() -> None:
    gap = offer(1, gpus=8, available_until=NOW + 2 * HOUR)
    unknown = bid(1, gpus=2, klass="spot", duration_s=6 * HOUR)  # no prediction: its booking is all we know
    on_demand = bid(2, gpus=2, klass="on_demand", duration_s=6 * HOUR, runtime_p90_s=HOUR)  # not preemptible
    fits = bid(3, gpus=2, klass="on_demand", duration_s=2 * HOUR)
    res = clear_round(round_of([gap], [unknown, on_demand, fits]))
    assert [(t.bid_id, t.backfill_until) for t in res.trades] == [(3, None)]


def test_an_offer_with_no_window_end_is_no_backfill() -> None:
    res = clear_round(round_of([offer(1, gpus=8)], [bid(1, klass="spot", duration_s=6 * HOUR, runtime_p90_s=HOUR)]))
    assert [(t.bid_id, t.backfill_until) for t in res.trades] == [(1, None)]
    assert "backfilled" not in res.trades[0].reason


@pytest.mark.parametrize("bad", [0, -5, 2.5, True])
def test_a_bad_p90_is_refused_with_its_field(bad: object) -> None:
    from market.engine.validate import validate

    with pytest.raises(EngineInputError, match="runtime_p90_s"):
        validate(round_of([offer(1)], [bid(1, klass="spot", runtime_p90_s=bad)]))  # type: ignore[arg-type]

"""The runtime predictor (issue 36): quantiles per key, shrunk to broader keys."""

from __future__ import annotations

import math

import numpy as np
import pytest

from market.runtime import (
    LEVELS,
    MIN_JOBS,
    SHRINK_K,
    MeanModel,
    Model,
    Record,
    _fit,
    fit,
    score,
    span,
    workload,
)


def rec(
    buyer: str = "b1",
    work: str = "img train",
    gpus: int = 1,
    model: str = "H100",
    runtime: float = 600.0,
) -> Record:
    return Record(buyer=buyer, workload=work, gpus=gpus, model=model, runtime_s=runtime)


def market(n: int = 50, runtime: float = 600.0) -> list[Record]:
    """``n`` jobs of other buyers, each ``runtime`` seconds."""
    return [rec(buyer=f"other{i % 7}", work=f"w{i % 3}", runtime=runtime) for i in range(n)]


def test_a_buyers_repeated_job_is_predicted_from_its_own_runs() -> None:
    mine = [rec(runtime=3600 * f) for f in (0.9, 1.0, 1.1) * 8]  # 24 runs of about an hour
    model = fit(market() + mine)
    p = model.predict(buyer="b1", workload="img train", gpus=1, model="H100")
    assert p is not None and p.level == len(LEVELS) - 1 and p.jobs == 24
    assert 3000 < p.p50_s < 3900, p
    assert p.p10_s <= 3600 <= p.p90_s
    assert p.p10_s <= p.p50_s <= p.p80_s <= p.p90_s


def test_a_new_buyer_gets_the_markets_figures() -> None:
    model = fit(market(runtime=600))
    p = model.predict(buyer="newcomer", workload="x", gpus=8, model="A100")
    assert p is not None and p.level == 0 and p.jobs == 50
    assert p.p50_s == pytest.approx(600)
    assert p.text() == "jobs like this ran 10 min; 80% finished under 10 min"


def test_one_job_moves_the_estimate_a_shrinkage_step_in_log_space() -> None:
    model = fit([*market(runtime=600), rec(buyer="b2", runtime=6000)])
    p = model.predict(buyer="b2", workload="other work", gpus=1, model="H100")
    assert p is not None and p.level == 1 and p.jobs == 1
    # the market's median (51 jobs, one of them 6000 s) is 600 s; the buyer's one job is 6000 s
    w = 1 / (1 + SHRINK_K)
    assert p.p50_s == pytest.approx(math.exp(w * math.log(6000) + (1 - w) * math.log(600)))


def test_too_few_jobs_in_the_market_predict_nothing() -> None:
    model = fit(market(n=MIN_JOBS - 1))
    assert model.predict(buyer="other1", workload="w1", gpus=1, model="H100") is None
    assert fit([]).predict(buyer="b", workload="w", gpus=1, model=None) is None


def test_a_prediction_never_outruns_the_booking() -> None:
    model = fit(market(runtime=7200))
    p = model.predict(buyer="b", workload="w", gpus=1, model=None, cap_s=3600)
    assert p is not None and p.p90_s == 3600 and p.p50_s == 3600


def test_an_unknown_model_stops_before_the_narrowest_key() -> None:
    model = fit(market() + [rec(runtime=5000)] * 10)
    p = model.predict(buyer="b1", workload="img train", gpus=1, model=None)
    assert p is not None and p.level == 2


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_record_with_a_bad_run_time_is_refused_with_its_value(bad: float) -> None:
    with pytest.raises(ValueError, match="not a finite count of seconds"):
        fit([*market(), rec(runtime=bad)])


def test_the_stored_rows_give_back_the_same_predictions() -> None:
    model = fit(market() + [rec(runtime=3000 + 100 * i) for i in range(9)])
    again = Model.from_rows(model.rows())
    for args in (
        {"buyer": "b1", "workload": "img train", "gpus": 1, "model": "H100"},
        {"buyer": "zz", "workload": "w", "gpus": 2, "model": None},
    ):
        assert again.predict(**args) == model.predict(**args)  # type: ignore[arg-type]
    assert again.jobs == model.jobs == 59


def test_the_interval_covers_about_four_in_five_held_out_jobs() -> None:
    rng = np.random.default_rng(3)

    def draw(n: int) -> list[Record]:
        out = []
        for _ in range(n):
            b = int(rng.integers(0, 20))
            out.append(
                rec(buyer=f"b{b}", work="w", runtime=float(np.exp(rng.normal(6 + b * 0.2, 0.5))))
            )
        return out

    model = fit(draw(4000))
    got = score(model, draw(2000))
    base = score(MeanModel(draw(4000)), draw(2000))
    assert got is not None and base is not None and got.coverage is not None
    assert 0.74 < got.coverage < 0.86, got
    assert got.mape < base.mape  # on skewed run times the median errs by less than the mean


def test_durations_read_as_a_person_says_them() -> None:
    assert [span(s) for s in (45, 720, 3590, 5760, 3 * 86400)] == ["45 s", "12 min", "1.0 h", "1.6 h", "3.0 d"]
    assert workload(" img ", ["python", "t.py"]) == "img python t.py"


def test_calibration_widens_intervals_that_held_too_few_of_the_newest_jobs() -> None:
    # each buyer's early runs took 1,000 s to the second; its newer ones spread by a factor of e
    rng = np.random.default_rng(5)

    def runs(sigma: float, n: int) -> list[Record]:
        return [rec(buyer=f"b{b}", runtime=float(1000 * np.exp(rng.normal(0, sigma)))) for _ in range(n) for b in range(50)]

    history = runs(0.01, 8) + runs(1.0, 2)  # oldest first: the newest fifth has spread
    later = runs(1.0, 4)
    calibrated = score(fit(history), later)
    raw = score(_fit(history), later)
    assert raw is not None and calibrated is not None and raw.coverage is not None and calibrated.coverage is not None
    assert raw.coverage < 0.4 and calibrated.coverage > 0.65, (raw, calibrated)
    model = fit(history)
    assert model.shift[3] > 0.5 > -0.5 > model.shift[0], "p90 moves up and p10 down, in log seconds"
    assert Model.from_rows(model.rows()).shift == model.shift

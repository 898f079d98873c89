"""The runtime predictor scored on a trace (issue 36): chronologically, beside a baseline."""

from __future__ import annotations

import pytest

from market import runtime
from market.simulate import prediction
from market.simulate.trace import Pod

HOUR = 3600.0


def pod(i: int, arrival: float, runtime_s: float, team: int = 0) -> Pod:
    return Pod(id=f"p{i}", arrival=arrival, runtime=runtime_s, gpus=1, gpu_milli=1000, models=(), qos="LS", team=team,
               scheduled_in_trace=True)


def test_a_team_that_always_runs_ten_minutes_is_predicted_exactly_after_the_warmup() -> None:
    pods = [pod(i, i * HOUR, 600.0) for i in range(72)]  # one an hour for three days
    ev = prediction.evaluate(pods, 72 * HOUR)
    assert ev.jobs == 54, "the first quarter of the window only trains"
    assert ev.model is not None and ev.model.mape == pytest.approx(0) and ev.model.coverage == 1.0
    assert ev.baseline is not None and ev.baseline.mape == pytest.approx(0)
    assert ev.as_dict()["model"]["coverage_p10_p90"] == 1.0


def test_no_pod_is_predicted_by_a_fit_that_saw_it_or_a_later_one(monkeypatch: pytest.MonkeyPatch) -> None:
    # each pod's run time is its id in seconds (+100): a fit's records say which pods it saw
    pods = [pod(i, i * 1800.0, 100.0 + i + (30 * HOUR if i % 7 == 0 else 0), team=i % 3) for i in range(150)]
    ends = {p.runtime: p.arrival + p.runtime for p in pods}
    fits: list[list[float]] = []
    real = runtime.fit
    monkeypatch.setattr(runtime, "fit", lambda recs: fits.append([r.runtime_s for r in recs]) or real(recs))
    ev = prediction.evaluate(pods, 150 * 1800.0)
    assert ev.fits == len(fits) > 5
    for k, seen in enumerate(fits):
        at = ev.warmup_s + k * prediction.REFIT_S
        assert all(ends[r] <= at for r in seen), f"fit {k} at {at} s learnt from a pod that ended later"
        assert len(seen) == sum(1 for e in ends.values() if e <= at)


def test_a_bad_refit_period_is_refused() -> None:
    with pytest.raises(ValueError, match="refit_s must be > 0"):
        prediction.evaluate([pod(0, 0, 10)], HOUR, refit_s=0)

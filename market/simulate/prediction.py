"""How well the market's runtime predictor (``market.runtime``, issue 36) does on a trace.

The trace's pods are the market's jobs: the buyer is the pod's team, the workload its QoS
and shape (CPU and GPU share asked for; the trace names no image or command), the GPU count
and the models it may run on. A pod counts as finished at ``arrival + runtime``.

Chronological, as the market refits it: every ``refit_s`` of the window, the predictor is
fitted on the pods finished by then and predicts the pods arriving before the next refit;
never a pod with one that learnt from it or from a later one. The first ``warmup_s`` only
trains (a quarter of a shorter window). Beside it, the baseline the issue names: the key's mean run time (the narrowest key
with jobs). The trace has no requested durations, so "the user's own request" cannot be
a baseline here.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from market import runtime

from .trace import Pod

REFIT_S = 6 * 3600.0
WARMUP_S = 86400.0


def record(p: Pod) -> runtime.Record:
    return runtime.Record(buyer=f"team{p.team}", workload=f"{p.qos} cpu{p.cpu_milli} gpu{p.gpu_milli}", gpus=p.gpus,
                          model="/".join(p.models) or "any", runtime_s=p.runtime)


@dataclass(frozen=True)
class Evaluation:
    refit_s: float
    warmup_s: float
    fits: int
    jobs: int  # pods predicted
    model: runtime.Score | None
    baseline: runtime.Score | None

    def as_dict(self) -> dict[str, Any]:
        def r(x: float | None) -> float | None:
            return None if x is None else round(x, 6)

        def block(s: runtime.Score | None) -> dict[str, Any] | None:
            return None if s is None else {"jobs": s.jobs, "mape": r(s.mape), "median_ape": r(s.median_ape), "coverage_p10_p90": r(s.coverage)}

        return {"fits": self.fits, "jobs": self.jobs, "refit_s": self.refit_s, "warmup_s": self.warmup_s,
                "model": block(self.model), "baseline_key_mean": block(self.baseline),
                "keys": [" > ".join(names) or "all" for names in runtime.LEVELS], "shrink_k": runtime.SHRINK_K}


def evaluate(pods: Sequence[Pod], window_s: float, *, refit_s: float = REFIT_S, warmup_s: float | None = None) -> Evaluation:
    """The predictor and the key-mean baseline on ``pods`` (in arrival order), refitted every
    ``refit_s`` on the pods finished by then; ``warmup_s`` (default WARMUP_S, at most a
    quarter of the window) only trains."""
    if warmup_s is None:
        warmup_s = min(WARMUP_S, window_s / 4)
    if refit_s <= 0 or warmup_s < 0:
        raise ValueError(f"refit_s must be > 0 and warmup_s >= 0 (got {refit_s}, {warmup_s})")
    recs = [record(p) for p in pods]
    ends = np.asarray([p.arrival + p.runtime for p in pods], dtype=np.float64)
    by_end = np.argsort(ends, kind="stable")
    sorted_ends = ends[by_end]
    arrivals = [p.arrival for p in pods]
    fits = 0
    got: list[tuple[np.ndarray, np.ndarray]] = []
    base: list[tuple[np.ndarray, np.ndarray]] = []
    t = max(warmup_s, refit_s)
    while t < window_s:
        lo, hi = bisect.bisect_left(arrivals, t), bisect.bisect_left(arrivals, t + refit_s)
        if hi > lo:
            done = by_end[: int(np.searchsorted(sorted_ends, t, side="right"))]
            train = [recs[i] for i in done.tolist()]
            got.append(runtime.errors(runtime.fit(train), recs[lo:hi]))
            base.append(runtime.errors(runtime.MeanModel(train), recs[lo:hi]))
            fits += 1
        t += refit_s
    model = runtime.summarise(*_join(got))
    return Evaluation(refit_s, warmup_s, fits, model.jobs if model else 0, model, runtime.summarise(*_join(base)))


def _join(parts: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray]:
    if not parts:
        return np.zeros(0), np.zeros(0, dtype=np.bool_)
    return np.concatenate([a for a, _ in parts]), np.concatenate([b for _, b in parts])

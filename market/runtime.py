"""How long a job will really run (issue 36): quantiles per key, shrunk to broader keys.

Buyers book a duration; real jobs end earlier or later. This module learns from finished
jobs and predicts a new one's run time with an interval. It is pure (records in, a table
out, no Django, no clock), so the server (fitted on completed jobs, shown at quote time,
used to backfill) and the simulator (fitted on a trace's earlier jobs, scored on its later
ones) run the same model.

The model, chosen to be explained in one sentence to the buyer it is shown to:
- A job's key is its buyer, its workload (image and command), its GPU count and GPU model.
  ``LEVELS`` nests four keys from broad to narrow: every job; the buyer's; the buyer's with
  this workload; those on this many GPUs of this model.
- Each key keeps its job count ``n`` and the quantiles ``QUANTILES`` of log run time.
  Log, because run times span minutes to days and err by factors, not by seconds.
- A prediction starts from the broadest key and walks down. At each narrower key that
  has jobs, ``q = w * q_key + (1 - w) * q_so_far`` with ``w = n / (n + SHRINK_K)``: one
  job moves the estimate a fifth of the way, 20 jobs most of it. A new buyer gets the
  market's figures; a buyer's tenth run of one script gets mostly its own.
- Quantiles shrink toward a broader key's, whose spread is wider, so a key with few jobs
  gets a wider interval: cautious where it knows little.
- A job cannot outrun its booking (``cap_s``): every quantile is clipped to it.

The interval is p10-p90: 80% of jobs should end inside it (the simulator measures how
often they do). p80 is what the quote shows ("80% finished under ..."); backfill trusts
p90.
"""

from __future__ import annotations

import hashlib
import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

QUANTILES = (0.1, 0.5, 0.8, 0.9)
LEVELS: tuple[tuple[str, ...], ...] = (
    (),
    ("buyer",),
    ("buyer", "workload"),
    ("buyer", "workload", "gpus", "model"),
)
SHRINK_K = 4.0
MIN_JOBS = 5  # fewer finished jobs in the whole market: no prediction at all
MIN_RUNTIME_S = 1.0  # a run time shorter than this counts as this (log of zero)
CALIBRATE_SHARE = 0.2  # the newest jobs held out to calibrate the quantiles (``fit``)
CALIBRATE_MIN = 100  # fewer jobs in all: no calibration
CALIBRATION_LEVEL = len(LEVELS)  # the stored row that holds the calibration shift


@dataclass(frozen=True)
class Record:
    """One finished job as the model sees it."""

    buyer: str
    workload: str
    gpus: int
    model: str
    runtime_s: float


@dataclass(frozen=True)
class Stat:
    """One key's finished jobs: how many, and the QUANTILES of their log run time."""

    n: int
    q: tuple[float, ...]


@dataclass(frozen=True)
class Prediction:
    """Seconds at QUANTILES; ``jobs`` finished jobs at the narrowest key that had any,
    which is LEVELS[``level``]."""

    p10_s: float
    p50_s: float
    p80_s: float
    p90_s: float
    jobs: int
    level: int

    def as_dict(self) -> dict[str, float | int | str]:
        return {
            "p10_s": round(self.p10_s),
            "p50_s": round(self.p50_s),
            "p80_s": round(self.p80_s),
            "p90_s": round(self.p90_s),
            "jobs": self.jobs,
            "basis": BASIS[self.level],
            "text": self.text(),
        }

    def text(self) -> str:
        """What the quote says: "jobs like this ran 1.6 h; 80% finished under 2.4 h"."""
        return f"jobs like this ran {span(self.p50_s)}; 80% finished under {span(self.p80_s)}"


BASIS = (
    "all jobs in the market",
    "this buyer's jobs",
    "this buyer's jobs with this image and command",
    "this buyer's jobs with this image and command on this many GPUs of this model",
)


def span(seconds: float) -> str:
    """A duration the way a person reads it: 45 s, 12 min, 1.6 h, 2.3 d."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 3570:  # what rounds to 60 min reads as 1.0 h
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def key(level: int, fields: Sequence[str]) -> str:
    """The stored key of one level: a digest of its fields (an image and command may be
    long), 32 hex digits."""
    text = "\x1f".join((str(level), *fields))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def keys_of(*, buyer: str, workload: str, gpus: int, model: str | None) -> list[tuple[int, str]]:
    """A job's (level, key) at each of LEVELS, broadest first; ``model`` None (not known yet)
    stops before the narrowest."""
    values = {"buyer": buyer, "workload": workload, "gpus": str(gpus), "model": model or ""}
    return [(lv, key(lv, [values[n] for n in names])) for lv, names in enumerate(LEVELS) if model is not None or "model" not in names]


def record_keys(r: Record) -> list[tuple[int, str]]:
    return keys_of(buyer=r.buyer, workload=r.workload, gpus=r.gpus, model=r.model)


def workload(image: str, command: Sequence[str] | str | None) -> str:
    """A job's workload identity: its image and its command, as one string."""
    cmd = command if isinstance(command, str) else " ".join(command or ())
    return f"{image.strip()} {cmd.strip()}".strip()


class Model:
    """Fitted stats per (level, key), and the calibration ``shift`` (log seconds per quantile);
    ``predict`` walks LEVELS down as the module says."""

    def __init__(self, stats: dict[tuple[int, str], Stat], shift: tuple[float, ...] = (0.0,) * len(QUANTILES)) -> None:
        self.stats = stats
        self.shift = shift

    @property
    def jobs(self) -> int:
        top = self.stats.get((0, key(0, ())))
        return top.n if top else 0

    def log_quantiles(self, *, buyer: str, workload: str, gpus: int, model: str | None) -> tuple[np.ndarray, int, int] | None:
        """The shrunk log quantiles before calibration, and the jobs and level they came from."""
        est: np.ndarray | None = None
        jobs, level = 0, 0
        for lv, k in keys_of(buyer=buyer, workload=workload, gpus=gpus, model=model):
            st = self.stats.get((lv, k))
            if st is None:
                break  # a narrower key of one that has no jobs has none either
            q = np.asarray(st.q)
            if est is None:
                if st.n < MIN_JOBS:
                    return None
                est = q
            else:
                w = st.n / (st.n + SHRINK_K)
                est = w * q + (1 - w) * est
            jobs, level = st.n, lv
        return None if est is None else (est, jobs, level)

    def predict(self, *, buyer: str, workload: str, gpus: int, model: str | None, cap_s: float | None = None) -> Prediction | None:
        """None when the market has fewer than MIN_JOBS finished jobs; ``model`` None (not
        known yet) stops before the narrowest key."""
        got = self.log_quantiles(buyer=buyer, workload=workload, gpus=gpus, model=model)
        if got is None:
            return None
        est, jobs, level = got
        # shifted by different amounts, quantiles may cross; kept in order, they stay quantiles
        secs = np.exp(np.maximum.accumulate(est + np.asarray(self.shift)))
        if cap_s is not None:
            secs = np.minimum(secs, max(float(cap_s), MIN_RUNTIME_S))
        p10, p50, p80, p90 = (float(s) for s in secs)
        return Prediction(p10, p50, p80, p90, jobs, level)

    def rows(self) -> list[tuple[int, str, int, tuple[float, ...]]]:
        """(level, key, n, quantiles) per key, for storage; the calibration shift is one more
        row, at level CALIBRATION_LEVEL."""
        out = [(lv, k, st.n, st.q) for (lv, k), st in sorted(self.stats.items())]
        return [*out, (CALIBRATION_LEVEL, "calibration", 0, self.shift)]

    @classmethod
    def from_rows(cls, rows: Iterable[tuple[int, str, int, Sequence[float]]]) -> Model:
        stats, shift = {}, (0.0,) * len(QUANTILES)
        for lv, k, n, q in rows:
            if int(lv) == CALIBRATION_LEVEL:
                shift = tuple(float(x) for x in q)
            else:
                stats[(int(lv), str(k))] = Stat(int(n), tuple(float(x) for x in q))
        return cls(stats, shift)


def fit(records: Iterable[Record]) -> Model:
    """The stats of every key that any record has, at every level, calibrated.

    ``records`` come in the order the jobs finished, oldest first. The newest
    CALIBRATE_SHARE are predicted by a model fitted on the rest, and each quantile is
    shifted (in log seconds) so that its share of those jobs ended below it: p90 then holds
    about 90% of new jobs, however narrow the keys' own spreads were (quantiles of a few
    jobs each, shrunk, under-cover: 69% of the trace's jobs fell in an uncalibrated
    p10-p90). With fewer than CALIBRATE_MIN jobs, no shift."""
    recs = list(records)
    model = _fit(recs)
    if len(recs) < CALIBRATE_MIN:
        return model
    hold = int(len(recs) * CALIBRATE_SHARE)
    early = _fit(recs[: len(recs) - hold])
    diffs = []
    for r in recs[len(recs) - hold :]:
        got = early.log_quantiles(buyer=r.buyer, workload=r.workload, gpus=r.gpus, model=r.model)
        if got is not None:
            diffs.append(math.log(max(r.runtime_s, MIN_RUNTIME_S)) - got[0])
    if diffs:
        d = np.asarray(diffs)
        model.shift = tuple(float(np.quantile(d[:, i], q)) for i, q in enumerate(QUANTILES))
    return model


def _fit(recs: Sequence[Record]) -> Model:
    groups: dict[tuple[int, str], list[float]] = defaultdict(list)
    for r in recs:
        if not (r.runtime_s == r.runtime_s) or r.runtime_s < 0 or math.isinf(r.runtime_s):
            raise ValueError(f"run time {r.runtime_s!r} of a {r.gpus}-GPU job is not a finite count of seconds >= 0")
        y = math.log(max(r.runtime_s, MIN_RUNTIME_S))
        for k in record_keys(r):
            groups[k].append(y)
    stats = {}
    for k, ys in groups.items():
        q = np.quantile(np.asarray(ys), QUANTILES)
        stats[k] = Stat(len(ys), tuple(float(x) for x in q))
    return Model(stats)


class MeanModel:
    """The baseline a prediction must beat: the mean run time of the narrowest key with
    jobs (the same LEVELS), no interval."""

    def __init__(self, records: Iterable[Record]) -> None:
        sums: dict[tuple[int, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
        for r in records:
            for k in record_keys(r):
                s = sums[k]
                s[0] += r.runtime_s
                s[1] += 1
        self.means = {k: s[0] / s[1] for k, s in sums.items()}

    def predict(self, *, buyer: str, workload: str, gpus: int, model: str | None) -> float | None:
        got = None
        for k in keys_of(buyer=buyer, workload=workload, gpus=gpus, model=model):
            m = self.means.get(k)
            if m is None:
                break
            got = m
        return got


@dataclass(frozen=True)
class Score:
    """How a predictor did on held-out jobs: mean and median absolute percentage error of
    its point (p50, or the baseline's mean), and how often the truth fell in p10-p90."""

    jobs: int
    mape: float
    median_ape: float
    coverage: float | None


def errors(model: Model | MeanModel, records: Sequence[Record]) -> tuple[np.ndarray, np.ndarray]:
    """Per record ``model`` predicts: the absolute percentage error of its point (p50, or the
    baseline's mean), and whether the truth fell in p10-p90 (a MeanModel has no interval:
    an empty array). A model fitted on fewer than MIN_JOBS jobs predicts none."""
    apes, inside = [], []
    for r in records:
        truth = max(r.runtime_s, MIN_RUNTIME_S)
        if isinstance(model, Model):
            p = model.predict(buyer=r.buyer, workload=r.workload, gpus=r.gpus, model=r.model)
            if p is None:
                continue
            point = p.p50_s
            inside.append(p.p10_s <= truth <= p.p90_s)
        else:
            m = model.predict(buyer=r.buyer, workload=r.workload, gpus=r.gpus, model=r.model)
            if m is None:
                continue
            point = max(m, MIN_RUNTIME_S)
        apes.append(abs(point - truth) / truth)
    return np.asarray(apes, dtype=np.float64), np.asarray(inside, dtype=np.bool_)


def score(model: Model | MeanModel, records: Sequence[Record]) -> Score | None:
    """``model`` on ``records`` it was not fitted on (``errors``); None when it predicts none."""
    return summarise(*errors(model, records))


def summarise(apes: np.ndarray, inside: np.ndarray) -> Score | None:
    if not len(apes):
        return None
    return Score(len(apes), float(apes.mean()), float(np.median(apes)), float(inside.mean()) if len(inside) else None)

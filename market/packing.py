"""GPU fragmentation, in the spirit of FGD (issue 38): how many of a machine's free GPUs the
coming demand could not use, and which placement adds the least of it.

Fragmentation is where shared GPU clusters lose capacity: 1-GPU jobs scattered over 8-GPU
machines leave none whole for the 8-GPU job that comes next. Weng et al., "Beware of
Fragmentation: Scheduling GPU-Sharing Workloads with Fragmentation Gradient Descent"
(USENIX ATC'23), measure it on the Alibaba trace this repository ships, and schedule each
job where it adds the least of it. The measure here is theirs, on whole and shared GPUs:

- **A machine's GPUs** are each a free share in thousandths (``MILLI`` = a whole GPU free,
  0 = taken), beside its free CPU (thousandths of a core; None: not counted). A job
  **shape** asks for ``gpus`` GPUs of ``milli`` each (1000: whole GPUs, which must be
  wholly free; less: a share of one GPU, MIG slice or time-share, from a GPU with at least
  that much free) of one of ``models`` (empty: any), and ``cpu_milli`` of CPU.
- **Fragments for one shape** (``fragment``): where the shape cannot run on the machine at
  all (the wrong model, too few GPUs free enough, too little CPU left), every free share
  on it is lost to that shape; where it can, the free shares too small for it are (for
  whole GPUs, every partly used GPU's rest). In GPUs. GPUs whose machine has run out of
  CPU are FGD's main finding on this trace: 8-GPU machines with 96 cores, jobs asking 11
  cores a GPU at the median.
- **A machine's fragmentation** (``expected``) is the expected fragments of the coming
  demand: each shape's fragments weighted by its share of the demand (``Demand``). FGD
  weighs each job alike; ``Demand.of(..., size_exponent)`` weighs a job by the GPUs it asks
  to that power (0.5 is the simulator's ``fgd-sized``), so that the few 8-GPU jobs are not
  drowned by the many shares: on this trace FGD breaks whole 8-GPU machines, which an
  8-GPU job then cannot find.
- **Placing** (``best_placement``): among the machines (and, for a share, the GPUs) that
  can take a job, the one whose fragmentation grows least; ties to the one with the least
  room left (best fit), then the first. This is FGD's greedy step.

Pure: numpy only. The simulator's fill experiment uses it (``market/simulate/fill.py``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

MILLI = 1000
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


@dataclass(frozen=True)
class Shape:
    gpus: int  # GPUs it holds, >= 1
    milli: int  # of each, 1..MILLI (MILLI: whole GPUs)
    models: tuple[str, ...] = ()  # the models it may run on; (): any
    cpu_milli: int = 0  # the CPU it needs, thousandths of a core

    def __post_init__(self) -> None:
        if self.gpus < 1 or not 1 <= self.milli <= MILLI:
            raise ValueError(f"a shape holds at least 1 GPU of 1 to {MILLI} thousandths, not {self.gpus} of {self.milli}")
        if self.milli < MILLI and self.gpus != 1:
            raise ValueError(f"a share of a GPU ({self.milli} thousandths) is of one GPU, not {self.gpus}")


@dataclass(frozen=True)
class Demand:
    """The coming demand: shapes and the share of jobs each is (summing to 1)."""

    shapes: tuple[Shape, ...]
    weights: tuple[float, ...]

    @staticmethod
    def of(shapes: Iterable[Shape], size_exponent: float = 0.0) -> Demand:
        """The demand a list of jobs makes: each distinct shape at its share of them, each job
        weighing (the GPUs it asks, in GPUs) ** ``size_exponent``: 0 (FGD's) counts jobs, 1
        counts the GPUs asked, so that the rare big jobs, which fragmentation stops first,
        weigh what they ask."""
        counts = Counter(shapes)
        if not counts:
            raise ValueError("a demand needs at least one job")
        if not 0.0 <= size_exponent <= 2.0:
            raise ValueError(f"size_exponent is {size_exponent}; give 0 (count jobs) to 1 (count GPUs asked), at most 2")
        ordered = sorted(counts, key=lambda s: (s.gpus, s.milli, s.models, s.cpu_milli))
        mass = [counts[s] * (s.gpus * min(s.milli, MILLI) / MILLI) ** size_exponent for s in ordered]
        total = sum(mass)
        return Demand(tuple(ordered), tuple(m / total for m in mass))


def fits(free: I64, shape: Shape, cpu: int | None = None) -> bool:
    """Whether a machine whose GPUs have ``free`` thousandths free (and ``cpu`` left, where
    counted) can take ``shape`` (its model aside)."""
    if cpu is not None and shape.cpu_milli > cpu:
        return False
    if shape.milli >= MILLI:
        return int((free >= MILLI).sum()) >= shape.gpus
    return int((free >= shape.milli).sum()) >= shape.gpus


def fragment(free: I64, model: str, shape: Shape, cpu: int | None = None) -> float:
    """The GPUs of free share on the machine that ``shape`` could not use."""
    total = float(free.sum()) / MILLI
    if (shape.models and model not in shape.models) or not fits(free, shape, cpu):
        return total
    need = min(shape.milli, MILLI)
    return float(free[free < need].sum()) / MILLI


class Fragmentation:
    """``expected`` for many machines against one demand, fast: per model, which shapes may
    run there, and the shapes' needs as arrays."""

    def __init__(self, demand: Demand) -> None:
        self.demand = demand
        self.w = np.asarray(demand.weights, dtype=np.float64)
        self.need = np.asarray([min(s.milli, MILLI) for s in demand.shapes], dtype=np.int64)
        self.gpus = np.asarray([s.gpus for s in demand.shapes], dtype=np.int64)
        self.whole = self.need >= MILLI
        self.cpu = np.asarray([s.cpu_milli for s in demand.shapes], dtype=np.int64)
        self._models: dict[str, npt.NDArray[np.bool_]] = {}

    def allowed(self, model: str) -> npt.NDArray[np.bool_]:
        got = self._models.get(model)
        if got is None:
            got = np.asarray([not s.models or model in s.models for s in self.demand.shapes], dtype=np.bool_)
            self._models[model] = got
        return got

    def expected(self, free: I64, model: str, cpu: int | None = None) -> float:
        """The machine's fragmentation: the expected GPUs of free share the demand could not use
        (with ``cpu`` left, where counted)."""
        srt = np.sort(free)
        total = float(srt.sum())
        below = np.concatenate([[0], np.cumsum(srt)])  # below[k]: the k smallest free shares
        idx = np.searchsorted(srt, self.need, side="left")  # GPUs with less free than each shape needs
        enough = len(srt) - idx  # GPUs with at least the need free
        runs = self.allowed(model) & (enough >= self.gpus)
        if cpu is not None:
            runs &= self.cpu <= cpu
        lost = np.where(runs, below[idx], total)
        return float(self.w @ lost) / MILLI


def take(free: I64, shape: Shape, gpu: int | None = None) -> I64:
    """``free`` after ``shape`` runs there: whole GPUs from the first wholly free; a share from
    GPU ``gpu`` (default: the one with the least free that is enough, then the first)."""
    out = free.copy()
    if shape.milli >= MILLI:
        idx = np.flatnonzero(out >= MILLI)[: shape.gpus]
        if len(idx) < shape.gpus:
            raise ValueError(f"{shape.gpus} whole GPU(s) are not free")
        out[idx] = 0
        return out
    if gpu is None:
        ok = np.flatnonzero(out >= shape.milli)
        if not len(ok):
            raise ValueError(f"no GPU has {shape.milli} thousandths free")
        gpu = int(ok[np.argmin(out[ok])])
    if out[gpu] < shape.milli:
        raise ValueError(f"GPU {gpu} has {int(out[gpu])} thousandths free, not {shape.milli}")
    out[gpu] -= shape.milli
    return out


def best_placement(frag: Fragmentation, machines: Sequence[I64], models: Sequence[str], shape: Shape,
                   before: Sequence[float] | None = None, cpus: Sequence[int] | None = None) -> tuple[int, int | None] | None:
    """FGD's step: the (machine, GPU for a share, else None) whose fragmentation grows least
    when ``shape`` runs there; ties to the least room left, then the first. ``before``: each
    machine's fragmentation now, where the caller keeps it; ``cpus``: each machine's CPU left,
    where counted. None: no machine can take it."""
    best: tuple[float, int, int, int, int | None] | None = None
    for j, free in enumerate(machines):
        cpu = None if cpus is None else cpus[j]
        if (shape.models and models[j] not in shape.models) or not fits(free, shape, cpu):
            continue
        now = before[j] if before is not None else frag.expected(free, models[j], cpu)
        left = None if cpu is None else cpu - shape.cpu_milli
        if shape.milli >= MILLI:
            options: list[int | None] = [None]
        else:  # each distinct free level that is enough: the GPUs at one level are alike
            levels = sorted({int(v) for v in free.tolist() if v >= shape.milli})
            options = [int(np.flatnonzero(free == v)[0]) for v in levels]
        for g in options:
            after = take(free, shape, g)
            # rounded, so that a tie is a tie whatever order the floating-point sums ran in
            key = (round(frag.expected(after, models[j], left) - now, 9), int(after.sum()), j, -1 if g is None else g, g)
            if best is None or key[:4] < best[:4]:
                best = key
    return None if best is None else (best[2], best[4])

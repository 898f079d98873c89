"""Fragmentation and FGD-style placement (issue 38), worked out by hand."""

from __future__ import annotations

import numpy as np
import pytest

from market import packing
from market.packing import MILLI, Demand, Fragmentation, Shape


def gpus(*free: int) -> np.ndarray:
    return np.asarray(free, dtype=np.int64)


def test_fragments_of_one_shape() -> None:
    m = gpus(1000, 1000, 600, 0)  # two whole GPUs free, one with 0.6 free, one taken: 2.6 GPUs free
    assert packing.fragment(m, "A100", Shape(1, 1000)) == pytest.approx(0.6)  # a whole GPU cannot use the 0.6
    assert packing.fragment(m, "A100", Shape(2, 1000)) == pytest.approx(0.6)
    assert packing.fragment(m, "A100", Shape(3, 1000)) == pytest.approx(2.6), "cannot run there: all of it is lost to it"
    assert packing.fragment(m, "A100", Shape(1, 500)) == pytest.approx(0.0)  # a half share fits the 0.6
    assert packing.fragment(m, "A100", Shape(1, 700)) == pytest.approx(0.6)
    assert packing.fragment(m, "T4", Shape(1, 500, ("A100",))) == pytest.approx(2.6), "the wrong model"


def test_a_machines_fragmentation_is_the_demands_expected_fragments() -> None:
    demand = Demand.of([Shape(1, 1000)] * 2 + [Shape(3, 1000)] + [Shape(1, 700)])  # shares 1/2, 1/4, 1/4
    m = gpus(1000, 1000, 600, 0)
    frag = Fragmentation(demand)
    assert frag.expected(m, "A100") == pytest.approx(0.5 * 0.6 + 0.25 * 2.6 + 0.25 * 0.6)
    assert frag.expected(m, "A100") == pytest.approx(sum(w * packing.fragment(m, "A100", s) for s, w in zip(demand.shapes, demand.weights, strict=True)))
    with pytest.raises(ValueError, match="a share of a GPU"):
        Shape(2, 500)


def test_a_demand_may_weigh_each_job_by_the_gpus_it_asks() -> None:
    jobs = [Shape(1, 500)] * 4 + [Shape(1, 1000)] * 3 + [Shape(8, 1000)]  # 4 halves, 3 ones, one 8
    assert Demand.of(jobs).weights == pytest.approx((4 / 8, 3 / 8, 1 / 8)), "FGD's: each job alike"
    assert Demand.of(jobs, 1.0).weights == pytest.approx((2 / 13, 3 / 13, 8 / 13)), "the GPUs asked: 2, 3 and 8 of 13"
    root = (4 * 0.5**0.5, 3.0, 8**0.5)
    assert Demand.of(jobs, 0.5).weights == pytest.approx(tuple(r / sum(root) for r in root))
    with pytest.raises(ValueError, match="size_exponent is -1"):
        Demand.of(jobs, -1.0)


def test_best_fit_strands_gpus_where_the_packer_leaves_room_for_the_jobs_to_come() -> None:
    """Two 8-GPU machines, A with 3 GPUs free and B with 2; the demand is mostly 2-GPU jobs.
    A 1-GPU job comes, then two 2-GPU jobs. Best fit puts the 1-GPU job on B, the machine
    with the least room: B's last GPU is stranded, A takes one 2-GPU job and strands its
    last, and the second 2-GPU job finds no machine with 2 GPUs free, though 2 are free.
    The packer puts the 1-GPU job on A (3 to 2 free: a 2-GPU slot kept), and both 2-GPU
    jobs run."""
    demand = Demand.of([Shape(2, MILLI)] * 9 + [Shape(1, MILLI)])
    frag = Fragmentation(demand)
    models = ["A100", "A100"]
    arrivals = [Shape(1, MILLI), Shape(2, MILLI), Shape(2, MILLI)]

    def fill(choose) -> tuple[int, int]:  # type: ignore[no-untyped-def]
        machines = [gpus(*([MILLI] * 3 + [0] * 5)), gpus(*([MILLI] * 2 + [0] * 6))]
        for k, s in enumerate(arrivals):
            where = choose(machines, s)
            if where is None:
                return k, sum(int(m.sum()) for m in machines) // MILLI
            machines[where] = packing.take(machines[where], s)
        return len(arrivals), sum(int(m.sum()) for m in machines) // MILLI

    def best_fit(machines, s):  # type: ignore[no-untyped-def]
        ok = [j for j, m in enumerate(machines) if packing.fits(m, s)]
        return min(ok, key=lambda j: (int(machines[j].sum()), j)) if ok else None

    def packer(machines, s):  # type: ignore[no-untyped-def]
        got = packing.best_placement(frag, machines, models, s)
        return None if got is None else got[0]

    assert fill(best_fit) == (2, 2), "best fit: the third job finds no room, 2 GPUs stranded"
    assert fill(packer) == (3, 0)


def test_a_share_goes_to_the_gpu_where_it_fragments_least() -> None:
    """A 0.3 share on a machine whose GPUs have 1.0, 0.4 and 0.3 free, the demand being 0.4
    shares and whole GPUs: on the 0.3 it wastes nothing (the 0.4 stays for a 0.4 share)."""
    frag = Fragmentation(Demand.of([Shape(1, 400)] * 3 + [Shape(1, MILLI)]))
    m = gpus(1000, 400, 300)
    assert packing.best_placement(frag, [m], ["A100"], Shape(1, 300)) == (0, 2)
    assert packing.take(m, Shape(1, 300), 2).tolist() == [1000, 400, 0]
    assert packing.best_placement(frag, [gpus(0, 0)], ["A100"], Shape(1, 300)) is None

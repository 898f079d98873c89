"""FGD's fill experiment (issue 38), worked out by hand."""

from __future__ import annotations

import pytest

from market.simulate import fill
from market.simulate.trace import Node, Pod


def node(i: int, gpus: int) -> Node:
    return Node(id=f"n{i}", gpus=gpus, model="T4-16GB", trace_model="T4", region="us-east", cpu_milli=1, memory_mib=1)


def pod(i: int, gpus: int, milli: int = 1000) -> Pod:
    return Pod(id=f"p{i}", arrival=float(i), runtime=60.0, gpus=gpus, gpu_milli=milli, models=(), qos="LS", team=0,
               scheduled_in_trace=True)


def test_best_fit_strands_what_the_packer_keeps_for_the_jobs_to_come() -> None:
    """Nodes of 3 and 2 GPUs; pods of 1, 2 and 2 GPUs, again and again. Best fit puts the
    1-GPU pod on the 2-GPU node (least room), the first 2-GPU pod on the other, and the
    second finds no node with 2 GPUs free: 2 placed, 2 of 5 GPUs stranded. FGD puts the
    1-GPU pod where a 2-GPU slot stays whole: 3 placed, nothing stranded; the list's next
    pod finds the cluster full."""
    nodes = [node(0, 3), node(1, 2)]
    pods = [pod(1, 1), pod(2, 2), pod(3, 2)]
    bf = fill.run_fill(pods, nodes, "best-fit")
    assert fill.run_fill(pods, nodes, "fgd-sized").placed == 3
    assert (bf.placed, bf.allocated, bf.stranded, bf.failed_pod) == (2, 0.6, 0.4, "p3")
    # each free GPU is alone on its node: lost to the 2-GPU pods (2/3 of the list), of use to the 1-GPU ones
    assert bf.fragmented == pytest.approx(2 * (2 / 3) / 5, abs=1e-6)
    packed = fill.run_fill(pods, nodes, "fgd")
    assert (packed.placed, packed.allocated, packed.stranded, packed.failed_pod) == (3, 1.0, 0.0, "p1")


def test_shares_of_a_gpu_are_packed_onto_one_gpu() -> None:
    """One node of 2 GPUs; pods of 0.5, 0.5 and a whole GPU. Both policies put the two
    halves on one GPU (best fit: the GPU with the least room that is enough) and the whole
    pod on the other."""
    nodes = [node(0, 2)]
    pods = [pod(1, 1, 500), pod(2, 1, 500), pod(3, 1)]
    for policy in fill.FILL_POLICIES:
        got = fill.run_fill(pods, nodes, policy)
        assert (got.placed, got.allocated) == (3, 1.0), policy


def test_the_engine_takes_a_share_from_a_gpus_free_eighths() -> None:
    """One node of 2 GPUs; pods of 0.3 (3 eighths), 0.6 (5 eighths), 0.3 and 0.5 (4). The engine
    sells each share from one GPU's free eighths and picks the GPU: the 0.3 and the 0.6 fill
    GPU 0's eight eighths, the next 0.3 goes to GPU 1, and the 0.5 fits beside it."""
    nodes = [node(0, 2)]
    pods = [pod(1, 1, 300), pod(2, 1, 600), pod(3, 1, 300), pod(4, 1, 500)]
    c = fill.Cluster(nodes)
    choose = fill.gridbid(nodes, 0)
    for p in pods:
        got = choose(c, fill.shape_of(p))
        assert got is not None, p
        c.place(got[0], fill.shape_of(p), got[1])
    assert c.free[0].tolist() == [100, 200], "0.3 + 0.6 on one GPU, 0.3 + 0.5 on the other"


def test_an_unknown_policy_or_nothing_to_place_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown fill policy 'tetris'"):
        fill.run_fill([pod(1, 1)], [node(0, 1)], "tetris")
    with pytest.raises(ValueError, match="needs pods and nodes"):
        fill.run_fill([], [node(0, 1)], "fgd")

"""market.simulate.trace: the shipped Alibaba GPU trace and the rules that map a trace."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from market.simulate import trace as tr
from providers import catalogue

NODE_HEADER = "sn,cpu_milli,memory_mib,gpu,model"
POD_HEADER = (
    "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,"
    "creation_time,deletion_time,scheduled_time"
)
NODES = [
    "n0,8000,32768,1,V100M16",
    "n1,96000,393216,8,G2",
    "n2,16000,61440,2,P100",
]
PODS = [
    "p0,4000,1000,1,0,,LS,Running,100,400,110",  # scheduled: 400-110; gpu_milli 0 -> 1000
    "p1,4000,1000,2,1500,V100M16|P100,BE,Pending,150,450,",  # never scheduled: 450-150
    "p2,4000,1000,1,250,V100M32|T4,LS,Succeeded,200,200,200",  # runtime 0 -> 1 s
    "p3,4000,1000,0,0,,BE,Running,50,60,50",  # no GPU: left out
    "p4,4000,1000,8,1000,,Guaranteed,Running,300,1300,305",
]


def write(tmp: Path, name: str, header: str, rows: list[str]) -> Path:
    path = tmp / name
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return path


def tiny(
    tmp: Path,
    pods: list[str] | None = None,
    nodes: list[str] | None = None,
    pod_header: str = POD_HEADER,
    node_header: str = NODE_HEADER,
) -> tuple[Path, Path]:
    return (
        write(tmp, "pods.csv", pod_header, PODS if pods is None else pods),
        write(tmp, "nodes.csv", node_header, NODES if nodes is None else nodes),
    )


@pytest.fixture(scope="module")
def shipped() -> tr.Trace:
    return tr.load()


# ---------------------------------------------------------------- the shipped trace


def test_shipped_trace_loads(shipped: tr.Trace) -> None:
    assert shipped.name == "alibaba-gpu-2023"
    assert len(shipped.nodes) == 1213
    assert sum(n.gpus for n in shipped.nodes) == 6212
    assert shipped.left_out == {"no_gpu": 1088, "outside_window": 0}
    assert len(shipped.pods) == 7064
    models = catalogue.gpu_models()
    assert all(n.model in models for n in shipped.nodes)
    assert all(m in models for p in shipped.pods for m in p.models)
    assert all(n.region in tr.REGIONS for n in shipped.nodes)
    assert set(tr.REGIONS) <= set(catalogue.regions())
    assert set(tr.GRID_OF_REGION) == set(tr.REGIONS)
    assert {n.trace_model for n in shipped.nodes} <= set(tr.MODEL_MAP)
    assert all(0 <= p.team < 12 for p in shipped.pods)
    assert all(p.gpus >= 1 and 1 <= p.gpu_milli <= 1000 and p.runtime >= 1 for p in shipped.pods)
    assert sum(not p.scheduled_in_trace for p in shipped.pods) <= 897
    arrivals = [(p.arrival, p.id) for p in shipped.pods]
    assert arrivals == sorted(arrivals) and arrivals[0][0] == 0.0
    assert max(a for a, _ in arrivals) == shipped.window_s
    assert shipped.time_scale == 1.0 and shipped.load_factor is None and shipped.teams == 12
    assert [n.id for n in shipped.nodes] == sorted(n.id for n in shipped.nodes)  # file order


def test_shipped_trace_is_deterministic_and_seeded(shipped: tr.Trace) -> None:
    again = tr.load()
    assert again == shipped and repr(again) == repr(shipped)
    other = tr.load(seed=1)
    assert [n.region for n in other.nodes] != [n.region for n in shipped.nodes]
    assert [p.team for p in other.pods] != [p.team for p in shipped.pods]
    counts = [sum(n.region == r for n in shipped.nodes) for r in tr.REGIONS]
    assert max(counts) - min(counts) <= 1


def test_busiest_week_is_the_brute_force_max(shipped: tr.Trace) -> None:
    length = 7 * 86400.0
    a = np.array([p.arrival + shipped.window_start for p in shipped.pods])
    g = np.array([p.gpus for p in shipped.pods], dtype=float)
    r = np.array([p.runtime for p in shipped.pods])

    def work(c: float) -> float:
        inside = (a >= c) & (a < c + length)
        return float((g * np.minimum(r, c + length - a))[inside].sum())

    best = max(sorted(set(a.tolist())), key=lambda c: (work(c), -c))
    week = tr.load(days=7)
    assert week.window_start == best
    assert week.window_s == length
    week_work = work(week.window_start)
    assert week_work >= work(float(a.min()))
    inside = sum(p.gpus * min(p.runtime, length - p.arrival) for p in week.pods)
    assert inside == pytest.approx(week_work)
    assert len(week.pods) == int(((a >= best) & (a < best + length)).sum())
    assert week.left_out["outside_window"] == 7064 - len(week.pods)
    assert all(0 <= p.arrival < length for p in week.pods)


def test_load_compresses_to_the_offered_load_asked() -> None:
    week = tr.load(days=7, load=0.6)
    assert tr.offered_load(week.pods, week.nodes, week.window_s) == pytest.approx(0.6)
    plain = tr.load(days=7)
    assert week.load_factor == 0.6
    assert week.window_s == pytest.approx(plain.window_s * week.time_scale)
    assert [p.runtime for p in week.pods] == [p.runtime for p in plain.pods]
    assert [p.arrival for p in week.pods] == pytest.approx(
        [p.arrival * week.time_scale for p in plain.pods]
    )


def test_start_picks_the_window(shipped: tr.Trace) -> None:
    start = 120 * 86400.0
    t = tr.load(days=2, start=start)
    assert t.window_start == start and t.window_s == 2 * 86400
    creations = [p.arrival + shipped.window_start for p in shipped.pods]
    assert len(t.pods) == sum(start <= c < start + 2 * 86400 for c in creations)


# ---------------------------------------------------------------- the rules, by hand


def test_tiny_trace_rules(tmp_path: Path) -> None:
    pods, nodes = tiny(tmp_path)
    t = tr.load(pods=pods, nodes=nodes, teams=3, seed=5)
    assert t.name == "pods.csv"
    assert [n.model for n in t.nodes] == ["V100-PCIe-16GB", "A100-SXM-40GB", "V100-PCIe-16GB"]
    assert [n.trace_model for n in t.nodes] == ["V100M16", "G2", "P100"]
    assert t.left_out == {"no_gpu": 1, "outside_window": 0}
    assert t.window_start == 100.0 and t.window_s == 200.0  # first to last GPU pod's creation
    by = {p.id: p for p in t.pods}
    assert [p.id for p in t.pods] == ["p0", "p1", "p2", "p4"]
    assert [p.arrival for p in t.pods] == [0.0, 50.0, 100.0, 200.0]
    assert by["p0"].runtime == 290.0 and by["p0"].scheduled_in_trace  # deletion - scheduled
    assert by["p1"].runtime == 300.0 and not by["p1"].scheduled_in_trace  # deletion - creation
    assert by["p2"].runtime == 1.0  # 0 s floored at 1 s
    assert by["p4"].runtime == 995.0 and by["p4"].gpus == 8
    assert [by[i].gpu_milli for i in ("p0", "p1", "p2", "p4")] == [1000, 1000, 250, 1000]
    assert by["p0"].models == ()
    assert by["p1"].models == ("V100-PCIe-16GB",)  # V100M16 and P100 map to one model
    assert by["p2"].models == ("T4-16GB", "V100-SXM-32GB")
    assert all(0 <= p.team < 3 for p in t.pods)
    assert by["p0"].team == tr.team_of(next(r for r in tr.read_pods(pods) if r.id == "p0"), 3, 5)
    work = 290 + 2 * 300 + 1 + 8 * 995
    assert tr.offered_load(t.pods, t.nodes, t.window_s) == pytest.approx(work / (11 * 200))
    one = tr.load(pods=pods, nodes=nodes, teams=1)
    assert {p.team for p in one.pods} == {0}
    half = tr.load(pods=pods, nodes=nodes, load=0.5)
    assert half.time_scale == pytest.approx(work / (11 * 200 * 0.5))
    assert tr.offered_load(half.pods, half.nodes, half.window_s) == pytest.approx(0.5)


def test_tiny_trace_window_with_start(tmp_path: Path) -> None:
    pods, nodes = tiny(tmp_path)
    t = tr.load(pods=pods, nodes=nodes, days=150 / 86400, start=140)
    assert [p.id for p in t.pods] == ["p1", "p2"]
    assert [p.arrival for p in t.pods] == pytest.approx([10.0, 60.0])
    assert t.left_out == {"no_gpu": 1, "outside_window": 2}


def test_regions_follow_the_seeded_permutation(tmp_path: Path) -> None:
    _, nodes = tiny(tmp_path)
    got = [n.region for n in tr.read_nodes(nodes, seed=7)]
    order = np.random.default_rng([30, 7]).permutation(3).tolist()
    want = [""] * 3
    for k, i in enumerate(order):
        want[i] = tr.REGIONS[k % 3]
    assert got == want


# ---------------------------------------------------------------- bad input


def raises(*parts: str) -> Any:
    """pytest.raises(TraceError) whose message holds ``parts``, in order."""
    return pytest.raises(tr.TraceError, match="(?s)" + ".*".join(map(re.escape, parts)))


@pytest.mark.parametrize(
    ("row", "parts"),
    [
        ("p9,4000,1000,x,1000,,LS,Running,1,2,1", ("line 3", "num_gpu", "'x'")),
        ("p9,-5,1000,1,1000,,LS,Running,1,2,1", ("line 3", "cpu_milli", "'-5'")),
        ("p9,4000,1000,1,1000,,LS,Running,1.5,2,1", ("line 3", "creation_time")),
        ("p9,4000,1000,65,1000,,LS,Running,1,2,1", ("line 3", "num_gpu", "65")),
        ("p9,4000,1000,1,1000,A800,LS,Running,1,2,1", ("line 3", "gpu_spec", "A800", "V100M32")),
        ("p9,4000,1000,1,1000,,LS,Running,10,5,", ("line 3", "deletion_time", "creation_time")),
        ("p9,4000,1000,1,1000,,LS,Running,10,15,20", ("line 3", "deletion_time", "scheduled_time")),
        ("p9,4000,1000,1,1000,,LS,Running,10,15,5", ("line 3", "scheduled_time")),
        ("p9,4000,1000,1,1000,,LS,Running,,15,", ("line 3", "has no creation_time", "seconds")),
        (
            "p9,4000,1000,1,1000,,LS,Running,1,,",
            ("line 3", "deletion_time", "cluster-trace-gpu-v2023"),
        ),
        ("p9,4000,1000,1,1000,,LS,Running,1,2", ("line 3", "10 fields", "11")),
        ("p0,4000,1000,1,1000,,LS,Running,1,2,1", ("line 3", "name", "'p0'", "line 2")),
    ],
)
def test_bad_pod_rows(tmp_path: Path, row: str, parts: tuple[str, ...]) -> None:
    pods, nodes = tiny(tmp_path, pods=[PODS[0], row])
    with raises(str(pods), *parts):
        tr.load(pods=pods, nodes=nodes)


@pytest.mark.parametrize(
    ("row", "parts"),
    [
        ("n9,8000,32768,0,T4", ("line 4", "gpu is 0")),
        ("n9,8000,32768,two,T4", ("line 4", "gpu", "'two'")),
        ("n9,8000,3.5,1,T4", ("line 4", "memory_mib")),
        ("n9,8000,32768,1,G1", ("line 4", "model", "'G1'", "A10, G2, G3, P100")),
        ("n0,8000,32768,1,T4", ("line 4", "sn", "'n0'", "line 2")),
    ],
)
def test_bad_node_rows(tmp_path: Path, row: str, parts: tuple[str, ...]) -> None:
    pods, nodes = tiny(tmp_path, nodes=[*NODES[:2], row])
    with raises(str(nodes), *parts):
        tr.load(pods=pods, nodes=nodes)


def test_missing_columns(tmp_path: Path) -> None:
    pods, nodes = tiny(tmp_path, node_header="sn,cpu_milli,memory_mib,model")
    with raises(str(nodes), "line 1", "gpu", "sn,cpu_milli,memory_mib,gpu,model"):
        tr.read_nodes(nodes)
    header = POD_HEADER.replace("num_gpu,gpu_milli", "gpus,gpu_milli")
    pods, nodes = tiny(tmp_path, pod_header=header)
    with raises(str(pods), "line 1", "num_gpu", "expected the header name,cpu_milli"):
        tr.read_pods(pods)


def test_pod_list_without_times(tmp_path: Path) -> None:
    header = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase"
    pods, nodes = tiny(tmp_path, pods=["p0,1,1,1,1000,,LS,Running"], pod_header=header)
    with raises(str(pods), "line 1", "has no creation_time", "a pod list needs creation_time"):
        tr.load(pods=pods, nodes=nodes)


def test_missing_and_empty_files(tmp_path: Path) -> None:
    pods, nodes = tiny(tmp_path)
    gone = tmp_path / "nope.csv"
    with raises(str(gone), "no such pod list"):
        tr.load(pods=gone, nodes=nodes)
    with raises(str(gone), "no such node list"):
        tr.load(pods=pods, nodes=gone)
    (tmp_path / "empty.csv").write_text("")
    with raises("empty.csv", "empty"):
        tr.read_nodes(tmp_path / "empty.csv")
    with raises("no nodes"):
        tr.read_nodes(write(tmp_path, "n.csv", NODE_HEADER, []))
    with raises("no pods"):
        tr.read_pods(write(tmp_path, "p.csv", POD_HEADER, []))
    only_cpu = write(tmp_path, "cpu.csv", POD_HEADER, [PODS[3]])
    with raises("no pod asks for a GPU"):
        tr.load(pods=only_cpu, nodes=nodes)


def test_empty_window(tmp_path: Path) -> None:
    pods, nodes = tiny(tmp_path)
    with raises("[10000000, 10086400)", "from 100 to 300 s"):
        tr.load(pods=pods, nodes=nodes, days=1, start=10_000_000)


@pytest.mark.parametrize(
    ("kwargs", "parts"),
    [
        ({"days": 0}, ("days is 0", "0 < days <= 365")),
        ({"days": 366}, ("days is 366",)),
        ({"days": float("nan")}, ("days is nan",)),
        ({"load": 0}, ("load is 0", "0 < load <= 1")),
        ({"load": 1.5}, ("load is 1.5",)),
        ({"teams": 0}, ("teams is 0", "1 to 64")),
        ({"teams": 65}, ("teams is 65",)),
        ({"seed": -1}, ("seed is -1",)),
        ({"start": 5}, ("start is 5", "days")),
        ({"trace": "nope"}, ("unknown trace 'nope'", "alibaba-gpu-2023")),
    ],
)
def test_bad_arguments(kwargs: dict[str, object], parts: tuple[str, ...]) -> None:
    with raises(*parts):
        tr.load(**kwargs)  # type: ignore[arg-type]


def test_trace_error_is_a_value_error() -> None:
    assert issubclass(tr.TraceError, ValueError)
    pods, nodes = tr.TRACES["alibaba-gpu-2023"]
    assert pods.is_file() and nodes.is_file()
    assert (pods.parent / "README.md").is_file()

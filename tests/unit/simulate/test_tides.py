"""The tidal inference service and spot preemption in the simulator, worked out by hand."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from market.simulate import sim, tides
from market.simulate.trace import Node, Pod, TraceError

HOUR = 3600.0


def node(i: int, gpus: int) -> Node:
    return Node(id=f"n{i}", gpus=gpus, model="T4-16GB", trace_model="T4", region="us-east", cpu_milli=1, memory_mib=1)


def pod(i: int, arrival: float, runtime: float, gpus: int, qos: str) -> Pod:
    return Pod(id=f"p{i}", arrival=arrival, runtime=runtime, gpus=gpus, gpu_milli=1000, models=(), qos=qos, team=0,
               scheduled_in_trace=True)


def need(t: float) -> int:
    """No GPUs in hour 0, both of S in hour 1, none after."""
    return 2 if HOUR <= t < 2 * HOUR else 0


# S (node 0, 2 GPUs) belongs to the service; N (node 1, 1 GPU) does not.
NODES = [node(0, 2), node(1, 1)]
# q1: best effort (spot), 2 GPUs for 5,000 s; q2: latency-sensitive, 1 GPU for 100 s
PODS = [pod(1, 0, 5000, 2, "BE"), pod(2, 0, 100, 1, "LS")]


def test_a_spot_pod_on_lent_gpus_is_preempted_by_the_tide_and_resumes_from_its_checkpoint() -> None:
    """q1 takes S's idle GPUs at 0. At 3,600 s the tide wants both: q1 is preempted after
    3,600 s of running, keeps the 3,000 s up to its last checkpoint (every 1,000 s) and loses
    600 s on 2 GPUs. At 7,200 s the tide ebbs and q1 runs its last 2,000 s: done at 9,200."""
    svc = sim.Service(owned=(0,), need=need, lend=True, checkpoint_s=1000.0)
    o = sim.run(PODS, NODES, "first", 10_000.0, service=svc)
    assert o.start.tolist() == [0, 0]
    assert o.finish.tolist() == [9200, 100]
    assert o.node.tolist() == [0, 1]
    assert o.preemptions == 1
    assert o.work_lost_gpu_s == pytest.approx(1200)
    # q1 waited from its preemption at 3,600 s to 7,200 s: the SLO counts that wait too
    assert o.waited is not None and o.waited.tolist() == [3600, 0]
    assert o.lent_gpu_s == pytest.approx(2 * 3600 + 2 * 2000)
    # held: q1 2 x (3,600 + 2,000), q2 100, the service 2 x 3,600
    assert o.alloc_gpu_s == pytest.approx(2 * 5600 + 100 + 2 * 3600)


def test_without_lending_the_services_gpus_stay_idle_and_the_spot_pod_never_fits() -> None:
    svc = sim.Service(owned=(0,), need=need, lend=False, checkpoint_s=1000.0)
    o = sim.run(PODS, NODES, "first", 10_000.0, service=svc)
    assert np.isnan(o.start[0]) and o.start[1] == 0
    assert o.preemptions == 0 and o.lent_gpu_s == 0
    assert o.alloc_gpu_s == pytest.approx(100 + 2 * 3600)


def test_a_pod_that_is_not_preemptible_never_runs_on_lent_gpus() -> None:
    svc = sim.Service(owned=(0,), need=lambda t: 0, lend=True)
    o = sim.run([pod(1, 0, 50, 2, "LS")], NODES, "first", 100.0, service=svc)
    assert np.isnan(o.start[0])  # only S holds 2 GPUs, and S sells to spot work only


def test_the_shipped_tide_peaks_at_the_gpus_the_service_owns() -> None:
    nodes = [node(i, 8) for i in range(10)]
    owned = tides.owned_nodes(nodes, 0.2, seed=0)
    assert sum(nodes[j].gpus for j in owned) == 16 and len(owned) == 2
    t = tides.tide(nodes, owned)
    assert max(t.hourly_gpus) == 16 and min(t.hourly_gpus) >= 0
    assert sum(t.requests_per_hour) == 26_823
    assert t.mean_exec_s == pytest.approx(28.666, abs=1e-3)
    assert t.throughput == pytest.approx(0.6 * 3600 / t.mean_exec_s)
    # a tide: the quietest hours need a small share of the busiest
    assert np.percentile(t.hourly_gpus, 10) <= 0.25 * 16
    assert t.need(0) == t.hourly_gpus[0] and t.need(len(t.hourly_gpus) * HOUR) == t.hourly_gpus[0]


def write(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "requests.csv.gz"
    p.write_bytes(gzip.compress(body.encode()))
    return p


@pytest.mark.parametrize(("body", "says"), [
    ("gmt_create,exec_time_seconds\n2024-11-15 16:57:50,32\n2024-13-01 00:00:00,3\n", "line 3: gmt_create"),
    ("gmt_create,exec_time_seconds\n2024-11-15 16:57:50,-1\n", "line 2: exec_time_seconds"),
    ("gmt_create,exec_time_seconds\n2024-11-15 16:57:50,fast\n", "line 2: exec_time_seconds"),
    ("created,seconds\n2024-11-15 16:57:50,3\n", "lacks gmt_create, exec_time_seconds"),
    ("gmt_create,exec_time_seconds\n", "no rows"),
])
def test_a_bad_request_trace_is_refused_with_its_line(tmp_path: Path, body: str, says: str) -> None:
    with pytest.raises(TraceError, match=says):
        tides.read_requests(write(tmp_path, body))


def test_a_share_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="inference share"):
        tides.owned_nodes([node(0, 8)], 1.0, seed=0)


def test_the_market_lends_the_services_idle_gpus_to_spot_pods_only_within_its_windows() -> None:
    """Ten 8-GPU nodes, two of them the inference service's (20%): 24 best-effort pods and
    6 latency-sensitive ones, 8 GPUs each for 20 hours, arriving an hour apart.
    The market lends the service's idle GPUs to spot pods only, each lent offer open until
    the tide is next expected to reach its node (issue 36): here the pods it lends to fit
    those windows, so none is preempted. Without lending the service's GPUs never serve a
    pod. (Preemption by the tide: the tests above, on hand-made tides.)"""
    from market.simulate import metrics, policies

    nodes = [node(i, 8) for i in range(10)]
    pods = [pod(i, i * HOUR + 1000, 20 * HOUR, 8, "LS" if i % 5 == 0 else "BE") for i in range(30)]
    s = policies.Simulation(pods, nodes, 2 * 86400.0, teams=1, seed=0,
                            service=tides.Options(share=0.2, checkpoint_s=600.0))
    assert len(s.owned) == 2 and s.tide is not None
    lend = s.policy("gridbid")
    keep = s.policy("gridbid-no-preempt")
    owned = set(s.owned)
    for i, j in enumerate(lend.nodes):
        if j in owned:
            assert pods[i].qos == "BE", "only spot pods run on the service's GPUs"
    assert all(j not in owned for j in keep.nodes)
    f_lend = metrics.figures(lend, pods, nodes, s.window_s)
    f_keep = metrics.figures(keep, pods, nodes, s.window_s)
    assert f_lend["lent_gpu_hours"] > 0 and f_keep["lent_gpu_hours"] == 0
    assert f_lend["preemptions"] == 0 and f_lend["work_lost_gpu_s"] == 0
    assert f_keep["preemptions"] == 0
    assert f_lend["utilisation"] > f_keep["utilisation"]
    assert f_lend["jct_mean_s"] < f_keep["jct_mean_s"]


def test_a_preempted_trade_is_billed_for_the_time_it_ran_and_its_resumption_for_the_rest() -> None:
    """The market's q1: preempted at 3,600 s of a 5,000 s trade, billed 3,600 s; it resumes
    at 7,200 s with 2,000 s left and is billed those: 5,600 s on 2 GPUs in all, at the
    clearing prices (the lone bid in each round pays the bottom of the interval, the ask:
    half the node's own on the service's lent node, its own for q2 on N)."""
    from market.simulate import auction

    svc = sim.Service(owned=(0,), need=need, lend=True, checkpoint_s=1000.0)
    asks = [150_000, 150_000]
    m = auction.Market(PODS, NODES, asks, [10_000_000, 10_000_000], spot_only=frozenset({0}))
    o = sim.run(PODS, NODES, "first", 10_000.0, chooser=m, service=svc)
    assert o.finish.tolist() == [9200, 100] and o.preemptions == 1
    assert o.pod_gpu_s == pytest.approx(2 * 5600 + 100)
    # a trade's amount is whole base units (10^-6 USD), rounded down: a few units apart
    assert m.paid == pytest.approx(0.15 * auction.LENT_ASK * 2 * 5600 / 3600 + 0.15 * 100 / 3600, abs=1e-5)


def test_requests_queue_first_come_first_served_on_the_gpus_the_service_serves_on() -> None:
    """One GPU until 100 s, two from then. Requests at 0, 10, 20 (50 s each): the first
    starts at once, the second waits for the first (40 s), the third for the second GPU at
    100 s (80 s)."""
    arrival = np.asarray([0.0, 10.0, 20.0])
    took = np.asarray([50.0, 50.0, 50.0])
    w = tides.serve(arrival, took, [(0.0, 1), (100.0, 1)])
    assert w.tolist() == [0, 40, 80]


def test_a_gpu_taken_away_finishes_its_request_and_a_request_with_no_gpu_left_waits_forever() -> None:
    """Two GPUs at 0, one taken at 10 (the one free soonest), none from 200. Requests at 0
    and 5 (100 s each) hold both; the one at 20 waits for the GPU left (free at 100); the one
    at 250 finds none, ever."""
    arrival = np.asarray([0.0, 5.0, 20.0, 250.0])
    took = np.full(4, 100.0)
    w = tides.serve(arrival, took, [(0.0, 2), (10.0, -1), (200.0, -1)])
    assert w.tolist()[:3] == [0, 0, 85] and w[3] == np.inf


def test_the_scaled_service_gets_its_hours_requests_scaled_and_seeded() -> None:
    nodes = [node(i, 8) for i in range(10)]
    t = tides.tide(nodes, tides.owned_nodes(nodes, 0.2, seed=0))
    arrival, took = tides.requests(t, 5 * HOUR, seed=0)
    again = tides.requests(t, 5 * HOUR, seed=0)
    assert arrival.tolist() == again[0].tolist() and took.tolist() == again[1].tolist()
    per_hour = np.bincount((arrival // HOUR).astype(np.int64), minlength=5)
    assert per_hour.tolist() == [round(t.scale * r) for r in t.requests_per_hour[:5]]
    assert (np.diff(arrival) >= 0).all() and set(took.tolist()) <= set(t.exec_s.tolist())
    # the need is sized so that each hour's GPUs are at most BUSY_TARGET busy on average
    for k in range(5):
        work = took[(arrival // HOUR) == k].sum()
        assert work <= tides.BUSY_TARGET * t.need(k * HOUR) * HOUR * 1.15


def test_the_service_serves_on_a_preempted_pods_gpus_only_after_its_grace() -> None:
    """In hour 1 the tide wants both of S's GPUs, which q1 holds: it takes them at 3,600 s
    and serves on them from 3,630 s (a 30 s grace); the 30 s on 2 GPUs are what it was short."""
    svc = sim.Service(owned=(0,), need=need, lend=True, checkpoint_s=1000.0, grace_s=30.0)
    o = sim.run(PODS, NODES, "first", 10_000.0, service=svc)
    assert o.service_steps[:2] == ((3600.0 + 30.0, 2), (7200.0, -2))
    assert o.service_short_gpu_s == pytest.approx(60)
    alone = sim.run(PODS, NODES, "first", 10_000.0, service=sim.Service(owned=(0,), need=need, lend=False))
    assert alone.service_steps[:2] == ((3600.0, 2), (7200.0, -2)) and alone.service_short_gpu_s == 0


def test_burstable_pods_run_as_spot_when_the_rule_says_so() -> None:
    svc = sim.Service(owned=(0,), need=lambda t: 0, lend=True, spot_qos=("BE", "Burstable"))
    o = sim.run([pod(1, 0, 50, 2, "Burstable")], NODES, "first", 100.0, service=svc)
    assert o.start[0] == 0 and o.node[0] == 0


def test_a_short_spot_pod_backfills_a_lent_window_on_its_prediction_and_waits_without_one() -> None:
    """Issue 36. S (8 GPUs) is the service's, idle until its tide takes all of it in hour 8.
    Six best-effort pods ran 20 minutes each on it in the first hours. Another arrives at
    7:20 for 20 minutes and books an hour (whole hours): 40 minutes are left of S's window.
    Predicting, the market knows 9 in 10 such pods finish within about 20 minutes and
    backfills it: done at 7:40, before the tide. Without a prediction its hour does not fit,
    so it waits for the tide to ebb at 9:00."""
    from market.simulate import auction

    def rises_at_8(t: float) -> int:
        return 8 if 8 * HOUR <= t < 9 * HOUR else 0

    nodes = [node(0, 8)]
    pods = [pod(i, i * 1500.0, 1200.0, 8, "BE") for i in range(6)] + [pod(6, 7 * HOUR + 1200, 1200.0, 8, "BE")]
    svc = sim.Service(owned=(0,), need=rises_at_8, lend=True, checkpoint_s=600.0)
    starts = {}
    for predict in (True, False):
        m = auction.Market(pods, nodes, [150_000], [10_000_000] * 7, spot_only=frozenset({0}), service=svc,
                           spot=frozenset(range(7)), predict=predict)
        o = sim.run(pods, nodes, "first", 12 * HOUR, chooser=m, service=svc)
        assert o.preemptions == 0
        starts[predict] = (float(o.start[6]), m.backfilled)
    assert starts[True] == (7 * HOUR + 1200, 1), "backfilled into the 40 minutes left"
    assert starts[False] == (9 * HOUR, 0), "its booked hour fits only once the tide has ebbed"
    assert auction.Market(pods, nodes, [150_000], [1] * 7, spot_only=frozenset({0}), service=svc).window(0, 7 * HOUR + 1200) == 8 * HOUR

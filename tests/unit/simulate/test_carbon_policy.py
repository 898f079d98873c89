"""The simulator's gridbid-carbon policy (issue 37), worked out by hand: with its carbon
weight on the engine sends a job to the cleaner grid when the carbon is worth more than the
asks differ, and a deferrable pod waits for the cleaner hour its forecast shows."""

from __future__ import annotations

import pytest

from market import carbon
from market.simulate import auction, sim
from market.simulate.trace import Node, Pod

HOUR = 3600.0


def node(i: int, region: str, gpus: int = 8) -> Node:
    return Node(id=f"n{i}", gpus=gpus, model="H100-SXM-80GB", trace_model="H100", region=region, cpu_milli=1, memory_mib=1)


def pod(i: int, arrival: float, runtime: float, gpus: int, qos: str) -> Pod:
    return Pod(id=f"p{i}", arrival=arrival, runtime=runtime, gpus=gpus, gpu_milli=1000, models=(), qos=qos, team=0,
               scheduled_in_trace=True)


class Swing:
    """A forecast that knows its future: us-east 500 g/kWh for the first 3 hours of the window, 100 after."""

    name = "swing"
    forecasts = True

    def hourly(self, region: str, start: int, hours: int) -> tuple[float, ...] | None:
        if region != "us-east":
            return None
        h0 = (start - auction.EPOCH) // 3600
        return tuple(500.0 if h0 + k < 3 else 100.0 for k in range(hours))


def test_the_carbon_weight_sends_a_job_to_the_cleaner_grid_when_carbon_outweighs_the_asks() -> None:
    """An H100 draws 0.7 kW. In hour 0 of the series PJM (us-east) is 341.4 g/kWh and BPAT
    (us-west) far cleaner, so at 0.19 USD per kg a GPU-hour in us-east costs the buyer
    0.7 x (341.4 - BPAT) / 1000 kg more: over 0.02 USD, more than the 0.01 USD its ask is dearer
    in us-west. Without the weight (gridbid) the cheaper us-east offer wins."""
    nodes = [node(0, "us-east"), node(1, "us-west")]
    pods = [pod(1, 0, 1800, 8, "LS")]
    bpat = carbon.EiaReplay().series["BPAT"].g_per_kwh[0]
    assert 0.7 * (341.4 - bpat) / 1000 * 0.19 > 0.01
    for on, where in ((False, 0), (True, 1)):
        m = auction.Market(pods, nodes, [2_000_000, 2_010_000], [9_000_000], carbon_aware=on, predict=False)
        o = sim.run(pods, nodes, "first", 4 * HOUR, chooser=m)
        assert o.node.tolist() == [where], on


def test_a_deferrable_pod_waits_for_the_cleaner_hour_and_a_latency_sensitive_one_does_not() -> None:
    """One 8-GPU node in us-east, dirty (500) for 3 hours, then clean (100). A burstable pod
    (deferrable) arriving at 0:10 for 2 h on 4 GPUs: 5.6 kWh, 2.24 kg less from 3:00, worth
    0.43 USD at 0.19 USD per kg: it waits and starts at 3:00, the start of the clean hours. An
    LS pod alike starts at once."""
    nodes = [node(0, "us-east")]
    pods = [pod(1, 600, 7200, 4, "Burstable"), pod(2, 600, 7200, 4, "LS")]
    m = auction.Market(pods, nodes, [2_000_000], [9_000_000] * 2, carbon_aware=True, predict=False)
    m._feed = carbon.Feed(Swing(), {r.id: r.carbon_g_per_kwh for r in m.regions})
    o = sim.run(pods, nodes, "first", 8 * HOUR, chooser=m)
    assert o.start.tolist() == [3 * HOUR, 600]
    assert m.deferred == {0}
    assert o.finish[0] == pytest.approx(3 * HOUR + 7200)


@pytest.mark.parametrize(("clean_from", "start"), [(7, 6 * HOUR), (9, 600)])
def test_a_deferrable_pod_waits_no_later_than_its_latest_start(clean_from: int, start: float) -> None:
    """Its latest start is 6:10 (DEFER_S, 6 h, after it arrived). Clean from 7:00, a start at
    6:00 runs half of its 2 h in the clean hour (a mean of 300 against 500 now): it waits for
    6:00. Clean from 9:00, no start by 6:10 reaches a clean hour: it starts at once."""

    class Late(Swing):
        def hourly(self, region: str, begin: int, hours: int) -> tuple[float, ...] | None:
            h0 = (begin - auction.EPOCH) // 3600
            return None if region != "us-east" else tuple(500.0 if h0 + k < clean_from else 100.0 for k in range(hours))

    nodes = [node(0, "us-east")]
    pods = [pod(1, 600, 7200, 4, "Burstable")]
    m = auction.Market(pods, nodes, [2_000_000], [9_000_000], carbon_aware=True, predict=False)
    m._feed = carbon.Feed(Late(), {r.id: r.carbon_g_per_kwh for r in m.regions})
    o = sim.run(pods, nodes, "first", 10 * HOUR, chooser=m)
    assert o.start.tolist() == [start]

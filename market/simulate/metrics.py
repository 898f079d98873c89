"""What a policy's runs come to: the figures of ``summary.json``, each defined in
docs/simulate.md. Money is in USD at the catalogue's hourly rates
(``providers.catalogue``), carbon at each GPU model's TDP and the region's grid intensity hour
by hour (``market.carbon``: us-east, us-central and us-west replay their grids' 2022 series,
the window's second 0 taken as ``CARBON_EPOCH``, 1 January 00:00 UTC; any other region
its catalogue constant)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from market import carbon
from providers import catalogue

from .policies import PolicyResult
from .sim import F64, Outcome
from .trace import Node, Pod


def _r(x: float | None, digits: int = 6) -> float | None:
    """A float as JSON writes it the same on every run: rounded, and None for NaN."""
    if x is None or not np.isfinite(x):
        return None
    return round(float(x), digits)


CARBON_EPOCH = 1_640_995_200  # 2022-01-01T00:00:00Z: the window's second 0 on the grids' clock
_replay: carbon.EiaReplay | None = None


def grid_g_per_kwh(region: str, start_s: float, seconds: float) -> float:
    """The mean intensity of ``region``'s grid over ``seconds`` from the window's ``start_s``."""
    global _replay
    if _replay is None:
        _replay = carbon.EiaReplay()
    t = CARBON_EPOCH + int(start_s)
    hours = min(int((t % 3600 + seconds) // 3600) + 1, 24 * 400)
    series = _replay.hourly(region, t, hours)
    if series is None:
        return float(catalogue.regions()[region].carbon_g_per_kwh)
    return carbon.mean_over(series, t, seconds)


def kg_co2(o: Outcome, where: Sequence[int], pods: Sequence[Pod], nodes: Sequence[Node]) -> float:
    """The kg CO2 of a run: each pod that started, its GPUs at their model's TDP for its
    runtime, at its node's (``where``: trace node indices) grid over the hours it ran."""
    models = catalogue.gpu_models()
    kg = 0.0
    for i in np.flatnonzero(~np.isnan(o.start)).tolist():
        nd = nodes[int(where[i])]
        kwh = pods[i].gpus * models[nd.model].tdp_watts / 1000 * pods[i].runtime / 3600
        kg += kwh * grid_g_per_kwh(nd.region, float(o.start[i]), pods[i].runtime) / 1000
    return kg


def at_slo(res: PolicyResult, pods: Sequence[Pod], nodes: Sequence[Node]) -> dict[str, Any]:
    """Carbon, job times and the market's cost on the cluster at the SLO (``res.there``): the
    policy's own, or for gridbid-carbon gridbid's (``at_slo_cluster`` says whose)."""
    t = res.there
    if t is None:
        return {"at_slo_cluster": None, "kg_co2_at_slo": None, "jct_mean_s_at_slo": None, "queue_p95_s_at_slo": None,
                "cost_per_gpu_hour_at_slo": None, "deferred_pods_at_slo": None}
    arrival = np.asarray([p.arrival for p in pods], dtype=np.float64)
    ran = ~np.isnan(t.start)
    jct = (t.finish - arrival)[ran]
    queue = t.waited[ran & ~np.isnan(t.waited)]
    return {
        "at_slo_cluster": res.there_of,
        "kg_co2_at_slo": _r(kg_co2(t, res.there_nodes, pods, nodes), 6),
        "jct_mean_s_at_slo": _r(float(jct.mean()) if len(jct) else None, 3),
        "queue_p95_s_at_slo": _r(float(np.percentile(queue, 95)) if len(queue) else None, 3),
        "cost_per_gpu_hour_at_slo": _r(res.there_paid / (t.pod_gpu_s / 3600)) if res.there_paid is not None and t.pod_gpu_s else None,
        "deferred_pods_at_slo": res.there_deferred,
    }


def work_gpu_s(pods: Sequence[Pod]) -> float:
    """The window's work: GPUs x runtime of every pod that arrived in it."""
    return float(sum(p.gpus * p.runtime for p in pods))


def rate_per_hour(nodes: Sequence[Node], idx: Sequence[int]) -> float:
    """What the nodes ``idx`` cost an hour, owned, at the catalogue's rate per GPU-hour."""
    models = catalogue.gpu_models()
    return float(sum(nodes[j].gpus * models[nodes[j].model].usd_per_hour for j in idx))


def jain(xs: Sequence[float]) -> float | None:
    """Jain's fairness index of ``xs``: 1 when all are equal, 1/n when one takes everything."""
    a = np.asarray(xs, dtype=np.float64)
    if not len(a) or float((a * a).sum()) == 0.0:
        return None
    return float(a.sum() ** 2 / (len(a) * (a * a).sum()))


def figures(res: PolicyResult, pods: Sequence[Pod], nodes: Sequence[Node], window_s: float) -> dict[str, Any]:
    """One policy's entry of ``summary.json``."""
    o = res.outcome
    arrival: F64 = np.asarray([p.arrival for p in pods], dtype=np.float64)
    runtime: F64 = np.asarray([p.runtime for p in pods], dtype=np.float64)
    started = ~np.isnan(o.start)
    queue = o.waited[started & ~np.isnan(o.waited)]  # all the time waiting, again after each preemption
    jct = (o.finish - arrival)[started]
    capacity = sum(n.gpus for n in nodes)
    hours = window_s / 3600
    cap = res.capacity
    useful_h = (cap.alloc_gpu_s if cap is not None else o.alloc_gpu_s) / 3600  # GPU-hours held within the window
    bought_h = o.pod_gpu_s / 3600  # GPU-hours the pods held, preempted stretches included
    owned = cap.nodes if cap is not None else tuple(range(len(nodes)))
    owned_cost = rate_per_hour(nodes, owned) * hours
    kg = kg_co2(o, res.nodes, pods, nodes)
    slow: dict[int, list[float]] = {}
    for i in np.flatnonzero(started).tolist():
        slow.setdefault(pods[i].team, []).append(float((o.finish[i] - arrival[i]) / runtime[i]))
    team_slowdown = [float(np.mean(v)) for _, v in sorted(slow.items())]

    def pct(a: F64, q: float) -> float | None:
        return float(np.percentile(a, q)) if len(a) else None

    return {
        "utilisation": _r(o.alloc_gpu_s / (capacity * window_s)),
        "busy_utilisation": _r(o.busy_gpu_s / (capacity * window_s)),
        "capacity_at_slo_gpus": None if cap is None else cap.gpus,
        "capacity_at_slo_fraction": None if cap is None else _r(cap.fraction),
        "utilisation_at_slo": None if cap is None else _r(cap.alloc_gpu_s / (cap.gpus * window_s)),
        "stranded_gpu_fraction_at_slo": None if cap is None else _r(cap.stranded_gpu_s / (cap.gpus * window_s)),
        "jct_mean_s": _r(float(jct.mean()) if len(jct) else None, 3),
        "jct_p50_s": _r(pct(jct, 50), 3),
        "jct_p95_s": _r(pct(jct, 95), 3),
        "queue_mean_s": _r(float(queue.mean()) if len(queue) else None, 3),
        "queue_p95_s": _r(pct(queue, 95), 3),
        "unscheduled": o.unscheduled,
        "cost_per_gpu_hour": _r(res.paid / bought_h if bought_h else None) if res.paid is not None
        else _r(owned_cost / useful_h if useful_h else None),
        "cost_basis": "what the market's rounds charged (a preempted trade pro rata), per GPU-hour the pods held"
        if res.paid is not None
        else "owned capacity at the SLO (the whole cluster where the SLO is not met) over the window, at catalogue rates, "
             "idle time included, per GPU-hour held on it within the window",
        "provider_revenue": _r(res.paid, 2) if res.paid is not None else None,
        "rounds": res.rounds if res.paid is not None else None,
        "kg_co2": _r(kg, 6),
        "deferred_pods": res.deferred,
        **at_slo(res, pods, nodes),
        "preemptions": o.preemptions,
        "work_lost_gpu_s": _r(o.work_lost_gpu_s, 3),
        "lent_gpu_hours": _r(o.lent_gpu_s / 3600, 3),
        "preemptions_at_slo": None if cap is None else cap.preemptions,
        "work_lost_gpu_s_at_slo": None if cap is None else _r(cap.work_lost_gpu_s, 3),
        "lent_gpu_hours_at_slo": None if cap is None else _r(cap.lent_gpu_s / 3600, 3),
        "jain": _r(jain(team_slowdown)),
        "worst_team_slowdown": _r(max(team_slowdown) if team_slowdown else None),
        "stranded_gpu_fraction": _r(o.stranded_gpu_s / (capacity * window_s)),
        "inference": None if res.inference is None else {
            "requests": res.inference.requests,
            "queue_mean_s": _r(res.inference.queue_mean_s, 3),
            "queue_p95_s": _r(res.inference.queue_p95_s, 3),
            "queue_p99_s": _r(res.inference.queue_p99_s, 3),
            "waited_share": _r(res.inference.waited_share),
            "short_gpu_s": _r(res.inference.short_gpu_s, 3),
        },
        "utilisation_over_time": [_r(x / capacity, 5) for x in o.timeline.tolist()],
    }

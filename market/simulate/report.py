"""``summary.json``: the trace, its window, the cluster, and each policy's figures.

Written the same, byte for byte, for the same trace, window, policies and seed: keys
sorted, floats rounded (``metrics._r``), no timestamps."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .metrics import figures, work_gpu_s
from .policies import POLICIES, Progress, Simulation, _quiet
from .trace import Trace, load_inside, offered_load


def summarise(trace: Trace, policies: Sequence[str] = POLICIES, seed: int = 0, progress: Progress = _quiet) -> dict[str, Any]:
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise ValueError(f"unknown policy {', '.join(unknown) or '(none given)'}: choose from {', '.join(POLICIES)}")
    sim = Simulation(trace.pods, trace.nodes, trace.window_s, trace.teams, seed, progress)
    out: dict[str, Any] = {}
    for name in policies:
        out[name] = figures(sim.policy(name), trace.pods, trace.nodes, trace.window_s)
    models: dict[str, int] = {}
    regions: dict[str, int] = {}
    for n in trace.nodes:
        models[n.model] = models.get(n.model, 0) + n.gpus
        regions[n.region] = regions.get(n.region, 0) + n.gpus
    return {
        "trace": trace.name,
        "window": {
            "start_s": trace.window_start,
            "length_s": round(trace.window_s, 3),
            "days": round(trace.window_s / 86400, 4),
            "load": trace.load_factor,
            "time_scale": round(trace.time_scale, 9),
            "offered_load": round(offered_load(trace.pods, trace.nodes, trace.window_s), 6),
            "load_inside": round(load_inside(trace.pods, trace.nodes, trace.window_s), 6),
            "pods": len(trace.pods),
            "work_gpu_hours": round(work_gpu_s(trace.pods) / 3600, 3),
            "left_out": dict(sorted(trace.left_out.items())),
        },
        "cluster": {
            "nodes": len(trace.nodes),
            "gpus": sum(n.gpus for n in trace.nodes),
            "gpus_by_model": dict(sorted(models.items())),
            "gpus_by_region": dict(sorted(regions.items())),
            "teams": trace.teams,
            "seed": seed,
        },
        "policies": out,
    }


def write(summary: dict[str, Any], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "summary.json"
    path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return path

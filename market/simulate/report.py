"""``summary.json``: the trace, its window, the cluster, and each policy's figures.

Written the same, byte for byte, for the same trace, window, policies and seed: keys
sorted, floats rounded (``metrics._r``), no timestamps."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .auction import CARBON_WEIGHT
from .metrics import figures, work_gpu_s
from .policies import DEFAULT_POLICIES, POLICIES, PolicyResult, Progress, Simulation, _quiet
from .prediction import evaluate as prediction_evaluate
from .tides import Options
from .trace import Trace, load_inside, offered_load


def simulate(trace: Trace, policies: Sequence[str] = DEFAULT_POLICIES, seed: int = 0,
             progress: Progress = _quiet, service: Options = Options(),
             carbon_weight: float = CARBON_WEIGHT) -> tuple[dict[str, PolicyResult], Simulation]:
    """Each policy of ``policies`` run over ``trace``, in that order."""
    unknown = [p for p in policies if p not in POLICIES]
    if unknown or not policies:
        raise ValueError(f"unknown policy {', '.join(unknown) or '(none given)'}: choose from {', '.join(POLICIES)}")
    sim = Simulation(trace.pods, trace.nodes, trace.window_s, trace.teams, seed, progress, service, carbon_weight)
    return {name: sim.policy(name) for name in policies}, sim


def summarise(trace: Trace, policies: Sequence[str] = DEFAULT_POLICIES, seed: int = 0, progress: Progress = _quiet,
              service: Options = Options()) -> dict[str, Any]:
    results, sim = simulate(trace, policies, seed, progress, service)
    return summary(trace, results, seed, sim)


def summary(trace: Trace, results: dict[str, PolicyResult], seed: int, sim: Simulation | None = None,
            fills: dict[str, Any] | None = None) -> dict[str, Any]:
    out = {name: figures(res, trace.pods, trace.nodes, trace.window_s) for name, res in results.items()}
    service: dict[str, Any] | None = None
    if sim is not None and sim.tide is not None:
        t = sim.tide
        service = {
            "trace": "alibaba-genai-2026",
            "share": round(t.owned_gpus / sum(n.gpus for n in trace.nodes), 6),
            "owned_nodes": len(sim.owned),
            "owned_gpus": t.owned_gpus,
            "gpu_hours": round(sim.service_gpu_s / 3600, 3),
            "peak_gpus": max(t.hourly_gpus),
            "mean_gpus": round(float(sum(t.hourly_gpus)) / len(t.hourly_gpus), 3),
            "requests": sum(t.requests_per_hour),
            "mean_exec_s": round(t.mean_exec_s, 3),
            "requests_per_gpu_hour": round(t.throughput, 3),
            "checkpoint_s": sim.options.checkpoint_s,
            "grace_s": sim.options.grace_s,
            "spot_qos": list(sim.options.spot_qos),
            "scale": round(t.scale, 6),
            # per hour of the window, the GPUs it needs: what the report's tide chart draws
            "need_over_time": [t.need(k * 3600.0) for k in range(math.ceil(trace.window_s / 3600))],
        }
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
        "inference_service": service,
        # the market's runtime predictor on the trace, chronologically (policy-free: prediction.py)
        "runtime_prediction": prediction_evaluate(trace.pods, trace.window_s).as_dict(),
        # issue 38, with --fill: FGD's fill experiment (market/simulate/fill.py), its run times left out
        "fill": {p: {"placed": f.placed, "allocated": f.allocated, "stranded": f.stranded, "fragmented": f.fragmented,
                     "failed_pod": f.failed_pod, "inflated_stranded": f.inflated_stranded, "inflated_skipped": f.inflated_skipped}
                 for p, f in (fills or {}).items()} or None,
    }


def write(summary: dict[str, Any], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "summary.json"
    path.write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    return path


CHARTS = ("utilisation.png", "jct_cdf.png", "queue_cdf.png", "cost_carbon.png", "capacity.png")
TIDE_CHART = "tide.png"  # with an inference service, beside them


def charts(trace: Trace, results: dict[str, PolicyResult], summary: dict[str, Any], out: Path) -> list[Path]:
    """The report's charts as PNG files in ``out`` (matplotlib, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    names = list(results)
    pol = summary["policies"]
    arrival = np.asarray([p.arrival for p in trace.pods], dtype=np.float64)
    days = trace.window_s / 86400
    paths: list[Path] = []

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        path = out / name
        fig.savefig(path, dpi=110, metadata={"Software": None})
        plt.close(fig)
        paths.append(path)

    fig, ax = plt.subplots(figsize=(9, 3.6))
    for name in names:
        y = np.asarray(pol[name]["utilisation_over_time"], dtype=np.float64) * 100
        x = (np.arange(len(y)) + 0.5) * days / len(y)
        ax.plot(x, y, label=name, lw=1.3)
    ax.set_xlabel("day of the window")
    ax.set_ylabel("GPUs held, % of the trace's cluster")
    ax.set_title("Utilisation over time, on the trace's own cluster")
    ax.legend(fontsize=8)
    save(fig, CHARTS[0])

    for chart, what, title in ((CHARTS[1], "jct", "Job completion time"), (CHARTS[2], "queue", "Queueing delay")):
        fig, ax = plt.subplots(figsize=(6.4, 3.8))
        for name in names:
            o = results[name].outcome
            ran = ~np.isnan(o.start)
            v = (o.finish - arrival)[ran] if what == "jct" else o.waited[ran]
            v = v[~np.isnan(v)]
            v = np.sort(np.maximum(v, 1.0))
            ax.step(v, np.arange(1, len(v) + 1) / max(1, len(v)), where="post", label=name, lw=1.3)
        ax.set_xscale("log")
        ax.set_xlabel("seconds (log)")
        ax.set_ylabel("share of pods")
        ax.set_title(f"{title}, CDF")
        ax.legend(fontsize=8)
        save(fig, chart)

    def bars(name: str, left: tuple[str, str, list[float]], right: tuple[str, str, list[float]]) -> None:
        fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
        for ax, (title, colour, values) in zip(axes, (left, right), strict=True):
            ax.bar(names, values, color=colour)
            ax.set_title(title)
            ax.tick_params(axis="x", rotation=30, labelsize=8)
        save(fig, name)

    bars(CHARTS[3], ("USD per GPU-hour", "#3b7dd8", [pol[n]["cost_per_gpu_hour"] or 0.0 for n in names]),
         ("kg CO2", "#5a9e5a", [pol[n]["kg_co2"] or 0.0 for n in names]))
    bars(CHARTS[4], ("GPUs needed for p95 queueing <= 10 min", "#c0504d", [pol[n]["capacity_at_slo_gpus"] or 0 for n in names]),
         ("Utilisation at that capacity, %", "#8064a2", [(pol[n]["utilisation_at_slo"] or 0.0) * 100 for n in names]))
    svc = summary.get("inference_service")
    if svc:  # the tide: what the service owns, what it needs hour by hour; the gap is what it can lend
        need = np.asarray(svc["need_over_time"], dtype=np.float64)
        hours = np.arange(len(need) + 1) / 24
        fig, ax = plt.subplots(figsize=(9, 3.2))
        ax.stairs(need, hours, fill=True, color="#3b7dd8", alpha=0.6, label="GPUs it needs (its requests / a GPU's throughput)")
        ax.axhline(svc["owned_gpus"], color="#c0504d", lw=1.2, label=f"GPUs it owns ({svc['owned_gpus']:,})")
        lent = {n: pol[n].get("lent_gpu_hours_at_slo") for n in names if pol[n].get("lent_gpu_hours_at_slo")}
        extra = "; lent at the SLO: " + ", ".join(f"{n} {v:,.0f} GPU-h" for n, v in lent.items()) if lent else ""
        ax.set_title(f"The inference service's tide: idle between the line and the fill{extra}", fontsize=9)
        ax.set_xlabel("day of the window")
        ax.set_ylabel("GPUs")
        ax.set_ylim(0, svc["owned_gpus"] * 1.35)
        ax.legend(fontsize=8, loc="upper right", ncols=2)
        save(fig, TIDE_CHART)
    return paths


ROWS = (
    ("utilisation_at_slo", "utilisation at the SLO", "{:.1%}"),
    ("capacity_at_slo_gpus", "GPUs needed at the SLO", "{:,}"),
    ("utilisation", "utilisation, trace's cluster", "{:.2%}"),
    ("busy_utilisation", "busy utilisation (GPU share)", "{:.2%}"),
    ("jct_mean_s", "job time, mean (s)", "{:,.0f}"),
    ("jct_p95_s", "job time, p95 (s)", "{:,.0f}"),
    ("queue_mean_s", "queueing, mean (s)", "{:,.1f}"),
    ("queue_p95_s", "queueing, p95 (s)", "{:,.1f}"),
    ("unscheduled", "never started", "{:,}"),
    ("cost_per_gpu_hour", "USD per GPU-hour", "{:.3f}"),
    ("provider_revenue", "provider revenue (USD)", "{:,.2f}"),
    ("kg_co2", "kg CO2", "{:,.1f}"),
    ("jain", "Jain's index, team slowdown", "{:.3f}"),
    ("worst_team_slowdown", "worst team slowdown", "{:.2f}"),
    ("stranded_gpu_fraction", "stranded GPUs", "{:.3%}"),
)
SERVICE_ROWS = (  # with an inference service (--inference-share)
    ("lent_gpu_hours", "GPU-hours lent by the inference service", "{:,.0f}"),
    ("preemptions", "spot pods preempted by its tide", "{:,}"),
    ("work_lost_gpu_s", "work lost to preemption (GPU-s)", "{:,.0f}"),
    ("lent_gpu_hours_at_slo", "... lent, on the cluster at the SLO", "{:,.0f}"),
    ("preemptions_at_slo", "... preempted, on the cluster at the SLO", "{:,}"),
    ("work_lost_gpu_s_at_slo", "... work lost there (GPU-s)", "{:,.0f}"),
    ("inference.queue_p95_s", "inference requests' queueing, p95 (s)", "{:,.2f}"),
    ("inference.queue_p99_s", "inference requests' queueing, p99 (s)", "{:,.2f}"),
    ("inference.waited_share", "inference requests that waited", "{:.2%}"),
    ("inference.short_gpu_s", "GPU-s it waited for checkpoints", "{:,.0f}"),
)
CARBON_ROWS = (  # with gridbid-carbon: both markets on one cluster at the SLO, gridbid's
    ("deferred_pods", "pods that waited for a cleaner hour", "{:,}"),
    ("at_slo_cluster", "on whose cluster at the SLO", "{}"),
    ("kg_co2_at_slo", "... kg CO2 there", "{:,.1f}"),
    ("jct_mean_s_at_slo", "... job time, mean (s)", "{:,.0f}"),
    ("queue_p95_s_at_slo", "... queueing, p95 (s)", "{:,.1f}"),
    ("cost_per_gpu_hour_at_slo", "... USD per GPU-hour", "{:.3f}"),
    ("deferred_pods_at_slo", "... pods that waited for a cleaner hour", "{:,}"),
)


def _get(figures: dict[str, Any], key: str) -> object:
    head, _, rest = key.partition(".")
    v = figures.get(head)
    return v.get(rest) if rest and isinstance(v, dict) else (None if rest else v)


def html(summary: dict[str, Any], images: Sequence[Path]) -> str:
    """A self-contained report: the figures as a table, the charts inline (base64 PNG)."""
    import base64
    from html import escape

    pol = summary["policies"]
    names = list(pol)
    w, c = summary["window"], summary["cluster"]

    def cell(v: object, fmt: str) -> str:
        return "–" if v is None else escape(fmt.format(v))

    head = "".join(f"<th>{escape(n)}</th>" for n in names)
    rows = "".join(
        f"<tr><th>{escape(label)}</th>" + "".join(f"<td>{cell(_get(pol[n], key), fmt)}</td>" for n in names) + "</tr>"
        for key, label, fmt in ROWS + (SERVICE_ROWS if summary.get("inference_service") else ()) + (CARBON_ROWS if "gridbid-carbon" in pol else ())
    )
    imgs = "".join(
        f'<figure><img alt="{escape(p.stem)}" src="data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()}"></figure>'
        for p in images
    )
    left = ", ".join(f"{k} {v:,}" for k, v in w["left_out"].items()) or "none"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gridbid simulate: {escape(summary['trace'])}</title>
<style>body{{font:14px system-ui,sans-serif;margin:2rem auto;max-width:980px;color:#222}}
table{{border-collapse:collapse;margin:1rem 0}}th,td{{padding:.3rem .7rem;border-bottom:1px solid #ddd;text-align:right}}
th:first-child{{text-align:left}}img{{max-width:100%}}figure{{margin:1rem 0}}.note{{color:#555}}</style></head>
<body><h1>What a shared, scheduled pool buys: {escape(summary['trace'])}</h1>
<p>{w['pods']:,} GPU pods over {w['days']:g} days (window from trace second {w['start_s']:g}{'' if w['load'] is None else f", compressed to offered load {w['load']:g}"}),
on {c['nodes']:,} nodes with {c['gpus']:,} GPUs, {c['teams']} teams, seed {c['seed']}. Offered load {w['offered_load']:.4f}
({w['load_inside']:.4f} inside the window). Left out: {escape(left)}.</p>
<p class="note">The SLO: every pod that fits the cluster starts, with the 95th percentile of queueing delay at most 10 minutes.
"Utilisation at the SLO" is the utilisation of the smallest cluster on which each policy meets it: what a fleet costs.
Every figure is defined in docs/simulate.md; the numbers are those of summary.json beside this file.</p>
<table><tr><th></th>{head}</tr>{rows}</table>{_prediction_html(summary.get("runtime_prediction"))}{_fill_html(summary.get("fill"))}{imgs}</body></html>
"""


def _fill_html(fill: dict[str, Any] | None) -> str:
    """The fill experiment (issue 38) as a table, where it ran."""
    from html import escape

    if not fill:
        return ""
    rows = "".join(f"<tr><th>{escape(p)}</th><td>{f['placed']:,}</td><td>{f['allocated']:.2%}</td><td>{f['stranded']:.2%}</td>"
                   f"<td>{f['fragmented']:.2%}</td><td>{f['inflated_stranded']:.2%}</td><td>{f['inflated_skipped']:,}</td></tr>" for p, f in fill.items())
    return ("<h2>Fill experiment</h2><p class=\"note\">The window's pods placed in arrival order, none leaving, until the first "
            "that no node can take (FGD's experiment): the share of the GPUs allocated then, the share left free (stranded), and "
            "the share the pods' demand could not use (fragmented). Then as FGD measures: the pods submitted again and again, those no node "
            "can take skipped, until the requests reach 130% of the capacity: the share left free then, and the pods skipped.</p>"
            "<table><tr><th>placement</th><th>pods placed</th><th>allocated</th><th>stranded</th><th>fragmented</th>"
            "<th>stranded at 130%</th><th>skipped</th></tr>" + rows + "</table>")


def _prediction_html(pred: dict[str, Any] | None) -> str:
    """The runtime predictor's error and coverage beside the baseline's, as a small table."""
    from html import escape

    if not pred or not pred.get("model"):
        return "<p class=\"note\">Runtime prediction: too few pods finished before the window's later pods to score it.</p>"

    def cells(b: dict[str, Any] | None) -> str:
        if b is None:
            return "<td>–</td>" * 3
        cov = "–" if b["coverage_p10_p90"] is None else f"{b['coverage_p10_p90']:.1%}"
        return f"<td>{b['mape']:.1%}</td><td>{b['median_ape']:.1%}</td><td>{cov}</td>"

    return (f"<h2>Runtime prediction</h2><p class=\"note\">The market's predictor (market/runtime.py) refitted every "
            f"{pred['refit_s'] / 3600:g} h on the pods finished by then, scored on the {pred['jobs']:,} pods that arrived before "
            f"its next refit (after a {pred['warmup_s'] / 3600:g} h warm-up): keys {escape(' / '.join(pred['keys']))}. "
            "The point is p50 (the baseline's: the key's mean); coverage is how many ran inside p10-p90 (80% nominal).</p>"
            "<table><tr><th></th><th>MAPE</th><th>median APE</th><th>in p10-p90</th></tr>"
            f"<tr><th>quantiles per key, shrunk and calibrated</th>{cells(pred['model'])}</tr>"
            f"<tr><th>baseline: the key's mean</th>{cells(pred['baseline_key_mean'])}</tr></table>")


def write_report(trace: Trace, results: dict[str, PolicyResult], summary: dict[str, Any], out: Path) -> Path:
    """summary.json, the charts and report.html in ``out``; returns the report's path."""
    write(summary, out)
    images = charts(trace, results, summary, out)
    path = out / "report.html"
    path.write_text(html(summary, images))
    return path

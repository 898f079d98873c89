"""`gridbid simulate` as a person runs it: a real process, a real trace, a report folder."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from market.simulate import report, trace


def simulate(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gridbid.cli", "simulate", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=300, check=False)


def test_a_day_of_the_shipped_trace_writes_its_summary(tmp_path: Path) -> None:
    done = simulate("--days", "1", "--out", str(tmp_path / "r"), cwd=Path.cwd())
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["trace"] == "alibaba-gpu-2023"
    assert set(summary["policies"]) == {"static", "static-sized", "fifo", "best-fit", "gridbid"}
    assert summary["cluster"]["gpus"] == 6212 and summary["window"]["days"] == 1
    for name, f in summary["policies"].items():
        assert 0 < f["utilisation"] <= 1, name
        assert f["utilisation_at_slo"] is not None and 0 < f["utilisation_at_slo"] <= 1, name
        assert f["stranded_gpu_fraction_at_slo"] >= 0 and f["stranded_gpu_fraction_at_slo"] + f["utilisation_at_slo"] <= 1 + 1e-9, name  # free + held
        assert f["capacity_at_slo_gpus"] <= 6212
    # the shared pool needs no more capacity than the silos at the same SLO
    pol = summary["policies"]
    assert pol["fifo"]["capacity_at_slo_gpus"] <= pol["static"]["capacity_at_slo_gpus"]
    # the market's cost is what its rounds charged: within the asks' and limits' spreads
    gb = pol["gridbid"]
    assert gb["rounds"] > 0 and gb["provider_revenue"] > 0
    assert 0 < gb["cost_per_gpu_hour"] < 6
    assert gb["capacity_at_slo_gpus"] <= pol["static"]["capacity_at_slo_gpus"]
    assert "gridbid" in done.stdout and "wrote" in done.stdout
    # issue 36: the runtime predictor scored on the day's later pods, beside its baseline
    pred = summary["runtime_prediction"]
    assert pred["jobs"] > 0 and 0 < pred["model"]["coverage_p10_p90"] <= 1 and pred["baseline_key_mean"]["mape"] > 0
    assert "runtime prediction" in done.stdout and "Runtime prediction" in (tmp_path / "r" / "report.html").read_text()
    page = (tmp_path / "r" / "report.html").read_text()
    assert page.count("data:image/png;base64,") == len(report.CHARTS)  # self-contained
    assert "utilisation at the SLO" in page and "gridbid" in page
    for chart in report.CHARTS:
        assert (tmp_path / "r" / chart).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_same_seed_gives_the_same_summary_byte_for_byte(tmp_path: Path) -> None:
    tr = trace.load(days=0.25, seed=5)
    a = report.write(report.summarise(tr, seed=5), tmp_path / "a").read_bytes()
    b = report.write(report.summarise(trace.load(days=0.25, seed=5), seed=5), tmp_path / "b").read_bytes()
    assert a == b


def test_a_malformed_pod_list_is_refused_with_its_line(tmp_path: Path) -> None:
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"
                    "p0,1000,1024,1,1000,,LS,Running,0,100,0\n"
                    "p1,1000,1024,one,1000,,LS,Running,10,100,10\n")
    done = simulate("--pods", str(pods), "--out", str(tmp_path / "r"), cwd=Path.cwd())
    assert done.returncode == 2
    assert "line 3" in done.stderr and "num_gpu" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "r").exists()


def test_a_pod_list_without_times_is_refused(tmp_path: Path) -> None:
    pods = tmp_path / "pods.csv"
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos\np0,1000,1024,1,1000,,LS\n")
    done = simulate("--pods", str(pods), cwd=tmp_path)
    assert done.returncode == 2 and "creation_time" in done.stderr and "Traceback" not in done.stderr


def test_an_unknown_policy_or_a_start_without_days_is_refused(tmp_path: Path) -> None:
    done = simulate("--policies", "fifo,gang", cwd=tmp_path)
    assert done.returncode == 2 and "unknown policy gang" in done.stderr
    done = simulate("--start", "100", cwd=tmp_path)
    assert done.returncode == 2 and "--start needs --days" in done.stderr


def test_an_inference_service_lends_its_tide_in_the_market_and_the_summary_says_so(tmp_path: Path) -> None:
    done = simulate("--days", "0.25", "--inference-share", "0.2", "--policies", "best-fit,gridbid,gridbid-no-preempt",
                    "--out", str(tmp_path / "r"), cwd=Path.cwd())
    assert done.returncode == 0, done.stderr
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    svc = summary["inference_service"]
    assert svc["trace"] == "alibaba-genai-2026" and 0.2 <= svc["share"] < 0.25
    assert svc["peak_gpus"] == svc["owned_gpus"] and svc["gpu_hours"] > 0
    pol = summary["policies"]
    assert pol["gridbid-no-preempt"]["lent_gpu_hours"] == 0 and pol["gridbid-no-preempt"]["preemptions"] == 0
    # the service's GPUs count in every policy's utilisation
    assert pol["best-fit"]["utilisation"] >= svc["gpu_hours"] / (summary["cluster"]["gpus"] * 6)
    # its requests, one by one: served on its own slice (best-fit, no lending) alike
    assert svc["grace_s"] == 30 and svc["spot_qos"] == ["BE", "Burstable"]
    alone = pol["best-fit"]["inference"]
    assert alone["requests"] > 0 and alone == pol["gridbid-no-preempt"]["inference"]
    assert alone["short_gpu_s"] == 0 and alone["queue_p95_s"] >= 0
    lent = pol["gridbid"]["inference"]
    assert lent["requests"] == alone["requests"]
    # the tide, drawn: its need per hour of the window beside what it owns
    assert len(svc["need_over_time"]) == 6 and max(svc["need_over_time"]) <= svc["owned_gpus"]
    assert (tmp_path / "r" / report.TIDE_CHART).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "r" / "report.html").read_text().count("data:image/png;base64,") == len(report.CHARTS) + 1
    assert pol["static-sized" if "static-sized" in pol else "best-fit"]["inference"] is not None


def test_a_spot_qos_that_is_not_one_is_refused(tmp_path: Path) -> None:
    done = simulate("--inference-share", "0.2", "--spot-qos", "BE,LS", cwd=tmp_path)
    assert done.returncode == 2 and "LS is not a QoS that may run as spot" in done.stderr
    assert "Traceback" not in done.stderr


def test_the_carbon_policy_is_compared_with_gridbid_on_the_trace_and_on_gridbids_cluster(tmp_path: Path) -> None:
    done = simulate("--days", "0.25", "--policies", "gridbid,gridbid-carbon", "--out", str(tmp_path / "r"), cwd=Path.cwd())
    assert done.returncode == 0, done.stderr
    pol = json.loads((tmp_path / "r" / "summary.json").read_text())["policies"]
    gb, green = pol["gridbid"], pol["gridbid-carbon"]
    assert green["kg_co2"] <= gb["kg_co2"], "the same pods, placed with carbon priced"
    assert green["capacity_at_slo_gpus"] is None and green["at_slo_cluster"] == "gridbid" and gb["at_slo_cluster"] == "gridbid"
    assert green["kg_co2_at_slo"] is not None and green["deferred_pods"] is not None and gb["deferred_pods"] is None
    assert "carbon: on the trace's cluster" in done.stdout and "gridbid-carbon" in done.stdout
    assert "on whose cluster at the SLO" in (tmp_path / "r" / "report.html").read_text()


def test_the_fill_experiment_runs_with_fill_and_the_report_has_it(tmp_path: Path) -> None:
    shipped = Path(trace.__file__).parent / "data" / "alibaba-gpu-2023" / "openb_node_list_gpu_node.csv"
    lines = shipped.read_text().splitlines()
    nodes = tmp_path / "nodes.csv"
    nodes.write_text("\n".join(lines[:13]) + "\n")  # the first 12 nodes: a small cluster the day's pods fill
    done = simulate("--days", "0.25", "--nodes", str(nodes), "--policies", "best-fit", "--fill", "--out", str(tmp_path / "r"), cwd=Path.cwd())
    assert done.returncode == 0, done.stderr
    got = json.loads((tmp_path / "r" / "summary.json").read_text())["fill"]
    assert set(got) == {"first-fit", "best-fit", "fgd", "fgd-sized", "gridbid", "gridbid-pack"}
    for name, f in got.items():
        assert f["placed"] > 0 and f["failed_pod"] and 0 < f["allocated"] <= 1, name
        assert f["stranded"] == pytest.approx(1 - f["allocated"], abs=1e-6) and 0 <= f["fragmented"] <= f["stranded"] + 1e-9, name
    assert "fill experiment" in done.stdout and "Fill experiment" in (tmp_path / "r" / "report.html").read_text()

"""The process runtime: environment, limits, timeouts, group kill, output cap, preemption."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from providers.agent.runtime import (
    JobPaths,
    Limits,
    RuntimeError_,
    process_alive,
    start_process_job,
)

PY = sys.executable


def run(tmp_path: Path, code: str, *, limits: Limits | None = None, gpus=(1, 3), env=None, resume=False, trade_id=7):
    return start_process_job(
        trade_id=trade_id, argv=[PY, "-c", code], paths=JobPaths(tmp_path / "job"), spec_env=env or {},
        output_dir="outputs", gpus=list(gpus), limits=limits or Limits(time_limit_s=20, grace_s=2), resume=resume,
    )


def test_job_sees_a_scrubbed_environment_with_only_its_gpus(tmp_path, monkeypatch):
    monkeypatch.setenv("GRIDBID_AGENT_SECRET_THING", "leak")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "leak")
    job = run(tmp_path, "import os, json; json.dump(dict(os.environ), open('outputs/env.json', 'w'))", env={"EPOCHS": "3"})
    out = job.wait(10)
    assert (out.exit_code, out.reason) == (0, "exited")
    env = json.loads((tmp_path / "job/work/outputs/env.json").read_text())
    assert env["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert env["EPOCHS"] == "3"
    assert "AWS_SECRET_ACCESS_KEY" not in env and "GRIDBID_AGENT_SECRET_THING" not in env
    assert env["GRIDBID_CHECKPOINT_DIR"].endswith("work/checkpoint") and "GRIDBID_RESUME_FROM" not in env
    assert env["HOME"] == str(tmp_path / "job/work")


def test_job_spec_cannot_override_the_gpus_it_sees(tmp_path):
    with pytest.raises(RuntimeError_, match="CUDA_VISIBLE_DEVICES"):
        run(tmp_path, "pass", env={"CUDA_VISIBLE_DEVICES": "0,1,2,3"})


def test_exit_code_is_reported(tmp_path):
    assert run(tmp_path, "raise SystemExit(3)").wait(10).exit_code == 3


def test_timeout_terminates_then_kills_the_whole_group(tmp_path):
    # the child ignores SIGTERM and spawns a grandchild; both must die
    code = (
        "import signal, subprocess, sys, time, os\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(60)'])\n"
        "open('outputs/grandchild.pid', 'w').write(str(p.pid))\n"
        "time.sleep(60)\n"
    )
    job = run(tmp_path, code, limits=Limits(time_limit_s=1.0, grace_s=0.5))
    t0 = time.monotonic()
    out = job.wait(15)
    assert out.reason == "timeout" and time.monotonic() - t0 < 6
    grandchild = int((tmp_path / "job/work/outputs/grandchild.pid").read_text())
    deadline = time.monotonic() + 3
    while process_alive(grandchild, None) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not process_alive(grandchild, None)


def test_cancel_kills_the_group_at_once(tmp_path):
    job = run(tmp_path, "import time; time.sleep(60)")
    time.sleep(0.3)
    job.kill("cancelled")
    out = job.wait(5)
    assert out.reason == "cancelled" and out.exit_code != 0


def test_output_over_the_cap_is_stopped(tmp_path):
    code = "f = open('outputs/big', 'wb')\nwhile True: f.write(b'x' * 65536); f.flush()\n"
    job = run(tmp_path, code, limits=Limits(time_limit_s=20, grace_s=1, max_output_bytes=1_000_000))
    job.size_check_every_s = 0.05
    out = job.wait(10)
    assert out.reason in ("output_cap", "exited")  # RLIMIT_FSIZE may stop it first (SIGXFSZ)
    assert out.exit_code != 0
    assert (tmp_path / "job/work/outputs/big").stat().st_size <= 1_000_000 + 65536 * 4


def test_preempted_job_saves_a_checkpoint_in_its_grace_period(tmp_path):
    code = (
        "import os, signal, sys, time\n"
        "def save(*_):\n"
        "    open(os.path.join(os.environ['GRIDBID_CHECKPOINT_DIR'], 'step.txt'), 'w').write('41')\n"
        "    sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, save)\n"
        "open('outputs/started', 'w').write('1')\n"
        "time.sleep(60)\n"
    )
    # generous bounds: on a loaded machine (CI, 3 xdist workers) the job's interpreter took
    # seconds to start, and a SIGTERM sent before its handler is set is not a preemption test
    job = run(tmp_path, code, limits=Limits(time_limit_s=60, grace_s=15))
    deadline = time.monotonic() + 30
    while not (tmp_path / "job/work/outputs/started").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert (tmp_path / "job/work/outputs/started").exists(), "the job did not start within 30 s"
    job.terminate("preempted", time.time())
    out = job.wait(20)
    assert out.reason == "preempted" and out.exit_code == 0
    assert (tmp_path / "job/work/checkpoint/step.txt").read_text() == "41"


def test_resumed_job_is_told_where_its_checkpoint_is(tmp_path):
    job = run(tmp_path, "import os; open('outputs/r', 'w').write(os.environ['GRIDBID_RESUME_FROM'])", resume=True)
    job.wait(10)
    assert (tmp_path / "job/work/outputs/r").read_text().endswith("work/resume")


def test_shim_records_the_exit_code_for_an_agent_that_restarted(tmp_path):
    job = run(tmp_path, "raise SystemExit(5)")
    job.wait(10)
    assert json.loads((tmp_path / "job/exit.json").read_text())["exit_code"] == 5


def test_output_dir_may_not_escape_the_job_directory(tmp_path):
    with pytest.raises(RuntimeError_, match="escapes"):
        start_process_job(trade_id=1, argv=["true"], paths=JobPaths(tmp_path / "j"), spec_env={}, output_dir="../../etc", gpus=[], limits=Limits(5))


def test_missing_command_exits_127(tmp_path):
    out = start_process_job(trade_id=1, argv=["/no/such/binary"], paths=JobPaths(tmp_path / "j"), spec_env={}, output_dir="o", gpus=[], limits=Limits(5)).wait(10)
    assert out.exit_code == 127
    assert os.path.exists(tmp_path / "j/job.log")

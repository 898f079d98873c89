"""The checkpointing job docs/agent.md shows (issue 31) does what the text says, run as a real
process the way the agent runs it: saves its state on SIGTERM, and resumes from it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def example() -> str:
    text = (ROOT / "docs" / "agent.md").read_text()
    section = text[text.index("**A job that checkpoints**"):]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None, "the example is a python block after its heading"
    return code.group(1)


def test_the_documented_job_saves_on_sigterm_and_resumes_where_it_stopped(tmp_path):
    code = example()
    assert len(code.strip().splitlines()) <= 22, "a short example"
    ckpt, resume = tmp_path / "checkpoint", tmp_path / "resume"
    ckpt.mkdir()
    env = {**os.environ, "GRIDBID_CHECKPOINT_DIR": str(ckpt)}
    job = subprocess.Popen([sys.executable, "-c", code], env=env, start_new_session=True)
    try:
        time.sleep(1.5)  # about 15 steps
        os.killpg(job.pid, signal.SIGTERM)
        assert job.wait(timeout=20) == 0, "it saves and exits within the grace"
    finally:
        if job.poll() is None:
            job.kill()
    saved = json.loads((ckpt / "state.json").read_text())["step"]
    assert saved >= 3
    # resumed elsewhere: the state unpacked to resume/, GRIDBID_RESUME_FROM pointing there
    resume.mkdir()
    (resume / "state.json").write_text((ckpt / "state.json").read_text())
    again = tmp_path / "checkpoint2"
    again.mkdir()
    job = subprocess.Popen([sys.executable, "-c", code], env={**env, "GRIDBID_CHECKPOINT_DIR": str(again), "GRIDBID_RESUME_FROM": str(resume)},
                           start_new_session=True)
    try:
        time.sleep(0.5)
        os.killpg(job.pid, signal.SIGTERM)
        assert job.wait(timeout=20) == 0
    finally:
        if job.poll() is None:
            job.kill()
    assert json.loads((again / "state.json").read_text())["step"] > saved, "it carried on from the saved step"

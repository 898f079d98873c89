"""The suite runs in parallel (pytest-xdist): each worker has its own PostgreSQL test
database, data directory, Redis database and port band, and a killed run's leftovers
are cleared by the next run. Checked by running a probe under a real `pytest -n 2`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.workers import PORT_BAND, PORT_BASE

ROOT = Path(__file__).resolve().parents[2]
PROBE = "tests/integration/xdist_probe.py"


def _pytest_env(out: Path) -> dict[str, str]:
    # the probe run is a run of its own: it must not think it is one of this run's workers
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "GRIDBID_DATA_DIR"))}
    env.update(PYTHONPATH=str(ROOT), GRIDBID_PROBE_OUT=str(out), TEST_REDIS_URL="redis://127.0.0.1:6379/9")
    return env


def _databases() -> set[str]:
    import psycopg
    from django.conf import settings

    cfg = settings.DATABASES["default"]
    with psycopg.connect(host=cfg["HOST"], port=cfg["PORT"] or 5432, user=cfg["USER"], dbname="postgres", autocommit=True) as conn:
        return {row[0] for row in conn.execute("SELECT datname FROM pg_database")}


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=30)
    return proc.pid


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.timeout(280)
def test_two_workers_share_no_database_data_dir_redis_db_or_port_and_clear_a_killed_runs_leftovers(tmp_path: Path) -> None:
    import psycopg
    from django.conf import settings

    # what a killed run leaves behind: test databases named after a process that is gone
    dead = _dead_pid()
    leftovers = {f"gridbid_test_{dead}", f"gridbid_test_{dead}_gw0"}
    cfg = settings.DATABASES["default"]
    with psycopg.connect(host=cfg["HOST"], port=cfg["PORT"] or 5432, user=cfg["USER"], dbname="postgres", autocommit=True) as conn:
        for name in leftovers:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')

    out = tmp_path / "reports"
    out.mkdir()
    proc = subprocess.run([sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-p", "no:randomly", "-q", PROBE], cwd=ROOT,
                          env=_pytest_env(out), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0 and "15 passed" in proc.stdout, proc.stdout[-3000:] + proc.stderr[-3000:]

    reports = [json.loads(p.read_text()) for p in out.glob("*.json")]
    assert len(reports) == 15, "every test ran once"
    assert sorted(r["test"] for r in reports if "GET" in r["test"]) == [
        f"test_every_operation_of_a_schema_runs[GET /probe/{name}/]" for name in "abc"], "every schemathesis operation ran"
    grouped = {r["worker"] for r in reports if r["test"].startswith("test_tests_sharing_a_module_fixture")}
    assert len(grouped) == 1, f"one worker ran the module fixture's tests, not {sorted(grouped)}"
    by_worker = {r["worker"]: r for r in reports}
    assert set(by_worker) == {"gw0", "gw1"}, "both workers ran tests"
    for key in ("database", "data_dir", "redis"):
        assert len({r[key] for r in reports}) == 2, f"each worker has its own {key}: {sorted({r[key] for r in reports})}"
    assert {r["redis"] for r in reports} == {"redis://127.0.0.1:6379/9", "redis://127.0.0.1:6379/8"}
    for name in by_worker:
        band = range(PORT_BASE + int(name[2:]) * PORT_BAND, PORT_BASE + (int(name[2:]) + 1) * PORT_BAND)
        ports = [p for r in reports if r["worker"] == name for p in r["ports"]]
        assert all(p in band for p in ports), f"{name}'s ports {ports} are in its band {band}"
        assert len(set(ports)) == len(ports), f"{name} never hands out one port twice in a run"

    remaining = _databases()
    assert not leftovers & remaining, "the killed run's databases were dropped"
    assert not any(Path(r["data_dir"]).exists() for r in reports), "the run removed its data directories"


def test_a_parallel_run_that_collects_no_tests_fails(tmp_path: Path) -> None:
    proc = subprocess.run(["bash", "tests/run.sh", "-n", "2", "-q", "tests/unit/test_config.py", "-k", "no_test_is_named_this"],
                          cwd=ROOT, env=_pytest_env(tmp_path), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "collected no tests" in proc.stderr

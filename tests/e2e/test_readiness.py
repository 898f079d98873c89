"""Operators see what is wrong: a real `gridbid up` whose Redis goes away answers /readyz
503 naming redis, and `gridbid up` / `worker` / `beat` refuse to start, with one line and
exit status 2, when a service they are configured with does not answer."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.conftest import service_missing
from tests.e2e.conftest import ROOT, free_port, start_server, stop_server
from tests.integration.helpers import own_redis


def test_readyz_names_redis_when_the_servers_redis_goes_away(tmp_path: Path) -> None:
    with own_redis(tmp_path) as (redis_proc, url):
        (tmp_path / "data").mkdir()
        server, base, _ = start_server(tmp_path / "data", demo=False, extra_env={"REDIS_URL": url})
        try:
            ready = httpx.get(f"{base}/readyz", timeout=10)
            assert ready.status_code == 200, ready.text
            assert ready.json()["checks"]["redis"] == {"status": "ok", "detail": "answers PING", "ms": ready.json()["checks"]["redis"]["ms"]}
            redis_proc.terminate()
            redis_proc.wait(timeout=10)
            time.sleep(1.1)  # past the one-second reuse of the last answer
            started = time.monotonic()
            down = httpx.get(f"{base}/readyz", timeout=10)
            assert time.monotonic() - started < 5  # bounded: no check hangs the request
            assert down.status_code == 503
            body = down.json()
            assert body["status"] == "not_ready"
            assert list(body["error"]["fields"]) == ["redis"]
            assert "REDIS_URL does not answer PING" in body["error"]["message"]
            assert body["checks"]["database"]["status"] == "ok"
            # liveness is not readiness: the process still answers
            assert httpx.get(f"{base}/healthz", timeout=5).text == "ok"
        finally:
            stop_server(server)


@pytest.fixture
def dead_port() -> Iterator[int]:
    """A port bound but never listened on: connections to it are refused, and no other
    process can start listening there while the test runs."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


def run_cli(tmp_path: Path, *args: str, **env_extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "CHAIN_RPC_URL")}
    env.update(GRIDBID_DATA_DIR=str(tmp_path / "data"), PYTHONUNBUFFERED="1", **env_extra)
    return subprocess.run([sys.executable, "-m", "gridbid.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("command", [["up", "--port", str(free_port())], ["worker"], ["beat"]])
def test_cli_refuses_to_start_with_an_unreachable_redis_and_says_which(tmp_path: Path, dead_port: int, command: list[str]) -> None:
    port = dead_port
    # how fast it gives up is timed in-process (tests/integration/test_health.py): a box's
    # load stretched this process's start-up past a 30 s bound (a 4-worker run at load 18)
    result = run_cli(tmp_path, *command, REDIS_URL=f"redis://:hunter2secret@127.0.0.1:{port}/0")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"gridbid: REDIS_URL (redis://***@127.0.0.1:{port}/0) is unreachable: ")
    assert lines[0].endswith("start Redis or correct REDIS_URL")
    assert "hunter2secret" not in result.stderr + result.stdout


def test_cli_refuses_to_start_with_an_unreachable_database(tmp_path: Path, dead_port: int) -> None:
    port = dead_port
    result = run_cli(tmp_path, "up", "--port", str(free_port()), DATABASE_URL=f"postgres://postgres:pw@127.0.0.1:{port}/gridbid")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"gridbid: DATABASE_URL (postgres://***@127.0.0.1:{port}/gridbid) is unreachable: ")


def test_cli_refuses_to_start_with_an_unreachable_chain(tmp_path: Path, dead_port: int) -> None:
    port = dead_port
    result = run_cli(tmp_path, "up", "--port", str(free_port()), CHAIN_RPC_URL=f"http://127.0.0.1:{port}")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"gridbid: CHAIN_RPC_URL (http://127.0.0.1:{port}) is unreachable: ")


def test_a_running_demo_market_is_ready_and_its_metrics_agree(tmp_path: Path) -> None:
    """The embedded `gridbid up --demo`: dev chain, in-process worker, rounds every 2 s."""
    from prometheus_client.parser import text_string_to_metric_families

    token = "scrape-" + "z" * 24
    (tmp_path / "data").mkdir()
    server, base, _ = start_server(tmp_path / "data", demo=True, extra_env={"METRICS_TOKEN": token})
    try:
        deadline = time.monotonic() + 60
        while True:  # the first round and the listener's first read come within seconds of start
            ready = httpx.get(f"{base}/readyz", timeout=10)
            if ready.status_code == 200 or time.monotonic() > deadline:
                break
            time.sleep(1)
        assert ready.status_code == 200, ready.text
        checks = ready.json()["checks"]
        assert {name: c["status"] for name, c in checks.items()} == {
            "database": "ok", "redis": "skipped", "chain": "ok", "rounds": "ok", "listener": "ok", "outbox": "ok", "carbon": "ok"}
        assert httpx.get(f"{base}/metrics", timeout=10).status_code == 401
        page = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10)
        assert page.status_code == 200
        values = {(s.name, tuple(sorted(s.labels.items()))): s.value
                  for f in text_string_to_metric_families(page.text) for s in f.samples}
        assert values[("gridbid_chain_up", ())] == 1.0
        assert values[("gridbid_listener_lag_blocks", ())] <= 200
        assert values[("gridbid_orders_open", (("side", "offer"),))] > 0  # the demo's providers publish offers
        assert all(values[("gridbid_ready", (("check", name),))] == 1.0 for name in ("database", "chain", "rounds", "listener", "outbox"))
    finally:
        stop_server(server)


class Proxy:
    """A TCP relay from a free port to `target`, which the test can cut: every relayed
    connection is closed and new ones are refused, as when a database host goes away."""

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target, timeout=5)
            upstream.settimeout(None)
            with self.lock:
                self.sockets += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        # shutdown first: close() alone leaves a socket that a thread blocks in accept() on listening
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self.lock:
            for s in self.sockets:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()


def test_readyz_names_the_database_when_it_goes_away(tmp_path: Path) -> None:
    import uuid

    import psycopg

    name = f"gridbid_health_{uuid.uuid4().hex[:8]}"
    try:
        admin = psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres", autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        service_missing(f"PostgreSQL is unreachable ({exc})")
    admin.execute(f'CREATE DATABASE "{name}"')
    proxy = Proxy(("127.0.0.1", 5432))
    try:
        (tmp_path / "data").mkdir()
        server, base, _ = start_server(tmp_path / "data", demo=False, extra_env={
            "DATABASE_URL": f"postgres://postgres@127.0.0.1:{proxy.port}/{name}", "GRIDBID_CHAIN_PORT": str(free_port())})
        try:
            assert httpx.get(f"{base}/readyz", timeout=10).json()["checks"]["database"]["status"] == "ok"
            proxy.cut()
            time.sleep(1.1)
            started = time.monotonic()
            down = httpx.get(f"{base}/readyz", timeout=15)
            assert time.monotonic() - started < 8
            assert down.status_code == 503, down.text
            body = down.json()
            assert "database" in body["error"]["fields"]
            assert body["checks"]["database"]["detail"].startswith("the database does not answer: ")
            assert {body["checks"][p]["status"] for p in ("rounds", "listener", "outbox")} == {"skipped"}
        finally:
            stop_server(server)
    finally:
        proxy.cut()
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.close()

"""`gridbid up` and a dev chain an earlier server left behind (issue 17, item 7).

A server killed with SIGKILL cannot stop its anvil: the anvil lives on, holding the dev
chain's port. The next `gridbid up` must not take that orphan for its own chain (and leave
it running at its stop): it stops it, so the orphan dumps its state, and starts its own
from that state. A port held by anything else is refused with a message that names it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.conftest import service_missing
from tests.e2e.conftest import ROOT, start_server, stop_server
from tests.workers import free_port

pytestmark = [pytest.mark.slow, pytest.mark.anvil, pytest.mark.timeout(300)]

MARK = "0x00000000000000000000000000000000000a11ce"  # an account only the orphan's state funds


@pytest.fixture(autouse=True)
def anvil_binary() -> None:
    from ledger.chain.anvil import AnvilNotFound, find_anvil

    try:
        find_anvil()
    except AnvilNotFound as exc:
        service_missing(f"anvil is not installed ({exc})")


def _stat(pid: int) -> tuple[str, int, str] | None:
    """(comm, parent pid, state) of a process, None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = text[text.rindex(")") + 2 :].split()[:2]
    return text[text.index("(") + 1 : text.rindex(")")], int(ppid), state


def _alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[2] != "Z"


def _wait_gone(pid: int, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while _alive(pid):
        if time.monotonic() > deadline:
            pytest.fail(f"{what} (pid {pid}) still running after {timeout:g} s: {_stat(pid)}")
        time.sleep(0.1)


def _anvil_of(server: int) -> int:
    """The pid of the anvil that `server` started (there once the server answers)."""
    found = [int(p.parent.name) for p in Path("/proc").glob("[0-9]*/stat")
             if (s := _stat(int(p.parent.name))) is not None and s[0] == "anvil" and s[1] == server and s[2] != "Z"]
    assert len(found) == 1, f"server {server} runs anvils {found}"
    return found[0]


def _rpc(url: str, method: str, params: list[Any]) -> Any:
    body = httpx.post(url, json={"jsonrpc": "2.0", "id": 1, "method": method, "params": params}, timeout=10).json()
    assert "result" in body, body
    return body["result"]


def test_a_restart_after_the_server_was_killed_stops_the_dev_chain_it_left_and_keeps_its_state(tmp_path: Path) -> None:
    first, _, env = start_server(tmp_path, demo=False)
    chain_port = env["GRIDBID_CHAIN_PORT"]
    chain = f"http://127.0.0.1:{chain_port}"
    second = None
    try:
        orphan = _anvil_of(first.pid)
        _rpc(chain, "anvil_setBalance", [MARK, "0x1234"])
        os.kill(first.pid, signal.SIGKILL)  # the server alone: its anvil lives on, holding the port
        first.wait(timeout=30)
        assert _alive(orphan)

        second, _, _ = start_server(tmp_path, demo=False, extra_env={"GRIDBID_CHAIN_PORT": chain_port})
        log = (tmp_path / "server.log").read_text()
        assert f"pid {orphan}" in log, log  # it says what it stopped
        assert not _alive(orphan), "the orphan was stopped before the new dev chain started"
        fresh = _anvil_of(second.pid)
        assert int(_rpc(chain, "eth_getBalance", [MARK, "latest"]), 16) == 0x1234, "the orphan's state was dumped and loaded"
        assert f"dev chain at {chain}" in log

        stop_server(second)
        assert second.returncode == 0, (tmp_path / "server.log").read_text()
        _wait_gone(fresh, "the new dev chain")
        _wait_gone(orphan, "the orphaned dev chain")
        with pytest.raises(OSError):  # nothing listens on the dev chain's port any more
            socket.create_connection(("127.0.0.1", int(chain_port)), timeout=2).close()
    finally:
        if second is not None:
            stop_server(second)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(first.pid, signal.SIGKILL)  # the orphan, if it is still there


def _up_refused(data: Path, chain_port: int) -> str:
    """`gridbid up` in `data` with its dev chain on `chain_port`, expected to exit: its output."""
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "CHAIN_RPC_URL")}
    env.update(GRIDBID_DATA_DIR=str(data), PYTHONUNBUFFERED="1", GRIDBID_CHAIN_PORT=str(chain_port))
    proc = subprocess.Popen([sys.executable, "-m", "gridbid.cli", "up", "--port", str(free_port())], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # it and a dev chain it may have started
        proc.wait(timeout=30)
    text = out.decode()
    assert proc.returncode == 2, text
    assert "Traceback" not in text, text
    return text


def test_up_refuses_a_dev_chain_port_another_process_holds_naming_it_and_the_fix(tmp_path: Path) -> None:
    chain_port = free_port()
    with socket.socket() as held:
        held.bind(("127.0.0.1", chain_port))
        held.listen(1)
        text = _up_refused(tmp_path, chain_port)
    assert f"port {chain_port}" in text and f"pid {os.getpid()}" in text and "GRIDBID_CHAIN_PORT" in text, text


def test_a_second_up_on_the_same_data_directory_leaves_the_running_servers_dev_chain_alone(tmp_path: Path) -> None:
    first, _, env = start_server(tmp_path, demo=False)
    try:
        chain = _anvil_of(first.pid)
        text = _up_refused(tmp_path, int(env["GRIDBID_CHAIN_PORT"]))
        assert "already runs" in text and f"pid {first.pid}" in text, text
        assert _alive(chain) and first.poll() is None, "the running server and its chain are left alone"
    finally:
        stop_server(first)

"""`gridbid up` under a service manager: SIGTERM stops everything it started."""

from __future__ import annotations

import signal
import socket
from pathlib import Path

import pytest

from tests.conftest import service_missing
from tests.e2e.conftest import start_server, stop_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


def test_sigterm_stops_the_worker_and_the_dev_chain_and_exits_cleanly(tmp_path: Path) -> None:
    """systemd, docker and `kill` stop a server with SIGTERM: the dev chain must stop with it
    (and dump its state), not live on holding its port for the next start."""
    from ledger.chain.anvil import AnvilNotFound, find_anvil

    try:
        find_anvil()
    except AnvilNotFound as exc:
        service_missing(f"anvil is not installed ({exc})")
    proc, _, env = start_server(tmp_path, demo=False)
    try:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
    finally:
        stop_server(proc)
    log = (tmp_path / "server.log").read_text()
    assert code == 0, log
    assert "stopped" in log
    with pytest.raises(OSError):  # nothing listens on the dev chain's port any more
        socket.create_connection(("127.0.0.1", int(env["GRIDBID_CHAIN_PORT"])), timeout=2).close()
    assert (tmp_path / "chain-state.json").stat().st_size > 0  # anvil dumped its state on the way out

"""start_anvil trusts only its own anvil: on a port something else holds, the anvil it
spawns dies at once, and an answer on that port is not its chain (issue 17, item 7)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from tests.conftest import service_missing
from tests.workers import free_port

pytestmark = [pytest.mark.anvil, pytest.mark.timeout(120)]


def _anvils_of(parent: int) -> set[int]:
    """The anvil processes whose parent is `parent` (zombies left out)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        comm = text[text.index("(") + 1 : text.rindex(")")]
        state, ppid = text[text.rindex(")") + 2 :].split()[:2]
        if comm == "anvil" and int(ppid) == parent and state != "Z":
            found.add(int(text.split()[0]))
    return found


@pytest.fixture
def anvil_binary() -> None:
    from ledger.chain.anvil import AnvilNotFound, find_anvil

    try:
        find_anvil()
    except AnvilNotFound as exc:
        service_missing(str(exc))


def _refusal(port: int) -> str:
    from ledger.chain.anvil import start_anvil, stop_anvil

    try:
        late = start_anvil(port=port, timeout=30)
    except RuntimeError as exc:
        return str(exc)
    stop_anvil(late)
    pytest.fail(f"start_anvil returned although something else held port {port} (its own anvil could not bind it)")


def test_an_anvil_started_on_a_port_another_anvil_holds_is_refused_naming_that_anvil(anvil_binary: None) -> None:
    from ledger.chain.anvil import start_anvil, stop_anvil

    port = free_port()
    holder = start_anvil(port=port)
    # this worker may run other tests' chains (a module's or a session's anvil): only a new one counts
    before = _anvils_of(os.getpid())
    try:
        message = _refusal(port)
        assert f"port {port}" in message and f"pid {holder.pid}" in message, message
        assert _anvils_of(os.getpid()) == before, "the refused anvil is not left running"
        assert holder.poll() is None, "the anvil that held the port is left alone"
    finally:
        stop_anvil(holder)


def test_an_anvil_started_on_a_port_a_plain_listener_holds_is_refused_naming_its_process(anvil_binary: None) -> None:
    port = free_port()
    before = _anvils_of(os.getpid())  # other tests' chains of this worker
    with socket.socket() as held:
        held.bind(("127.0.0.1", port))
        held.listen(1)
        message = _refusal(port)
    assert f"port {port}" in message and f"pid {os.getpid()}" in message, message
    assert _anvils_of(os.getpid()) == before, "the refused anvil is not left running"

"""The embedded server as a real process on real sockets, shared by the e2e tests.

Each server gets free ports for HTTP and for its dev chain, from its xdist worker's own
band (tests/workers.py), so e2e runs never collide with each other, with another worker
or with a developer's `make run`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.workers import free_port

ROOT = Path(__file__).resolve().parents[2]


def start_server(data: Path, *, demo: bool, speed: int = 60, extra_env: dict[str, str] | None = None, up_args: tuple[str, ...] = ()) -> tuple[subprocess.Popen[bytes], str, dict[str, str]]:
    """`gridbid up` in `data`, once it answers: (its process, base URL, the environment it runs with).

    `extra_env` is laid over the embedded environment (DATABASE_URL and REDIS_URL for the
    production mode); `up_args` are more options for `gridbid up`."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL", "DJANGO_SETTINGS_MODULE", "CHAIN_RPC_URL")}
    env.update(GRIDBID_DATA_DIR=str(data), ROUND_SECONDS="2", PYTHONUNBUFFERED="1", GRIDBID_CHAIN_PORT=str(free_port()),
               GRIDBID_DEMO_SPEED=str(speed))
    env.update(extra_env or {})
    log_path = data / "server.log"
    args = [sys.executable, "-m", "gridbid.cli", "up", "--port", str(port), *(["--demo"] if demo else []), *up_args]
    with open(log_path, "w") as log:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"server exited: {log_path.read_text()}")
            try:
                if httpx.get(f"{base}/healthz", timeout=2).status_code == 200:
                    return proc, base, env
            except httpx.TransportError:
                time.sleep(0.3)
        pytest.fail(f"server did not start: {log_path.read_text()}")
    except BaseException:
        stop_server(proc)
        raise


def stop_server(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM, as a service manager would; past 30 s, kill its whole process group
    (its dev chain too), so no test leaves an anvil behind."""
    if proc.poll() is None:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def wait_for_js(page: Any, expression: str, timeout_ms: int = 20_000) -> None:
    """Poll a JavaScript expression in the page until it is true (an error counts as false).

    Playwright's wait_for_function builds its predicate with `new Function`, which the
    pages' Content-Security-Policy (no 'unsafe-eval') refuses; page.evaluate goes through
    the DevTools protocol, which the policy does not govern."""
    probe = f"(() => {{ try {{ return !!({expression}); }} catch (e) {{ return false; }} }})()"
    deadline = time.monotonic() + timeout_ms / 1000
    while not page.evaluate(probe):
        if time.monotonic() > deadline:
            raise AssertionError(f"still false after {timeout_ms} ms: {expression}")
        page.wait_for_timeout(100)


@contextlib.contextmanager
def running_server(data: Path, *, demo: bool, speed: int = 60, extra_env: dict[str, str] | None = None) -> Iterator[tuple[str, dict[str, str]]]:
    """`gridbid up` in `data`; yields (base URL, the environment it runs with)."""
    proc, base, env = start_server(data, demo=demo, speed=speed, extra_env=extra_env)
    try:
        yield base, env
    finally:
        stop_server(proc)


class SharedMarket:
    """The demo market shared by the browser and embedded-server tests: started by the first
    test that asks for it, stopped as soon as the worker's next test does not use it.

    A running demo burns most of a core (rounds, its simulated agents' BLS co-signatures at
    1,800 times real speed): kept to the session's end, it ran through the ~350 tests its
    worker ran after the group, about a fifth of a 2-core box. A test that asks for it after
    it stopped (a run that interleaves files, e.g. `-p no:xdist`) starts a fresh one."""

    def __init__(self, tmp: pytest.TempPathFactory) -> None:
        self.tmp = tmp
        self.proc: subprocess.Popen[bytes] | None = None
        self.base, self.env = "", {}

    def running(self) -> tuple[str, dict[str, str]]:
        if self.proc is None or self.proc.poll() is not None:
            # its simulated jobs run 1,800 times faster than booked, so a 2-hour demo job
            # ends in 4 s and its trade settles on the dev chain while the tests watch
            self.proc, self.base, self.env = start_server(self.tmp.mktemp("embedded"), demo=True, speed=1800)
        return self.base, self.env

    def stop(self) -> None:
        if self.proc is not None:
            stop_server(self.proc)
            self.proc = None


_shared_markets: list[SharedMarket] = []


@pytest.fixture(scope="session")
def embedded_market(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedMarket]:
    market = SharedMarket(tmp_path_factory)
    _shared_markets.append(market)
    try:
        yield market
    finally:
        market.stop()
        _shared_markets.remove(market)


@pytest.fixture
def embedded(embedded_market: SharedMarket) -> tuple[str, dict[str, str]]:
    """The shared demo market, running: (base URL, env)."""
    return embedded_market.running()


@pytest.fixture
def embedded_server(embedded: tuple[str, dict[str, str]]) -> str:
    return embedded[0]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the shared demo market once the next test on this worker does not use it (xdist
    runs its group's tests one after another, and tells a worker its next test)."""
    if "embedded_market" in getattr(item, "fixturenames", ()) and "embedded_market" not in getattr(nextitem, "fixturenames", ()):
        for market in _shared_markets:
            market.stop()


@pytest.fixture
def receiver() -> Iterator[Any]:
    """A webhook receiver on 127.0.0.1 (tests/receiver.py); a server must allow private URLs
    (WEBHOOK_ALLOW_PRIVATE_URLS) to call it."""
    from tests.receiver import Receiver

    r = Receiver()
    yield r
    r.close()


def settlement_trace(env: dict[str, str], username: str) -> str:
    """Where each of `username`'s trades stands on its way to settling, read from the embedded
    server's database (its source of truth), with the end of the server's log: what a failed
    wait for 'settled' prints, so the next failure says which step held it."""
    import json
    import sqlite3

    data = Path(env["GRIDBID_DATA_DIR"])
    lines = []
    with contextlib.closing(sqlite3.connect(f"file:{data / 'gridbid.sqlite3'}?mode=ro", uri=True, timeout=10)) as db:
        rows = db.execute(
            """select t.id, t.state, j.state, j.ended_at, j.checkpoint, rb.state, sb.id, sb.state, sb.error, sb.created_at,
                      (select count(*) from ledger_cosign c where c.batch_id = sb.id and c.signature = ''),
                      (select count(*) from ledger_cosign c where c.batch_id = sb.id)
               from market_trade t join market_user u on u.id = t.buyer_id left join market_job j on j.trade_id = t.id
               left join ledger_recorditem ri on ri.trade_id = t.id left join ledger_recordbatch rb on rb.id = ri.batch_id
               left join ledger_settleitem si on si.trade_id = t.id left join ledger_settlebatch sb on sb.id = si.batch_id
               where u.username = ?""", (username,)).fetchall()
        for (tid, tstate, jstate, ended, checkpoint, rstate, sid, sstate, serror, screated, unsigned, cosigns) in rows:
            receipt = "receipt" in json.loads(checkpoint or "{}")
            lines.append(f"trade {tid} {tstate}: job {jstate} (ended {ended}, receipt {receipt}); record batch {rstate}; "
                         f"settle batch {sid} {sstate} (created {screated}, {unsigned} of {cosigns} co-signatures missing) {serror or ''}")
        backlog = db.execute("""select count(*), min(j.ended_at) from market_trade t join market_job j on j.trade_id = t.id
                                left join ledger_settleitem si on si.trade_id = t.id
                                where t.state = 'recorded' and si.id is null and j.ended_at is not null""").fetchone()
        lines.append(f"finished trades not yet in a settle batch: {backlog[0]} (oldest ended {backlog[1]}); now {time.strftime('%H:%M:%S')}")
        lines.append("settle batches: " + ", ".join(f"{s} {n}" for s, n in db.execute("select state, count(*) from ledger_settlebatch group by state")))
    log = data / "server.log"
    tail = log.read_text(errors="replace").splitlines()[-40:] if log.exists() else []
    return "\n".join(lines + ["--- the server's log, its end:"] + tail)

"""Fan-out of live round updates to N real WebSocket clients (issue 33).

A real `gridbid up --demo` server (its demo market clears a round every ``--round-seconds``
and keeps its books busy), and a separate client process that opens N sockets to it over
loopback. Each socket subscribes to ``rounds`` and the busiest ``book.*``; ``--slow`` more
sockets subscribe the same way and then never read (a raw socket with a small receive
buffer, so the server meets TCP backpressure as it would from a stalled client).

Two servers: ``embedded`` (`gridbid up --demo`, one process with its Celery threads and
demo market) and ``production`` (`gridbid up --workers 2 --no-worker` on PostgreSQL and the
Redis channel layer, with `gridbid worker` and `gridbid beat` beside it, as README's
Production section runs them; the demo's data without its ticks, so its books move only when
a round does).

Printed per server and N:
- the connect storm: how long N sockets took to connect, subscribe and hold both snapshots,
  and how many failed;
- delivery of each ``rounds`` update, from the round's ``cleared_at`` to the moment the
  client read it: p50, p99 and max over every (socket, round), and the rounds seen;
- updates lost: sequence gaps on either channel, per socket (the worst socket and the total);
- sockets the server closed, by close code;
- the slow consumers: closed with which code, how long after they stopped reading.

Targets (issue 33): at 1,000 sockets p99 <= 150 ms and nothing lost on any socket that stays
open; at 5,000, p99 <= 1 s; the slow consumers closed with the documented code without slowing the
others (a client that never reads answers no protocol ping either: 1011 within 40 s; 4009 is
for one that reads, too slowly, and is tested in tests/integration/test_streams.py).
Exits 1 if a target is missed.

Measured (2026-12-07, 2 cores, 10 rounds; p50 / p99 ms, nothing lost, no reading socket closed):

    server                       1,000 sockets   5,000 sockets   5,000: connect storm
    production, 2 processes      49 / 139        233 / 345       16 s
    embedded, its living demo    76 / 151        369 / 1,115     16 s

The embedded server clears its demo market's rounds, settles and runs its demo agents on
threads of the same process: they hold the interpreter while the loop fans out. Production
runs those in `gridbid worker` processes.

    python tests/bench/bench_fanout.py [--sizes 100,1000,5000] [--rounds 6] [--round-seconds 5]
        [--slow 5] [--server embedded,production] [--workers 2]

The clients are asyncio on the `websockets` package, in ``--client-procs`` processes (1; at
most one per 100 sockets). On this 2-core box they share the CPUs with the server and its
in-process demo market: with 4 client processes the 1,000-socket p99 was 3.5 s against
0.8 s with one, so a figure includes the clients' own lag and the box's contention.
Timestamps are wall-clock on one machine.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import resource
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

TARGETS = {1000: 0.150, 5000: 1.0}  # p99 delivery, seconds, by sockets
CLOSE_STOPPED = 1011  # docs/stream.md: a client that stops reading answers no ping, and the keepalive closes it


# --- the client process -------------------------------------------------------------------


class Socket:
    """What one reading socket saw."""

    def __init__(self) -> None:
        self.last: dict[str, int] = {}
        self.lost = 0
        self.latency: dict[int, float] = {}  # round number -> seconds from its cleared_at to read
        self.close_code: int | None = None

    def take(self, msg: dict[str, Any], now: float) -> None:
        kind, channel = msg.get("type"), msg.get("channel")
        if kind == "snapshot":
            self.last[channel] = msg["seq"]
            return
        if kind != "update":
            return
        prev = self.last.get(channel)
        seq = msg["seq"]
        if prev is not None and seq <= prev:
            return  # sent while the snapshot was taken: already in it
        if prev is not None and seq != prev + 1:
            self.lost += seq - prev - 1
        self.last[channel] = seq
        if channel == "rounds":
            rnd = msg["data"]["round"]
            if rnd.get("cleared_at"):
                self.latency[rnd["number"]] = now - datetime.fromisoformat(rnd["cleared_at"]).timestamp()


async def reader(url: str, channels: list[str], state: Socket, ready: asyncio.Event, stop: asyncio.Event,
                 failures: list[str], open_sockets: list[Any]) -> None:
    """One bot: subscribe, then read every frame as it comes (no timer per read: a wait_for
    per message was a quarter of the client process's time at 5,000 sockets). The client
    process closes every socket at the end, which ends this loop."""
    from websockets.asyncio.client import connect
    from websockets.exceptions import ConnectionClosed

    try:
        async with connect(url, open_timeout=60, max_size=2**24, ping_interval=None) as ws:
            open_sockets.append(ws)
            for channel in channels:
                await ws.send(json.dumps({"type": "subscribe", "channel": channel}))
            snapshots = 0
            async for raw in ws:
                now = time.time()
                msg = json.loads(raw)
                state.take(msg, now)
                if msg.get("type") == "snapshot":
                    snapshots += 1
                    if snapshots == len(channels):
                        ready.set()
            if not stop.is_set():  # the server closed it with a normal code (1000, 1001)
                state.close_code = ws.close_code
    except ConnectionClosed as exc:
        if not stop.is_set():
            state.close_code = exc.rcvd.code if exc.rcvd is not None else 1006
    except Exception as exc:  # a failed connect: counted, never hidden
        failures.append(f"{type(exc).__name__}: {exc}"[:200])
    finally:
        ready.set()


def frame(text: str) -> bytes:
    """One masked client text frame (RFC 6455), as a browser would send it."""
    data = text.encode()
    mask = os.urandom(4)
    head = bytes([0x81])
    n = len(data)
    head += bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + struct.pack("!H", n)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data))


def slow_socket(host: str, port: int, path: str, channels: list[str]) -> socket.socket:
    """A client that subscribes and then never reads: the handshake by hand on a socket with a
    4 KiB receive buffer."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(30)
    s.connect((host, port))
    key = base64.b64encode(os.urandom(16)).decode()
    s.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
               f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n\r\n").encode())
    head = b""
    while b"\r\n\r\n" not in head:
        head += s.recv(1)
    if b" 101 " not in head.split(b"\r\n", 1)[0]:
        raise RuntimeError(f"slow consumer's handshake refused: {head[:80]!r}")
    for channel in channels:
        s.sendall(frame(json.dumps({"type": "subscribe", "channel": channel})))
    return s


def close_code_of(s: socket.socket) -> int | None:
    """Read what the server sent a slow consumer, to its end or 10 s; the close frame's code,
    or None if the socket is still open."""
    s.settimeout(10)
    buf = b""
    try:
        while True:
            chunk = s.recv(1 << 20)
            if not chunk:
                break
            buf += chunk
    except (TimeoutError, OSError):
        pass
    i = 0
    while i + 2 <= len(buf):
        op, n = buf[i] & 0x0F, buf[i + 1] & 0x7F
        j = i + 2
        if n == 126:
            n, j = struct.unpack("!H", buf[j:j + 2])[0], j + 2
        elif n == 127:
            n, j = struct.unpack("!Q", buf[j:j + 8])[0], j + 8
        if op == 0x8:
            return int(struct.unpack("!H", buf[j:j + 2])[0]) if n >= 2 else 1005
        i = j + n
    return None


async def client_main(url: str, n: int, channels: list[str], rounds: int, round_s: float, slow: int) -> dict[str, Any]:
    from urllib.parse import urlparse

    states = [Socket() for _ in range(n)]
    readies = [asyncio.Event() for _ in range(n)]
    stop = asyncio.Event()
    failures: list[str] = []
    t0 = time.perf_counter()
    open_sockets: list[Any] = []
    tasks = [asyncio.create_task(reader(url, channels, st, ev, stop, failures, open_sockets)) for st, ev in zip(states, readies, strict=True)]
    for ev in readies:
        await ev.wait()
    storm = time.perf_counter() - t0
    u = urlparse(url)
    slow_socks = [slow_socket(u.hostname or "127.0.0.1", u.port or 80, u.path, channels) for _ in range(slow)]
    slow_from = time.time()
    # wait for `rounds` rounds after every socket is in, plus one to let the last one arrive
    def newest() -> int:
        return max((max(st.latency) for st in states if st.latency), default=0)

    first = newest()
    deadline = time.monotonic() + (rounds + 2) * round_s + 30
    while time.monotonic() < deadline and newest() < first + rounds:
        await asyncio.sleep(0.5)
    await asyncio.sleep(2)
    slow_codes = [close_code_of(s) for s in slow_socks]
    slow_after = time.time() - slow_from
    stop.set()
    await asyncio.gather(*(ws.close() for ws in open_sockets), return_exceptions=True)
    await asyncio.gather(*tasks)
    for s in slow_socks:
        s.close()
    measured = range(first + 1, first + rounds + 1)  # the rounds after the storm, on every socket
    lat = sorted(st.latency[r] for st in states for r in measured if r in st.latency)
    closed: dict[str, int] = {}
    for st in states:
        if st.close_code is not None:
            closed[str(st.close_code)] = closed.get(str(st.close_code), 0) + 1
    open_lost = [st.lost for st in states if st.close_code is None]
    return {
        "n": n, "storm_s": storm, "failed": len(failures), "failures": failures[:3], "latencies": lat,
        "rounds": min((sum(1 for r in measured if r in st.latency) for st in states), default=0),
        "lost": open_lost, "closed": closed, "slow": slow_codes, "slow_s": slow_after,
    }


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The client processes' figures as one client's."""
    lat = sorted(x for p in parts for x in p["latencies"])
    lost = [x for p in parts for x in p["lost"]]
    closed: dict[str, int] = {}
    for p in parts:
        for k, v in p["closed"].items():
            closed[k] = closed.get(k, 0) + v
    return {
        "n": sum(p["n"] for p in parts), "storm_s": max(p["storm_s"] for p in parts), "failed": sum(p["failed"] for p in parts),
        "failures": [f for p in parts for f in p["failures"]][:3],
        "p50": statistics.median(lat) if lat else None, "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else None,
        "max": lat[-1] if lat else None, "rounds": min(p["rounds"] for p in parts),
        "lost_total": sum(lost), "lost_worst": max(lost, default=0), "closed": closed,
        "slow": [c for p in parts for c in p["slow"]], "slow_s": max(p["slow_s"] for p in parts),
    }


# --- the server ---------------------------------------------------------------------------


class Server:
    """A server under test, as a person would run it; `stop()` ends every process it started."""

    def __init__(self, kind: str, round_s: float, data: Path, workers: int) -> None:
        from tests.e2e.conftest import start_server

        self.kind, self.extra, self.database, self.chain = kind, [], "", None
        caps = {"ROUND_SECONDS": str(round_s), "WS_MAX_PER_ADDRESS": "100000", "WS_MAX_PER_TOKEN": "100000"}
        if kind == "embedded":
            self.proc, self.base, _ = start_server(data, demo=True, extra_env=caps)
            return
        if kind != "production":
            raise SystemExit(f"--server {kind}: embedded or production")
        # README's Production section: `gridbid up --workers N --no-worker` on PostgreSQL and
        # Redis, a `gridbid worker` and `gridbid beat` beside it, and a chain of its own (anvil,
        # contracts deployed by `gridbid chain deploy`). A scratch database and Redis database.
        # The demo's data is loaded, but its ticks are the embedded mode's: a buyer funded on
        # the chain keeps one bid open below every ask, so every round clears (a round with no
        # open bid is skipped) and sends its `rounds` update; the books move only when a round does
        import httpx
        import psycopg
        import redis

        from ledger.chain.anvil import start_anvil
        from tests.e2e.test_production_mode import _gridbid_env, _tokens
        from tests.workers import free_port

        admin_url = os.environ.get("TEST_DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
        self.admin_url = admin_url
        self.database = f"gridbid_fanout_{os.getpid()}"
        with psycopg.connect(admin_url, autocommit=True, connect_timeout=5) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
            admin.execute(f'CREATE DATABASE "{self.database}"')
        redis_url = os.environ.get("TEST_REDIS_URL", "redis://127.0.0.1:6379/15").rsplit("/", 1)[0] + f"/{1 + os.getpid() % 14}"
        redis.Redis.from_url(redis_url).flushdb()
        chain_port = free_port()
        self.chain = start_anvil(port=chain_port)
        env = {**caps, "DATABASE_URL": f"{admin_url.rsplit('/', 1)[0]}/{self.database}", "REDIS_URL": redis_url,
               "CHAIN_RPC_URL": f"http://127.0.0.1:{chain_port}", "CHAIN_CONFIRMATIONS": "0", "GRIDBID_DATA_DIR": str(data)}
        for step in (("manage", "migrate", "--no-input"), ("chain", "deploy")):
            out = subprocess.run([sys.executable, "-m", "gridbid.cli", *step], cwd=ROOT, env=_gridbid_env(env), capture_output=True, text=True, timeout=300)
            if out.returncode:
                raise SystemExit(f"gridbid {' '.join(step)}: {out.stdout[-2000:]}{out.stderr[-2000:]}")
        self.proc, self.base, full_env = start_server(data, demo=True, extra_env=env, up_args=("--no-worker", "--workers", str(workers)))
        [token] = _tokens(env, 1, "fanout")
        bid = httpx.post(f"{self.base}/api/v1/bids/", headers={"Authorization": f"Bearer {token}"}, timeout=30, json={
            "job_spec": {"image": "ghcr.io/acme/train:1"}, "gpus": 1, "gpu_models": ["H100-SXM-80GB"], "max_price": 10_000, "duration_s": 3600})
        if bid.status_code != 201:
            raise SystemExit(f"the standing bid was refused: {bid.text}")
        for args, name in ((["worker", "-Q", "rounds,chain,default,notify", "-c", "1"], "worker"), (["beat"], "beat")):
            with open(data / f"{name}.log", "w") as log:
                self.extra.append(subprocess.Popen([sys.executable, "-m", "gridbid.cli", *args], cwd=ROOT, env=full_env, stdout=log,
                                                   stderr=subprocess.STDOUT, start_new_session=True))

    def stop(self) -> None:
        from tests.e2e.conftest import stop_server

        for p in self.extra:
            p.terminate()
        for p in self.extra:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        stop_server(self.proc)
        if self.chain is not None:
            from ledger.chain.anvil import stop_anvil

            stop_anvil(self.chain)
        if self.database:
            import psycopg

            with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=5) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')


def busiest_book(base: str) -> str:
    import httpx

    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        rows = httpx.get(f"{base}/api/v1/markets/", timeout=30).json()
        rows = rows.get("results", rows) if isinstance(rows, dict) else rows
        if rows:  # the most bids waiting; with none yet, the most offers
            top = max(rows, key=lambda r: (r.get("open_bids") or 0, r.get("offers") or 0))
            return f"book.{top['gpu_model']}.{top['region']}"
        time.sleep(2)
    raise SystemExit("the demo market lists no market after 120 s")


def ms(x: float | None) -> str:
    return "-" if x is None else f"{1000 * x:,.0f}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100,1000,5000")
    ap.add_argument("--rounds", type=int, default=6, help="rounds measured per size")
    ap.add_argument("--round-seconds", type=float, default=5.0)
    ap.add_argument("--slow", type=int, default=5, help="consumers that never read")
    ap.add_argument("--server", default="embedded", help="embedded, production, or both comma-separated")
    ap.add_argument("--workers", type=int, default=2, help="server processes of the production server")
    ap.add_argument("--client-procs", type=int, default=1,
                    help="client processes the sockets are split between (at most one per 100 sockets)")
    ap.add_argument("--client", help=argparse.SUPPRESS)  # internal: run as the client process
    ap.add_argument("--n", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--channels", default="", help=argparse.SUPPRESS)
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if a.client:
        out = asyncio.run(client_main(a.client, a.n, a.channels.split(","), a.rounds, a.round_seconds, a.slow))
        print(json.dumps(out))
        return 0
    sizes = [int(x) for x in a.sizes.split(",")]
    if max(sizes) + a.slow + 100 > hard:
        raise SystemExit(f"{max(sizes)} sockets need more open files than this shell allows ({hard}): raise `ulimit -Hn`")
    missed = False
    print(f"{'server':>9} {'sockets':>7} {'storm s':>8} {'failed':>6} {'p50 ms':>7} {'p99 ms':>7} {'max ms':>7} "
          f"{'rounds':>6} {'lost':>5} {'worst':>5} {'closed':>12} {'slow closed':>16}  notes", flush=True)
    for kind in a.server.split(","):
        with tempfile.TemporaryDirectory(prefix="fanout-") as tmp:
            server = Server(kind, a.round_seconds, Path(tmp), a.workers)
            base = server.base
            try:
                book = busiest_book(base)
                url = base.replace("http://", "ws://") + "/ws/v1/stream"
                for n in sizes:
                    procs = max(1, min(a.client_procs, n // 100))
                    clients = [subprocess.Popen(
                        [sys.executable, __file__, "--client", url, "--n", str(n // procs + (i < n % procs)),
                         "--channels", f"rounds,{book}", "--rounds", str(a.rounds), "--round-seconds", str(a.round_seconds),
                         "--slow", str(a.slow if i == 0 else 0)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                        for i in range(procs)]
                    outs = [c.communicate(timeout=900) for c in clients]
                    if any(c.returncode for c in clients):
                        print(f"{kind:>9} {n:>7} client failed: {' '.join(e[-300:] for _, e in outs)}")
                        missed = True
                        continue
                    r = merge([json.loads(o.strip().splitlines()[-1]) for o, _ in outs])
                    notes = []
                    target = TARGETS.get(n)
                    if target is not None and (r["p99"] is None or r["p99"] > target):
                        notes.append(f"MISSED p99 {target * 1000:.0f} ms")
                    if r["lost_total"] or r["failed"]:
                        notes.append("MISSED nothing lost")
                    if a.slow and any(c != CLOSE_STOPPED for c in r["slow"]):
                        notes.append(f"MISSED slow consumers closed with {CLOSE_STOPPED}")
                    missed |= bool(notes)
                    slow = (",".join("open" if c is None else str(c) for c in r["slow"]) or "-") + f" ({r['slow_s']:.0f} s)"
                    closed = ",".join(f"{k}x{v}" for k, v in r["closed"].items()) or "-"
                    print(f"{kind:>9} {n:>7} {r['storm_s']:>8.1f} {r['failed']:>6} {ms(r['p50']):>7} {ms(r['p99']):>7} "
                          f"{ms(r['max']):>7} {r['rounds']:>6} {r['lost_total']:>5} {r['lost_worst']:>5} {closed:>12} "
                          f"{slow:>16}  {'; '.join(notes)}", flush=True)
                    if r["failures"]:
                        print(f"          failures: {r['failures']}")
            finally:
                server.stop()
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
